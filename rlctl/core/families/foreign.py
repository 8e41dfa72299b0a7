"""The config.json keys that change what a model computes, and the value of each that
changes nothing: a family refuses any of them it does not read whose value is not that
neutral one (issue #52 (4)).

Why: a family maps the keys it knows onto its Tunix model and never saw the others.
A Granite-3-like config (Llama's layers and four scalar multipliers) registered as a
family on Llama's mapping trained as a plain Llama without a word, and Qwen3 took a
YaRN rope scaling it does not apply. Each key here is one a released architecture on
these layers sets (transformers 5.12's configuration classes: granite, minicpm, olmo2,
qwen2_moe, mixtral, gemma2, phi3, cohere), with the value its own config class treats
as "off". A family that handles a key itself names it in ``Family.reads`` and checks
its values in its own mapping (Llama's rope scaling, Mistral's and Qwen2's windows,
Gemma 3's pattern and soft-capping); every other family refuses a non-neutral value
with one line naming the key. Keys no architecture here uses (ids, dtypes, versions)
are not model facts and are not looked at.

Pure Python, as the records are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlctl.core.errors import ConfigError


def _off(value: Any, c: dict[str, Any]) -> bool:
    return value is None or value is False or value == 0


def _one(value: Any, c: dict[str, Any]) -> bool:
    return value is None or float(value) == 1.0


def _no_experts(value: Any, c: dict[str, Any]) -> bool:
    return value is None or int(value) <= 1


def _silu(value: Any, c: dict[str, Any]) -> bool:
    return value is None or value == "silu"


def _rope_plain(value: Any, c: dict[str, Any]) -> bool:
    """No rope scaling: absent, empty, or ``rope_type`` default (``rope_parameters``
    of transformers 5 holds the base too, and per layer type where layers differ)."""
    if not value:
        return True
    if not isinstance(value, dict):
        return False
    kind = value.get("rope_type", value.get("type", "default"))
    return kind in (None, "default")


def _head_scale(value: Any, c: dict[str, Any]) -> bool:
    """Granite's ``attention_multiplier`` replaces 1/sqrt(head_dim): neutral only when
    it is that."""
    if value is None:
        return True
    heads = c.get("num_attention_heads") or 1
    head_dim = c.get("head_dim") or (c.get("hidden_size") or 0) // heads
    return head_dim > 0 and abs(float(value) - head_dim**-0.5) <= 1e-9


def _unwindowed(value: Any, c: dict[str, Any]) -> bool:
    """A sliding window that never binds: none, as long as the context, or switched
    off (Qwen's ``use_sliding_window: false`` with no sliding layer)."""
    if value is None:
        return True
    types = c.get("layer_types")
    sliding = isinstance(types, list) and "sliding_attention" in types
    if c.get("use_sliding_window") is False and not sliding:
        return True
    context = c.get("max_position_embeddings")
    return context is not None and int(value) >= int(context)


def _full_layers(value: Any, c: dict[str, Any]) -> bool:
    return value is None or all(t == "full_attention" for t in value)


# key -> whether a value of it (in config ``c``) leaves the model as the layers compute
NEUTRAL: dict[str, Callable[[Any, dict[str, Any]], bool]] = {
    # rope
    "rope_scaling": _rope_plain,
    "rope_parameters": _rope_plain,
    "partial_rotary_factor": _one,
    "rotary_pct": _one,
    "use_mrope": _off,
    # projections and activation
    "attention_bias": _off,
    "mlp_bias": _off,
    "qkv_bias": _off,
    "hidden_act": _silu,
    "clip_qkv": _off,
    "qk_layernorm": _off,
    "use_qk_norm": _off,
    # scalar multipliers (Granite, MiniCPM, Cohere)
    "embedding_multiplier": _one,
    "residual_multiplier": _one,
    "logits_scaling": _one,
    "attention_multiplier": _head_scale,
    "scale_emb": _one,
    "scale_depth": _one,
    "logit_scale": _one,
    # soft-capping (Gemma 2)
    "attn_logit_softcapping": _off,
    "final_logit_softcapping": _off,
    # mixture of experts (Mixtral, Qwen2-MoE, DeepSeek)
    "num_local_experts": _no_experts,
    "num_experts": _no_experts,
    "n_routed_experts": _no_experts,
    "moe_intermediate_size": _off,
    "shared_expert_intermediate_size": _off,
    # windows
    "sliding_window": _unwindowed,
    "use_sliding_window": _off,
    "layer_types": _full_layers,
}


def foreign_key(reads: frozenset[str], c: dict[str, Any]) -> str | None:
    """The first key of ``NEUTRAL`` in config ``c`` that a family reading ``reads``
    would not apply: present, not read, and not neutral. None when there is none."""
    for key, neutral in NEUTRAL.items():
        if key in reads or key not in c:
            continue
        try:
            ok = neutral(c[key], c)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            return key
    return None


def refuse_foreign(model_type: str, reads: frozenset[str], c: dict[str, Any]) -> None:
    """Raise one line naming the first key the family would not apply (``foreign_key``):
    training on would train another model than the checkpoint's."""
    key = foreign_key(reads, c)
    if key is None:
        return
    value = repr(c[key])
    if len(value) > 80:
        value = value[:77] + "..."
    raise ConfigError(
        f"{model_type} config: {key}={value}: not supported by the trainer "
        f"(rlctl's {model_type} model does not apply {key}, so it would train another model)",
        hint=f"use a checkpoint without {key}; docs/checkpoints.md#model-families "
        "lists what each family applies",
    )
