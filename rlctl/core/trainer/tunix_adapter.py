"""The only module of the package that imports Tunix: models, sampler, log-probs.

Tunix's names drift (``RLCluster``/``RLEngine``, ``loss_algo``/``algo_variant``);
keeping every Tunix call here means such a change touches one file. This module
also carries rlctl's fixes for Tunix pitfalls measured on these machines
(DESIGN.md section 4), each with a test under tests/core/trainer/. Tunix's own
GRPO loss, which rlctl's prefix-shared update is checked and benchmarked against,
is no part of training: it lives in tests/core/trainer/yardsticks.py.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlctl.core.checkpoints.sources import TRAINER_MARKER
from rlctl.core.errors import ConfigError


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


@dataclass(frozen=True)
class ModelInfo:
    family: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    params: int
    dtype: str = "float32"  # of the parameters, and so of the KV cache


# --- pitfall: tunix.models.llama3 ignores ModelConfig.rope_theta -------------------
def _llama3_block_with_rope_theta(self, x, segment_pos, cache, attn_mask):
    """Tunix 0.1.7's ``Attention.block`` with one change: ``apply_rope`` gets the
    model's ``rope_theta``. Upstream calls it without, so every model runs with
    1e6; SmolLM2 (1e5) then differs from transformers by up to 7.5 in the logits.
    """
    from tunix.models.llama3 import model as m

    seq_len = x.shape[1]
    q = m.shard(self.q_proj(x), self.shd_config.act_btnh)
    k = m.shard(self.k_proj(x), self.shd_config.act_btnh)
    v = m.shard(self.v_proj(x), self.shd_config.act_btnh)
    theta = self.config.rope_theta
    q = m.apply_rope(q, segment_pos, head_dim=self.head_dim, rope_theta=theta)
    k = m.apply_rope(k, segment_pos, head_dim=self.head_dim, rope_theta=theta)
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
    _llama3_block_with_rope_theta._rlctl_patched = True  # type: ignore[attr-defined]
    m.Attention.block = _llama3_block_with_rope_theta


# --- models ----------------------------------------------------------------------
_HASHABLE: dict[type, type] = {}


def _hashable(config: Any) -> Any:
    """``config`` as an instance of a subclass that can be hashed by value.

    Pitfall: Tunix's Qwen2/Qwen3/Gemma 3 ``ModelConfig`` are mutable dataclasses, so
    unhashable, and a model's graphdef (which holds its config) is then unhashable
    too: step.py's cache of compiled updates, keyed by graphdef, raised
    ``TypeError: unhashable type: 'ModelConfig'`` at the first step. Equal configs
    have equal reprs, so hashing the repr keeps hash and ``==`` consistent."""
    cls = type(config)
    if cls.__hash__ is not None:
        return config
    if cls not in _HASHABLE:
        _HASHABLE[cls] = type(cls.__name__, (cls,), {
            "__slots__": (), "__hash__": lambda self: hash(repr(self)),
            "__module__": cls.__module__})
    import dataclasses

    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
    return _HASHABLE[cls](**fields)


def _llama_config(c: dict[str, Any]):
    from tunix.models.llama3 import model as m

    heads = c["num_attention_heads"]
    return m.ModelConfig(
        num_layers=c["num_hidden_layers"],
        vocab_size=c["vocab_size"],
        embed_dim=c["hidden_size"],
        hidden_dim=c["intermediate_size"],
        num_heads=heads,
        head_dim=c.get("head_dim") or c["hidden_size"] // heads,
        num_kv_heads=c.get("num_key_value_heads", heads),
        rope_theta=c.get("rope_theta", 10000.0),
        norm_eps=c.get("rms_norm_eps", 1e-5),
        weight_tying=bool(c.get("tie_word_embeddings", False)),
    )


def _qwen_config(module: str):
    def build(c: dict[str, Any]):
        import importlib

        m = importlib.import_module(f"tunix.models.{module}.model")
        heads = c["num_attention_heads"]
        fields = {
            "num_layers": c["num_hidden_layers"],
            "vocab_size": c["vocab_size"],
            "embed_dim": c["hidden_size"],
            "hidden_dim": c["intermediate_size"],
            "num_heads": heads,
            "head_dim": c.get("head_dim") or c["hidden_size"] // heads,
            "num_kv_heads": c.get("num_key_value_heads", heads),
            "rope_theta": c.get("rope_theta", 1_000_000),
            "norm_eps": c.get("rms_norm_eps", 1e-6),
            "use_tied_embedding": bool(c.get("tie_word_embeddings", False)),
        }
        # pitfall: Tunix 0.1.7's Qwen3 attention calls apply_rope without the config's
        # rope_theta, so it always runs 1e6 (every released Qwen3 dense model's value);
        # another value would train a different model than transformers runs
        if module == "qwen3" and float(fields["rope_theta"]) != 1e6:
            raise ConfigError(f"Qwen3 config: rope_theta={fields['rope_theta']} is not "
                              "supported (the trainer's Qwen3 model always uses 1000000)")
        known = set(m.ModelConfig.__dataclass_fields__)
        return _hashable(m.ModelConfig(**{k: v for k, v in fields.items() if k in known}))

    return build


def _gemma3_config(c: dict[str, Any]):
    """Tunix's Gemma 3 from a ``gemma3_text`` config.json. What Tunix's model cannot
    express is refused here with the field that says so, rather than trained with
    different logits than transformers computes: logit soft-capping, a layer pattern
    other than Gemma 3's (5 sliding-window layers, then 1 global), another RMS norm
    epsilon (Tunix's is fixed) or an unusual query scaling."""
    from tunix.models.gemma3 import model as m

    def refuse(what: str) -> ConfigError:
        return ConfigError(f"Gemma 3 config: {what}: not supported by the trainer's "
                           "Gemma 3 model (Tunix)", hint="use a stock Gemma 3 text model")

    for cap in ("final_logit_softcapping", "attn_logit_softcapping"):
        if c.get(cap) is not None:
            raise refuse(f"{cap}={c[cap]}")
    heads, hidden = c["num_attention_heads"], c["hidden_size"]
    head_dim = c.get("head_dim") or hidden // heads
    layers = c["num_hidden_layers"]
    pattern = ["full_attention" if (i + 1) % len(m.GEMMA3_ATTENTION_PATTERN) == 0
               else "sliding_attention" for i in range(layers)]
    if c.get("layer_types") not in (None, pattern):
        raise refuse("layer_types other than 5 sliding-window layers then 1 global")
    if abs(float(c.get("rms_norm_eps", 1e-6)) - 1e-6) > 1e-12:
        raise refuse(f"rms_norm_eps={c['rms_norm_eps']} (Tunix uses 1e-6)")
    if c.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise refuse(f"hidden_activation={c['hidden_activation']}")
    q = m.QueryPreAttentionNormalisation
    scalar = c.get("query_pre_attn_scalar", head_dim)
    if scalar == head_dim:
        norm = q.BY_ONE_OVER_SQRT_HEAD_DIM
    elif scalar == hidden // heads:
        norm = q.BY_ONE_OVER_SQRT_EMBED_DIM_DIV_NUM_HEADS
    else:
        raise refuse(f"query_pre_attn_scalar={scalar}")
    # transformers 5 writes rope_parameters per layer type; older files rope_theta etc.
    rope = c.get("rope_parameters") or {}
    full = rope.get("full_attention", {}) if isinstance(rope, dict) else {}
    local = rope.get("sliding_attention", {}) if isinstance(rope, dict) else {}
    scaling = c.get("rope_scaling") or (full if full.get("rope_type") == "linear" else None)
    factor = 1.0
    if scaling:
        if scaling.get("rope_type", scaling.get("type")) != "linear":
            raise refuse(f"rope_scaling={scaling}")
        factor = float(scaling["factor"])
    return _hashable(m.ModelConfig(
        num_layers=layers,
        num_embed=c["vocab_size"],
        embed_dim=hidden,
        hidden_dim=c["intermediate_size"],
        num_heads=heads,
        head_dim=head_dim,
        num_kv_heads=c.get("num_key_value_heads", heads),
        sliding_window_size=c.get("sliding_window", 4096),
        local_base_frequency=int(local.get("rope_theta", c.get("rope_local_base_freq", 10_000))),
        global_base_frequency=int(full.get("rope_theta", c.get("rope_theta", 1_000_000))),
        global_scale_factor=factor,
        query_pre_attn_norm=norm,
    ))


FAMILIES = {
    # model_type in config.json -> (tunix package, config builder)
    "llama": ("llama3", _llama_config),
    "qwen2": ("qwen2", _qwen_config("qwen2")),
    "qwen3": ("qwen3", _qwen_config("qwen3")),
    "gemma3_text": ("gemma3", _gemma3_config),
}
# the Tunix module that loads safetensors, where it is not ``params``
_SAFETENSORS_LOADER = {"gemma3": "params_safetensors"}
# the Tunix model class of each package (to restore a trainer checkpoint into)
_MODEL_CLASS = {"llama3": "Llama3", "qwen2": "Qwen2", "qwen3": "Qwen3", "gemma3": "Gemma3"}


def check_family(folder: Path) -> str:
    """The folder's ``model_type``, if the trainer has a Tunix model for it."""
    from rlctl.core.trainer.models import read_model_config

    config = read_model_config(folder)
    family = config.get("model_type")
    if family not in FAMILIES:
        raise ConfigError(
            f"model type {family!r} is not supported by the local trainer",
            hint=f"use one of: {', '.join(sorted(FAMILIES))}",
        )
    try:
        FAMILIES[family][1](config)  # every field the Tunix config needs is there
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"{folder / 'config.json'}: cannot build a {family} model from it "
                          f"({type(e).__name__}: {e})", hint="copy or download the model again"
                          ) from e
    return str(family)


def load_model(folder: str | Path, dtype: str = "float32",
               mesh: Any = None) -> tuple[nnx.Module, ModelInfo]:
    """Build a Tunix model from a Hugging Face folder (config.json + safetensors), or
    from a trainer folder (``rlctl checkpoint-convert --to trainer``: config.json and
    an Orbax checkpoint of the model already in Tunix's layout, restored directly).

    With a ``mesh``, each parameter is placed sharded by the model's own sharding
    rules (FSDP over the ``fsdp`` axis) as it is loaded.
    """
    import dataclasses
    import importlib

    from rlctl.core.trainer.models import read_model_config

    folder = Path(folder)
    c = read_model_config(folder)
    family = check_family(folder)
    trainer_folder = (folder / TRAINER_MARKER).is_file()
    if not trainer_folder and not list(folder.glob("*.safetensors")):
        raise ConfigError(f"model folder {str(folder)!r} has no .safetensors files")
    package, build = FAMILIES[family]
    config = build(c)
    jdtype = jnp.bfloat16 if dtype == "bfloat16" else jnp.float32
    if hasattr(config, "param_dtype"):  # Gemma 3 defaults to bfloat16 parameters
        config = _hashable(dataclasses.replace(config, param_dtype=jdtype))
    if family == "llama":
        patch_llama3_rope_theta()
    try:
        if trainer_folder:
            model = _restore_trainer_folder(folder, package, config, jdtype, mesh)
        else:
            params_mod = importlib.import_module(
                f"tunix.models.{package}.{_SAFETENSORS_LOADER.get(package, 'params')}")
            model = params_mod.create_model_from_safe_tensors(str(folder), config, mesh=mesh,
                                                              dtype=jdtype)
    except (KeyError, ValueError) as e:  # weights that do not fit the config's shapes
        first = (str(e).splitlines() or [""])[0][:160]
        raise ConfigError(f"model folder {str(folder)!r}: its weights do not match its "
                          f"config.json ({type(e).__name__}: {first})",
                          hint="copy or download the model again") from e
    n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    info = ModelInfo(
        family=family,
        num_layers=config.num_layers,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        vocab_size=getattr(config, "vocab_size", None) or config.num_embed,
        params=n,
        dtype="bfloat16" if dtype == "bfloat16" else "float32",
    )
    return model, info


def _restore_trainer_folder(folder: Path, package: str, config: Any, jdtype: Any,
                            mesh: Any) -> nnx.Module:
    """The model, restored from a trainer folder's Orbax checkpoint: shapes come from
    the model built abstractly (no memory), each array is read straight into its
    place (sharded over ``mesh`` when given) and cast to ``jdtype``."""
    import importlib

    import orbax.checkpoint as ocp

    m = importlib.import_module(f"tunix.models.{package}.model")
    abstract = nnx.eval_shape(lambda: getattr(m, _MODEL_CLASS[package])(config,
                                                                       rngs=nnx.Rngs(0)))
    params = nnx.state(abstract, nnx.Param)
    shardings = (nnx.get_named_sharding(params, mesh) if mesh is not None else None)

    def target(x: Any, s: Any = None) -> Any:
        return jax.ShapeDtypeStruct(x.shape, jdtype, sharding=s)

    pure = nnx.to_pure_dict(params)
    if shardings is not None:
        want = jax.tree.map(target, pure, nnx.to_pure_dict(shardings))
    else:
        want = jax.tree.map(target, pure)
    want = _str_keys(want)  # Orbax names every key by its string
    restored = ocp.StandardCheckpointer().restore(
        (folder / "checkpoint" / "default").absolute(), {"model": want})["model"]
    nnx.replace_by_pure_dict(params, _like_keys(restored, pure))
    if mesh is None:
        params = jax.tree.map(lambda x: jnp.asarray(x, jdtype), params)
    graphdef, _, rest = nnx.split(abstract, nnx.Param, ...)
    rest = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), rest)
    return nnx.merge(graphdef, params, rest)


def _str_keys(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {str(k): _str_keys(v) for k, v in tree.items()}
    return tree


def _like_keys(tree: Any, like: Any) -> Any:
    """``tree`` (string keys) with the keys of ``like`` (ints where it has them)."""
    if isinstance(like, dict):
        return {k: _like_keys(tree[str(k)], v) for k, v in like.items()}
    return tree


# --- rollout ---------------------------------------------------------------------
# rlctl samples with its own prefix-shared sampler (sampler.py); Tunix's sampler is
# the yardstick bench/bench_rollout.py measures it against (tests/.../yardsticks.py).
def kv_cache(info: ModelInfo, batch: int, size: int) -> Any:
    """An empty KV cache of ``size`` slots per row in the layout Tunix's attention
    layers write (``layer_i: {k, v, end_index}``); the model's dtype, as
    ``shared_prefix_logps`` makes it."""
    from tunix.generate import sampler as sampler_lib

    return sampler_lib._init_cache(info.num_layers, size, batch, info.num_kv_heads,
                                   info.head_dim, jnp.dtype(info.dtype))


def whole_weights(state: Any, mesh: Any) -> Any:
    """Every array of ``state`` replicated on every device of ``mesh`` (one all-gather).

    The sampler decodes on such a copy across processes: left FSDP-sharded, every
    decoded token would all-gather every layer; measured on two CPU processes over
    loopback, that made the rollout 3.9x slower (bench/bench_distributed.py).
    """
    return _replicator(mesh)(state)


@functools.lru_cache(maxsize=4)
def _replicator(mesh: Any) -> Any:
    """One jitted identity per mesh: a new lambda per call would trace it anew."""
    from jax.sharding import NamedSharding, PartitionSpec

    return jax.jit(lambda t: t, out_shardings=NamedSharding(mesh, PartitionSpec()))


# --- learning --------------------------------------------------------------------
# Logits of this many bytes (float32) at most are live at once: above it, the
# vocabulary-sized log-softmax runs in chunks of tokens, each recomputed in the
# backward pass instead of kept (256 MB: the default run's 16 x 48 x 49152 logits,
# 151 MB, stay one chunk and pay no recomputation).
LOGITS_CHUNK_BYTES = 256 * 2**20


def trunk(model, tokens, positions, cache, mask) -> tuple[jax.Array, Any]:
    """The model's final-norm hidden states [B, L, D] and its new cache: everything
    but the vocabulary projection, which ``token_logps`` does in chunks.

    Qwen and Gemma 3 models sow these states when asked (Gemma scales its embeddings
    by sqrt(D) inside the call, so it must run whole); the logits they also compute are then
    unused and removed by XLA. Llama has no such switch, so its (short) forward
    loop is spelled out here.
    """
    if _runs_whole(model):
        _, new_cache = model(tokens, positions, cache, mask, output_hidden_states=True)
        sown = nnx.pop(model, nnx.Intermediate)
        return sown["all_hidden_states"].get_value()[-1], new_cache
    new_cache = None if cache is None else {}
    x = model.embedder.encode(tokens)
    for i, layer in enumerate(model.layers):
        name = f"layer_{i}"
        layer_cache, x = layer(x, positions, cache[name] if cache else None, mask)
        if cache is not None:
            new_cache[name] = layer_cache
    return model.final_norm(x), new_cache


def head_weight(model) -> jax.Array:
    """The vocabulary projection as a [D, V] matrix (the embedding when tied)."""
    if hasattr(model, "lm_head"):
        return model.lm_head.w[...]
    return model.embedder.input_embedding[...].T


def chunk_tokens(vocab_size: int, limit_bytes: int | None = None) -> int:
    """Tokens per chunk of the log-softmax: ``LOGITS_CHUNK_BYTES`` of logits (read at
    call time, so a benchmark can set it)."""
    limit = LOGITS_CHUNK_BYTES if limit_bytes is None else limit_bytes
    return max(16, limit // (4 * vocab_size))


def token_logps(hidden: jax.Array, targets: jax.Array, w: jax.Array, temperature: float,
                chunk: int) -> tuple[jax.Array, jax.Array]:
    """Log-prob of each target token and the entropy of its predicted distribution,
    from hidden states [N, L, D] and the head ``w`` [D, V], ``chunk`` tokens at a time.

    With more than one chunk, each chunk's logits are recomputed in the backward
    pass (``jax.checkpoint``), so at most one chunk of [chunk, V] logits is live:
    the whole batch's logits (128 x 256 x 49152 floats = 6.4 GB for 16 prompts x 8
    completions x 256 tokens of SmolLM2) never exist at once.
    """
    N, L, D = hidden.shape
    T = N * L

    def piece(h, t):
        logits = (h @ w).astype(jnp.float32)
        if temperature not in (0.0, 1.0):
            logits = logits / temperature
        lse = jax.nn.logsumexp(logits, axis=-1)
        logp = jnp.take_along_axis(logits, t[:, None], axis=-1)[:, 0] - lse
        probs = jnp.exp(logits - lse[:, None])
        entropy = lse - (probs * logits).sum(-1)
        return logp, jax.lax.stop_gradient(entropy)

    h, t = hidden.reshape(T, D), targets.reshape(T)
    if chunk >= T:
        logp, ent = piece(h, t)
    else:
        n = -(-T // chunk)
        h = jnp.pad(h, ((0, n * chunk - T), (0, 0))).reshape(n, chunk, D)
        t = jnp.pad(t, (0, n * chunk - T)).reshape(n, chunk)
        logp, ent = jax.lax.map(lambda ht: jax.checkpoint(piece)(*ht), (h, t))
        logp, ent = logp.reshape(-1)[:T], ent.reshape(-1)[:T]
    return logp.reshape(N, L), ent.reshape(N, L)


def shared_prefix_logps(
    model, prompt_ids, completion_ids, *, group: int, pad_id: int, temperature: float,
    info: ModelInfo, chunk: int | None = None, remat: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """Per-token log-probs of completions, computing each group's prompt once.

    The ``group`` completions of a prompt share it, so the prompt goes through
    the model once (batch P) into a KV cache that is then repeated for the P*G
    completions, which attend to it. Gradients flow through the cache, so the
    result equals Tunix's ``compute_per_token_logps`` on the concatenated
    sequences (tested) at about a third of the tokens. The vocabulary-sized
    log-softmax runs ``chunk`` tokens at a time (``token_logps``).

    Llama-family models run layer by layer, the prompt then its completions in
    each layer (``_layer_pair``); with ``remat`` each layer keeps only its inputs
    for the backward pass and recomputes the rest there (``_recomputed_pair``).
    Qwen and Gemma models run whole, prompt then completions, without remat.

    Args:
      prompt_ids: [P, Lp] left-padded prompts (one per group).
      completion_ids: [P*G, Lc] right-padded completions, grouped by prompt.

    Returns:
      (log-probs [P*G, Lc], entropy of each token's predicted distribution [P*G, Lc]).
    """
    from tunix.generate import utils as gen_utils

    P, Lp = prompt_ids.shape
    _, Lc = completion_ids.shape
    S = Lp + Lc
    pmask = prompt_ids != pad_id
    cache = kv_cache(info, P, S)  # the layout the sampler decodes with
    p_positions = gen_utils.build_positions_from_mask(pmask)
    p_mask = gen_utils.make_causal_attn_mask(pmask, S)
    pmask_b = jnp.repeat(pmask, group, axis=0)
    cmask = completion_ids != pad_id
    positions = pmask_b.sum(-1, keepdims=True) + jnp.arange(Lc)[None, :]
    causal = jnp.concatenate(
        [jnp.ones((Lc, Lp), jnp.bool_), jnp.tril(jnp.ones((Lc, Lc), jnp.bool_))], axis=-1
    )
    keys = jnp.concatenate([pmask_b, cmask], axis=-1)
    c_mask = keys[:, None, :] & causal[None]
    if _runs_whole(model):
        p_hidden, cache = trunk(model, prompt_ids, p_positions, cache, p_mask)
        cache = jax.tree.map(lambda x: jnp.repeat(x, group, axis=0), cache)
        c_hidden, _ = trunk(model, completion_ids, positions, cache, c_mask)
    else:
        pair = _recomputed_pair if remat else _layer_pair
        xs = (model.embedder.encode(prompt_ids), model.embedder.encode(completion_ids))
        for i, layer in enumerate(model.layers):
            graphdef, state = nnx.split(layer)
            masks = (p_positions, p_mask, positions, c_mask, cache[f"layer_{i}"])
            xs = pair(graphdef, group, state, xs, masks)
        p_hidden, c_hidden = model.final_norm(xs[0]), model.final_norm(xs[1])
    # token j is predicted by position j-1: the first one by the prompt's last position
    first = jnp.repeat(p_hidden[:, -1:, :], group, axis=0)
    hidden = jnp.concatenate([first, c_hidden[:, :-1, :]], axis=1)
    return token_logps(hidden, completion_ids, head_weight(model), temperature,
                       chunk or chunk_tokens(info.vocab_size))


def _runs_whole(model) -> bool:
    """Qwen2/3 and Gemma 3 (whose embedder scales by sqrt(D) inside the call) run as
    one call; Llama's layers are called one by one here."""
    return hasattr(model.config, "use_tied_embedding") or hasattr(model.config, "num_embed")


def _layer_pair(graphdef, group: int, state, xs, masks):
    """One decoder layer over the prompts [P, Lp, D], then over their P*G
    completions [P*G, Lc, D], which attend to the prompts' keys and values
    (repeated ``group`` times): the two hidden states after the layer."""
    p_positions, p_mask, positions, c_mask, empty = masks
    layer = nnx.merge(graphdef, state)
    cache, p_out = layer(xs[0], p_positions, empty, p_mask)
    cache = jax.tree.map(lambda x: jnp.repeat(x, group, axis=0), cache)
    _, c_out = layer(xs[1], positions, cache, c_mask)
    return p_out, c_out


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _recomputed_pair(graphdef, group, state, xs, masks):
    """``_layer_pair`` keeping only its inputs for the backward pass (gradient
    checkpointing, ``training.remat``).

    Pitfall: ``jax.checkpoint`` did not save memory on XLA:CPU. Its recomputations
    depend only on the layer's inputs, so XLA scheduled all 30 of SmolLM2's in the
    forward pass, and every layer's activations were live again when the backward
    pass began (measured: 1.13 GiB of temporaries against 1.18 without). Here the
    recomputation reads the incoming gradient (a zero-weighted element of it), so
    it cannot run before the backward pass reaches its layer: the default update
    then needs 0.69 GiB for its whole batch instead of 1.32 GiB in micro-batches
    of 4 (XLA's analysis, as bench/bench_update_memory.py reads it), at the same
    speed on the 2-core CPU (bench/bench_train_step.py --against no-remat: 1.02x).
    """
    return _layer_pair(graphdef, group, state, xs, masks)


def _recomputed_pair_fwd(graphdef, group, state, xs, masks):
    return _layer_pair(graphdef, group, state, xs, masks), (state, xs, masks)


def _recomputed_pair_bwd(graphdef, group, saved, grads):
    state, xs, masks = saved
    # a data dependency on the incoming gradient (an optimization_barrier is not
    # kept by XLA:CPU's scheduling): a NaN there makes the layer's gradients NaN, as
    # they would be anyway
    tie = sum(jnp.ravel(g)[0].astype(jnp.float32) for g in jax.tree.leaves(grads)) * 0.0
    xs = jax.tree.map(lambda x: x + tie.astype(x.dtype), xs)
    _, vjp = jax.vjp(lambda s, x: _layer_pair(graphdef, group, s, x, masks), state, xs)
    d_state, d_xs = vjp(grads)
    return d_state, d_xs, None


_recomputed_pair.defvjp(_recomputed_pair_fwd, _recomputed_pair_bwd)
