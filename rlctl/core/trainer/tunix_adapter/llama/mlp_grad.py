"""Llama's decoder layer for the update: Tunix's layer with the SiLU-gated MLP's
gradient spelled out and every projection a ``mixed.mm`` in the run's compute dtype.

Why the MLP's own gradient: differentiated by JAX, Tunix's MLP
(``silu(x @ Wg) * (x @ Wu) @ Wd``) left XLA:CPU (jax 0.10) a backward pass whose SiLU
derivative was fused with a transpose of its [tokens, F] result for the weight
gradient's dot, written element by element in transposed order. Here the backward
pass is the textbook one: each weight gradient is an einsum over the tokens of the
layer's own [tokens, D] and [tokens, F] arrays, which XLA runs as dots without the
transposed copy (the figures: docs/decisions/trainer.md).

Why the own attention block: its four projections are ``mixed.mm`` calls, so with a
bfloat16 compute dtype they read bfloat16 and sum in float32 (Tunix's ``Einsum``
would give two bfloat16 arrays a bfloat16 product, the slow and lossy path). Its
scores and softmax stay float32, as Tunix computes them.

The forward pass is Tunix's to the operation (``tunix/models/llama3/model.py`` 0.1.7:
``MLP.block``, ``DecoderLayer.block``, ``Attention.block`` with rlctl's rope-theta
fix from ``shim``), so in float32 the loss is unchanged; the gradients differ from
JAX's only in the order of their sums (tested against JAX's own differentiation of
Tunix's layer). Used for Llama-family models without LoRA adapters, whose
projections qwix intercepts inside the layer's call (``decode.fits``); the others
run Tunix's layer as it is.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from rlctl.core.trainer.tunix_adapter.llama.compaction import Packing, packed
from rlctl.core.trainer.tunix_adapter.mixed import F32, dot_nt, dtype_of, mm, narrow
from rlctl.core.trainer.tunix_adapter.rope import apply_rope

# the named scope of the own gradient's operations in a lowered program
SCOPE = "own_mlp_gradient"


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def gated_mlp(dtype: str, wg: jax.Array, wu: jax.Array, wd: jax.Array, x: jax.Array) -> jax.Array:
    """``(silu(x @ wg) * (x @ wu)) @ wd``, as Tunix's ``MLP.block`` computes it, each
    product's inputs read as ``dtype`` (``mixed``), its sums float32."""
    return _forward(dtype, wg, wu, wd, x)[0]


def _forward(dtype, wg, wu, wd, x):
    dt = dtype_of(dtype)
    xc, wgc, wuc, wdc = (a.astype(dt) for a in (x, wg, wu, wd))
    g = jnp.matmul(xc, wgc, preferred_element_type=F32)
    u = jnp.matmul(xc, wuc, preferred_element_type=F32)
    y = jnp.matmul((jax.nn.silu(g) * u).astype(dt), wdc, preferred_element_type=F32)
    return y.astype(x.dtype), (wg, wu, wd, x, g, u)


def _backward(dtype, saved, dy):
    with jax.named_scope(SCOPE):
        return _gradients(dtype, saved, dy)


def _gradients(dtype, saved, dy):
    wg, wu, wd, x, g, u = saved
    f = dy.dtype
    s = jax.nn.sigmoid(g)
    a = g * s  # silu(g)
    d_wd = jnp.einsum("...f,...d->fd", a * u, dy)
    dh = dot_nt(dy, wd, dtype)
    du = dh * a
    dg = dh * u * (s * (1 + g * (1 - s)))  # silu'(g) = s (1 + g (1 - s))
    xf = x.astype(f)
    # the weights' gradients float32 (mixed._mm_backward says why), the input's narrow
    d_wg = jnp.einsum("...d,...f->df", xf, dg)
    d_wu = jnp.einsum("...d,...f->df", xf, du)
    dx = dot_nt(dg, wg, dtype) + dot_nt(du, wu, dtype)
    return (d_wg.astype(wg.dtype), d_wu.astype(wu.dtype), d_wd.astype(wd.dtype), dx.astype(x.dtype))


gated_mlp.defvjp(_forward, _backward)


def attention(
    attn: Any, x: jax.Array, positions: jax.Array, cache: Any, mask: jax.Array, dtype: str
) -> tuple[Any, jax.Array]:
    """Tunix's ``Attention.block`` (with the model's rope theta, as ``shim`` patches
    it), its projections through ``mixed.mm`` in ``dtype``: (new cache, output)."""
    from tunix.models.llama3 import model as m

    B, T, D = x.shape

    def project(p: Any) -> jax.Array:  # 'BTD,DNH->BTNH'
        if not narrow(dtype):  # Tunix's own einsum: float32 runs as it ran before
            return m.shard(p(x), attn.shd_config.act_btnh)
        w = p.w[...]
        y = mm(x, w.reshape(D, -1), dtype).reshape(B, T, *w.shape[1:]).astype(x.dtype)
        return m.shard(y, attn.shd_config.act_btnh)

    q, k, v = project(attn.q_proj), project(attn.k_proj), project(attn.v_proj)
    h = attn.head_dim
    q = apply_rope(q, positions, h, attn.config)
    k = apply_rope(k, positions, h, attn.config)
    if cache is not None:
        idx = (0, cache["end_index"][0] % cache["v"].shape[1], 0, 0)
        v = jax.lax.dynamic_update_slice(cache["v"], v, idx)
        k = jax.lax.dynamic_update_slice(cache["k"], k, idx)
    _, S, K, _ = k.shape
    N = q.shape[2]
    scores = jnp.einsum("BTHGD,BSHD->BHGTS", q.reshape(B, T, K, N // K, h), k) * attn.scale
    scores = jnp.where(jnp.expand_dims(mask, -3), scores.reshape(B, N, T, S), m.K_MASK)
    probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(k.dtype)
    out = jnp.einsum("BHGTS,BSHD->BTHGD", probs.reshape(B, K, N // K, T, S), v)
    out = out.reshape(B, T, N, h)
    if narrow(dtype):
        o = attn.o_proj.w[...]  # 'BTNH,NHD->BTD'
        out = mm(out.reshape(B, T, N * h), o.reshape(N * h, D), dtype).astype(x.dtype)
    else:
        out = attn.o_proj(out)
    out = m.shard(out, attn.shd_config.act_btd)
    new_cache = None
    if cache is not None:
        new_cache = {"v": v, "k": k, "end_index": cache["end_index"] + T}
    return new_cache, out


def jax_gradient_mlp(
    dtype: str, wg: jax.Array, wu: jax.Array, wd: jax.Array, x: jax.Array
) -> jax.Array:
    """``gated_mlp``'s forward, differentiated by JAX itself: an accelerator's
    (``numerics.Numerics.own_mlp_gradient`` off), whose compiler fuses that gradient
    well; the products still read ``dtype`` and sum in float32."""
    return _forward(dtype, wg, wu, wd, x)[0]


def decoder_layer(
    layer: Any,
    x: jax.Array,
    positions: jax.Array,
    cache: Any,
    mask: jax.Array,
    packing: Packing | None = None,
    dtype: str = "float32",
    own_gradient: bool = True,
) -> tuple[Any, jax.Array]:
    """Tunix's ``DecoderLayer.block`` with the attention through ``attention`` and the
    MLP through ``gated_mlp``, both in ``dtype``: (new cache, the layer's output).
    With a ``packing`` of x's [B, L] positions, the MLP (norm included) runs on the
    kept positions only (``compaction.packed``). ``own_gradient`` False: the MLP's
    gradient is JAX's (``jax_gradient_mlp``), the forward the same."""
    cache, h = attention(layer.attn, layer.input_layernorm(x), positions, cache, mask, dtype)
    h = h + x
    mlp = layer.mlp
    mlp_fn = gated_mlp if own_gradient else jax_gradient_mlp

    def feed_forward(h):
        return mlp_fn(
            dtype,
            mlp.gate_proj.kernel[...],
            mlp.up_proj.kernel[...],
            mlp.down_proj.kernel[...],
            layer.post_attention_layernorm(h),
        )

    with jax.named_scope("feed_forward"):
        if packing is None:
            out = feed_forward(h)
        else:
            B, L, D = h.shape
            out = packed(feed_forward, h.reshape(B * L, D), packing).reshape(B, L, D)
    return cache, h + out
