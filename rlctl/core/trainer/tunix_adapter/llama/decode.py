"""One decode step of a Llama-family model with its weights laid out for a few rows.

Why: decoding 16 rows, every projection is a [16, D] x [D, F] product, and XLA:CPU
(jax 0.10, YNNPACK or Eigen) runs that shape at a fraction of the rate the same
weights stream at as a matrix-vector product. So the weights come first, [F, D] x
[D, 16], with the activations kept as columns [D, B] through the layer.
Tunix's layers also keep the KV cache as [B, S, K, H] and transpose all of it for
each attention (two copies of the cache per layer per token); here it is
[B, K, S, H], and one query per row attends by products and sums, not batched dots.

Laying the weights out is a copy per call, paid back after a few tokens (the rollout's
and the eval's figures, and the layout's cost: docs/decisions/trainer.md).

The prompt's slots are kept once per prompt, not once per row: the G rows of a group
share them, so their G queries attend to one copy ([P, K, Lp, H], a product with the
group's queries together), and each row keeps only its own completion's slots: less
cache read per token (docs/decisions/trainer.md).

Tried and left: YNNPACK off for this program (3x slower: the vocabulary-wide
softmax and the reductions lose their threads); forcing every projection onto
XLA's own dot with an optimization barrier (YNNPACK then took them anyway, slower).

The numerics are Tunix's Llama (``tunix/models/llama3/model.py`` 0.1.7: RMSNorm,
``apply_rope`` with the model's ``rope_theta`` as rlctl's shim passes it, grouped
query heads kv-head-major, ``K_MASK``, float32 softmax, SiLU-gated MLP); only the
order of each dot product's sums differs (tested: the same tokens and log-probs
within 1e-4 as the layer-by-layer Tunix decode).

Used for the families that declare it (``Capabilities.weights_first_decode``: Tunix's
Llama model) without LoRA adapters (``fits``); the others decode
through Tunix's own layers. Prefill stays with Tunix's layers too (it has many rows).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rlctl.core.trainer.tunix_adapter.mixed import dot, dtype_of, narrow, settle
from rlctl.core.trainer.tunix_adapter.rope import apply_rope

# the named scope of a weights-first decode step's operations in a lowered program
SCOPE = "weights_first_decode"


def plain(model: Any) -> bool:
    """Whether ``model`` has no LoRA adapters: they add to each projection's output,
    which rlctl's own layers (these fused weights, ``mlp_grad``, ``layers``) skip."""
    return not jax.tree.leaves(nnx.state(model, nnx.LoRAParam))


def fits(model: Any, info: Any) -> bool:
    """Whether ``model`` can decode here: its family declares the weights-first decode
    (``rlctl.core.families``: Llama's architecture) and it has no LoRA adapters."""
    return info.capabilities.weights_first_decode and plain(model)


def weights(model: Any, dtype: str = "float32") -> dict[str, Any]:
    """The model's weights for ``step``, traced inside the sampler's jit so the copy
    lives only while it decodes: per layer the query/key/value projections fused
    and transposed to [(N+2K)H, D], the output projection as [D, NH], gate and up
    fused as [2F, D], down as [D, F]; the vocabulary projection as [V, D] (the
    embedding itself when tied and float32: no copy). The projections are stored in
    the compute ``dtype`` (``mixed``): in bfloat16 a decode step reads half the
    bytes; the norms and the embedding's lookup stay as they are."""
    dt = dtype_of(dtype)
    # narrow, the output projection is taken rows first (``_out_projection``)
    o_rows = narrow(dtype)

    layers = []
    for layer in model.layers:
        a, mlp = layer.attn, layer.mlp
        d = a.q_proj.w.shape[0]
        # transposed, then joined along the rows (the faster way round, the copy's cost
        # being the transpose: docs/decisions/trainer.md)
        qkv = [p.w[...].reshape(d, -1).T for p in (a.q_proj, a.k_proj, a.v_proj)]
        layers.append(
            {
                "ln1": layer.input_layernorm.w[...],
                "qkv": jnp.concatenate(qkv, axis=0).astype(dt),
                "o": (
                    a.o_proj.w[...].reshape(-1, d) if o_rows else a.o_proj.w[...].reshape(-1, d).T
                ).astype(dt),
                "ln2": layer.post_attention_layernorm.w[...],
                "gu": jnp.concatenate(
                    [mlp.gate_proj.kernel[...].T, mlp.up_proj.kernel[...].T], 0
                ).astype(dt),
                "down": mlp.down_proj.kernel[...].T.astype(dt),
            }
        )
    emb = model.embedder.input_embedding[...]
    head = (model.lm_head.w[...].T if hasattr(model, "lm_head") else emb).astype(dt)
    return {"layers": layers, "norm": model.final_norm.w[...], "emb": emb, "head": head}


def prefix_layout(
    cache: dict[str, Any], layers: int, slots: int
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The first ``slots`` slots of Tunix's prefill cache (``layer_i: {k, v}`` as
    [P, S, K, H]), one per prompt, as ``step`` reads them: the keys and values of
    each layer as [P, K, slots, H] (transposed once, after prefill). A stacked cache
    (``kv_cache(stacked=True)``, from scanned layers) is read layer by layer."""

    def layer(i: int) -> Any:
        return jax.tree.map(lambda x: x[i], cache) if "k" in cache else cache[f"layer_{i}"]

    ks = tuple(jnp.swapaxes(layer(i)["k"][:, :slots], 1, 2) for i in range(layers))
    vs = tuple(jnp.swapaxes(layer(i)["v"][:, :slots], 1, 2) for i in range(layers))
    return ks, vs


def row_cache(
    prefix_keys: tuple[Any, ...], rows: int, slots: int
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """Each row's own slots, empty: per layer keys and values [rows, K, slots, H]."""
    _, K, _, H = prefix_keys[0].shape
    empty = tuple(jnp.zeros((rows, K, slots, H), x.dtype) for x in prefix_keys)
    return empty, empty


def _by_group(x: jax.Array, prompts: int) -> jax.Array:
    """[B, K, g, ...] rows grouped by prompt as [P, K, G * g, ...]: a group's queries
    side by side for its prompt's keys."""
    b, k, g, *rest = x.shape
    G = b // prompts
    x = x.reshape(prompts, G, k, g, *rest).swapaxes(1, 2)
    return x.reshape(prompts, k, G * g, *rest)


def _by_row(x: jax.Array, rows: int) -> jax.Array:
    """``_by_group``'s inverse: [P, K, G * g, ...] as [B, K, g, ...]."""
    P, k, Gg, *rest = x.shape
    G = rows // P
    x = x.reshape(P, k, G, Gg // G, *rest).swapaxes(1, 2)
    return x.reshape(rows, k, Gg // G, *rest)


def _norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    """Tunix's RMSNorm over the columns' feature axis (axis 0 of [D, B])."""
    rms = jnp.sqrt(jnp.mean(x.astype(jnp.float32) ** 2, axis=0, keepdims=True) + eps)
    return (w[:, None] * x / rms).astype(x.dtype)


def step(
    w: dict[str, Any],
    config: Any,
    tokens: jax.Array,
    positions: jax.Array,
    prefix: tuple[tuple[Any, ...], tuple[Any, ...]],
    keys: tuple[Any, ...],
    values: tuple[Any, ...],
    slot: jax.Array,
    prefix_mask: jax.Array,
    mask: jax.Array,
    dtype: str = "float32",
) -> tuple[jax.Array, tuple[Any, ...], tuple[Any, ...]]:
    """``_step`` under its named scope (``SCOPE``)."""
    with jax.named_scope(SCOPE):
        return _step(
            w, config, tokens, positions, prefix, keys, values, slot, prefix_mask, mask, dtype
        )


def _step(
    w: dict[str, Any],
    config: Any,
    tokens: jax.Array,
    positions: jax.Array,
    prefix: tuple[tuple[Any, ...], tuple[Any, ...]],
    keys: tuple[Any, ...],
    values: tuple[Any, ...],
    slot: jax.Array,
    prefix_mask: jax.Array,
    mask: jax.Array,
    dtype: str = "float32",
) -> tuple[jax.Array, tuple[Any, ...], tuple[Any, ...]]:
    """Float32 logits [B, V] of the next token after ``tokens`` [B] at ``positions``
    [B]. ``prefix`` holds each layer's prompt keys and values [P, K, Lp, H], shared
    by the B / P rows of each prompt (rows grouped by prompt, as ``jnp.repeat``
    lays them out); ``keys`` and ``values`` each row's own slots [B, K, N, H], of
    which ``slot`` gets this token's. ``prefix_mask`` [B, Lp] and ``mask`` [B, N]
    say which slots each row attends to (``slot`` included). The projections read
    ``dtype`` (``weights``' and the activations') and sum in float32."""
    from tunix.models.llama3 import model as m

    n, k, h = config.num_heads, config.num_kv_heads, config.head_dim
    b, g = tokens.shape[0], n // k
    P, Lp = prefix[0][0].shape[0], prefix[0][0].shape[2]
    allowed = jnp.concatenate([prefix_mask, mask], axis=-1)[:, None, None, :]
    x = w["emb"][tokens].T  # [D, B]: the activations are columns throughout
    new_k, new_v = [], []
    for lw, pk, pv, kc, vc in zip(w["layers"], *prefix, keys, values, strict=True):
        y = _norm(x, lw["ln1"], config.norm_eps)
        qkv = settle(dot(lw["qkv"], y, dtype), dtype).astype(x.dtype).T  # [B, (N+2K)H]
        q = qkv[:, : n * h].reshape(b, 1, n, h)
        kk = qkv[:, n * h : (n + k) * h].reshape(b, 1, k, h)
        vv = qkv[:, (n + k) * h :].reshape(b, 1, k, h)
        q = apply_rope(q, positions[:, None], h, config)
        kk = apply_rope(kk, positions[:, None], h, config)
        kc = jax.lax.dynamic_update_slice(kc, jnp.swapaxes(kk, 1, 2), (0, 0, slot, 0))
        vc = jax.lax.dynamic_update_slice(vc, jnp.swapaxes(vv, 1, 2), (0, 0, slot, 0))
        new_k.append(kc)
        new_v.append(vc)
        q = q.reshape(b, k, g, h)
        # the prompt's slots: a group's queries together against its one copy
        prompt = _by_row(jnp.einsum("pkqh,pksh->pkqs", _by_group(q, P), pk), b)
        # a row's own slots, one query per row: products and sums (XLA fuses them)
        # rather than batched dots
        own = (q[:, :, :, None, :] * kc[:, :, None]).sum(-1)
        scores = jnp.concatenate([prompt, own], axis=-1) * h**-0.5
        scores = jnp.where(allowed, scores, m.K_MASK)
        probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(kc.dtype)
        out = (
            _by_row(jnp.einsum("pkqs,pksh->pkqh", _by_group(probs[..., :Lp], P), pv), b)
            + (probs[..., Lp:, None] * vc[:, :, None]).sum(-2)
        ).reshape(b, n * h)
        x = x + _out_projection(lw["o"], out, dtype).astype(x.dtype)
        y = _norm(x, lw["ln2"], config.norm_eps)
        gu = dot(lw["gu"], y, dtype).astype(x.dtype)  # [2F, B]
        f = gu.shape[0] // 2
        x = x + dot(lw["down"], nnx.silu(gu[:f]) * gu[f:], dtype).astype(x.dtype)
    y = _norm(x, w["norm"], config.norm_eps)
    logits = settle(dot(w["head"], y, dtype), dtype).T
    return logits, tuple(new_k), tuple(new_v)


def _out_projection(w: jax.Array, out: jax.Array, dtype: str) -> jax.Array:
    """The output projection of the attention's rows ``out`` [B, NH] as columns [D, B].

    float32: ``w`` [D, NH] times the transposed rows, weights first. Narrow: the rows
    times ``w`` [NH, D], then transposed. Pitfall: XLA:CPU folds a transposed operand
    into the dot, and a bfloat16 dot with a transposed operand is not one YNNPACK
    takes: it is silently run in float32 instead (measured: 0.133 ms float32, 0.152 ms
    "bfloat16" weights first, 0.102 ms rows first in bfloat16, SmolLM2's 576 x 576 for
    16 rows)."""
    if not narrow(dtype):
        return w @ out.T
    return settle(dot(out, w, dtype), dtype).T
