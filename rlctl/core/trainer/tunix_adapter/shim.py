"""How Tunix is imported, and rlctl's patches of Tunix pitfalls, each
shown to matter by tests/core/trainer/test_pitfalls.py."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import jax
import jax.numpy as jnp


def _tunix_without_its_init() -> None:
    """Register the ``tunix`` package without running its ``__init__``.

    Pitfall: ``import tunix.models.llama3.model`` first runs ``tunix/__init__.py``,
    which imports every learner Tunix has (distillation, SFT, DPO, agentic RL) and
    through them tensorboardX, pandas, and torch when it is installed: measured, 3.5 s
    and 320 MB of resident memory that rlctl never uses (a twelfth of the default
    run's peak). Only the submodules rlctl imports (``models``, ``generate``) load.
    A process that imported ``tunix`` itself first keeps the whole package.
    """
    if "tunix" in sys.modules:
        return
    spec = importlib.util.find_spec("tunix")
    if spec is not None:  # None: the first tunix import below gives the usual error
        sys.modules["tunix"] = importlib.util.module_from_spec(spec)


_tunix_without_its_init()


# --- pitfall: tunix.models.llama3 ignores ModelConfig.rope_theta -------------------
def _llama3_block_with_rope_theta(self, x, segment_pos, cache, attn_mask):
    """Tunix 0.1.7's ``Attention.block`` with one change: ``apply_rope`` gets the
    model's ``rope_theta``. Upstream calls it without, so every model runs with
    1e6; SmolLM2 (1e5) then differs from transformers by up to 7.5 in the logits.
    With the config's Llama 3 rope scaling, where it has one (``rope``).
    """
    from tunix.models.llama3 import model as m

    from rlctl.core.trainer.tunix_adapter.rope import apply_rope

    seq_len = x.shape[1]
    q = m.shard(self.q_proj(x), self.shd_config.act_btnh)
    k = m.shard(self.k_proj(x), self.shd_config.act_btnh)
    v = m.shard(self.v_proj(x), self.shd_config.act_btnh)
    q = apply_rope(q, segment_pos, self.head_dim, self.config)
    k = apply_rope(k, segment_pos, self.head_dim, self.config)
    if cache is not None:
        end_index = cache["end_index"][0]
        idx = (0, end_index % cache["v"].shape[1], 0, 0)
        v = jax.lax.dynamic_update_slice(cache["v"], v, idx)
        k = jax.lax.dynamic_update_slice(cache["k"], k, idx)
    b, t, qh, d = q.shape
    _, s, kh, _ = k.shape
    q = q.reshape((b, t, kh, qh // kh, d))
    attn = jnp.einsum("BTHGD,BSHD->BHGTS", q, k) * self.scale
    attn = attn.reshape((b, qh, t, s))
    if attn_mask is not None:
        attn = jnp.where(jnp.expand_dims(attn_mask, -3), attn, m.K_MASK)
    attn = jax.nn.softmax(attn.astype(jnp.float32), axis=-1).astype(k.dtype)
    attn = attn.reshape((b, kh, qh // kh, t, s))
    qkv = jnp.einsum("BHGTS,BSHD->BTHGD", attn, v).reshape((b, t, qh, d))
    out = m.shard(self.o_proj(qkv), self.shd_config.act_btd)
    new_cache = None
    if cache is not None:
        new_cache = {"v": v, "k": k, "end_index": cache["end_index"] + seq_len}
    return new_cache, out


UPSTREAM_LLAMA3_BLOCK: Any = None  # kept so tests can show what the patch fixes


def patch_llama3_rope_theta() -> None:
    global UPSTREAM_LLAMA3_BLOCK
    from tunix.models.llama3 import model as m

    if getattr(m.Attention.block, "_rlctl_patched", False):
        return
    UPSTREAM_LLAMA3_BLOCK = m.Attention.block
    _llama3_block_with_rope_theta._rlctl_patched = True  # type: ignore[attr-defined]  # a mark on a function
    m.Attention.block = _llama3_block_with_rope_theta
