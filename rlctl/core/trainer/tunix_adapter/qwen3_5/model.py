"""Qwen3.5's text model (transformers' ``qwen3_5``, ``Qwen3_5ForCausalLM``) in Flax NNX, in
the style of Tunix's Qwen3: the same ``Einsum``/``Embedder`` modules, the same layer call
``layer(x, positions, cache, attention_mask) -> (cache, x)``, the same model call and KV
cache (``{k, v, end_index}``) for its attention layers, so Tunix's and rlctl's samplers and
log-prob code can drive it as they drive Qwen3.

Why its own: Tunix 0.1.7 has no Qwen3.5. Its layers are of two kinds (``layer_types``):
  * ``full_attention``: Qwen3's attention with an output gate (q_proj gives each head a
    query and a gate; the output is ``* sigmoid(gate)``) and rope on the first
    ``rotary_dim`` dims of a head only;
  * ``linear_attention``: a gated DeltaNet (``deltanet.py``), whose cache is a conv
    context and a recurrent state instead of keys and values.
And its RMSNorms scale by ``1 + w`` (zero-centred weights), but the DeltaNet's gated
norm by ``w``. Weights are kept as transformers stores them (the model adds the 1) so a
checkpoint round-trips bit for bit.

Text only: transformers' multimodal rope (``mrope_section``) gives every section the
same position ids for text, so it is ordinary 1-D rope over the rotary dims (tested
against transformers).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlctl.core.trainer.tunix_adapter.qwen3_5 import deltanet

K_MASK = -2.3819763e38  # Tunix's Qwen3's masked score

LayerCache = dict[str, jax.Array]
Cache = dict[str, LayerCache]

LINEAR = "linear_attention"
FULL = "full_attention"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Qwen3.5's text model's shape. Frozen (hashable): jit may take it as static.
    Built from config.json by the family's mapping (``rlctl.core.families.qwen3_5``)."""

    num_layers: int
    vocab_size: int
    embed_dim: int
    hidden_dim: int  # the MLP's
    num_heads: int
    head_dim: int
    num_kv_heads: int
    rope_theta: float
    rotary_dim: int  # the leading dims of a head that rotate
    norm_eps: float
    layer_types: tuple[str, ...]
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    conv_kernel: int
    use_tied_embedding: bool = False
    chunk_size: int = 64  # the chunked delta rule's
    param_dtype: Any = jnp.float32
    dtype: Any = jnp.float32

    def __post_init__(self) -> None:
        if len(self.layer_types) != self.num_layers:
            raise ValueError(f"{len(self.layer_types)} layer_types for {self.num_layers} layers")
        unknown = set(self.layer_types) - {LINEAR, FULL}
        if unknown:
            raise ValueError(f"unknown layer types {sorted(unknown)}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError("linear_num_value_heads must be a multiple of linear_num_key_heads")

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        """The conv's channels: q, k and v of the linear-attention layers."""
        return 2 * self.linear_key_dim + self.linear_value_dim


def _kw(config: ModelConfig, rngs: nnx.Rngs) -> dict[str, Any]:
    """The keyword arguments every module here takes."""
    return {"rngs": rngs, "dtype": config.dtype, "param_dtype": config.param_dtype}


class Einsum(nnx.Module):
    """A parameterised tensor product (Tunix's ``Einsum``, without its sharding)."""

    def __init__(
        self,
        einsum_str: str,
        shape: flax.typing.Shape,
        *,
        rngs: nnx.Rngs,
        dtype: Any,
        param_dtype: Any,
    ):
        self.einsum_str = einsum_str
        self.shape = shape
        self.dtype = dtype
        self.w = nnx.Param(
            nnx.initializers.glorot_uniform()(rngs.params(), shape, dtype=param_dtype)
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        x = jnp.astype(x, self.dtype)
        w = jnp.astype(self.w[...], self.dtype)
        return jnp.einsum(self.einsum_str, x, w)


class Embedder(nnx.Module):
    """The token embedding; ``decode`` is the tied head, ``x @ E^T``."""

    def __init__(
        self, vocab_size: int, embed_dim: int, *, rngs: nnx.Rngs, dtype: Any, param_dtype: Any
    ):
        self.input_embedding = nnx.Param(
            nnx.initializers.normal(dtype=param_dtype)(rngs.params(), (vocab_size, embed_dim))
        )
        self.dtype = dtype

    def encode(self, x: jax.Array) -> jax.Array:
        return jnp.astype(self.input_embedding[...][(x,)], self.dtype)

    def decode(self, x: jax.Array) -> jax.Array:
        x = jnp.astype(x, self.dtype)
        return jnp.dot(x, jnp.astype(self.input_embedding[...], self.dtype).T)


class RMSNorm(nnx.Module):
    """Qwen3.5's RMSNorm: ``norm(x) * (1 + w)`` in float32, then the compute dtype.

    ``w`` is transformers' raw (zero-centred) weight, so it starts at zeros."""

    def __init__(self, dim: int, *, norm_eps: float, rngs: nnx.Rngs, dtype: Any, param_dtype: Any):
        self.w = nnx.Param(nnx.initializers.zeros_init()(rngs.params(), (dim,), param_dtype))
        self.norm_eps = norm_eps
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        x = jnp.astype(x, jnp.float32)
        x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.norm_eps)
        return jnp.astype(x * (1.0 + jnp.astype(self.w[...], jnp.float32)), self.dtype)


class GatedRMSNorm(nnx.Module):
    """The DeltaNet's output norm (transformers' ``Qwen3_5RMSNormGated``): ``w * norm(x)``
    (plain ``w``, initialised to ones) times ``silu(gate)``.

    Its dtypes as transformers': the normalised x is cast to the compute dtype before the
    weight multiplies it; the gate's SiLU and that product are float32; the result is cast
    back."""

    def __init__(self, dim: int, *, norm_eps: float, rngs: nnx.Rngs, dtype: Any, param_dtype: Any):
        self.w = nnx.Param(nnx.initializers.ones_init()(rngs.params(), (dim,), param_dtype))
        self.norm_eps = norm_eps
        self.dtype = dtype

    def __call__(self, x: jax.Array, gate: jax.Array) -> jax.Array:
        x = jnp.astype(x, jnp.float32)
        x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.norm_eps)
        x = jnp.astype(self.w[...], self.dtype) * jnp.astype(x, self.dtype)
        x = jnp.astype(x, jnp.float32) * jax.nn.silu(jnp.astype(gate, jnp.float32))
        return jnp.astype(x, self.dtype)


def inverse_frequencies(rotary_dim: int, theta: float) -> np.ndarray:
    """The rotary pairs' frequencies, float32, as transformers computes them
    (``1 / theta ** (2i / rotary_dim)``, a float32 power: torch's and numpy's round an
    ulp apart in a few of them, tested)."""
    exponents = np.arange(0, rotary_dim, 2, dtype=np.int64).astype(np.float32) / rotary_dim
    return (1.0 / (np.float32(theta) ** exponents)).astype(np.float32)


def apply_partial_rope(
    x: jax.Array, positions: jax.Array, rotary_dim: int, theta: float
) -> jax.Array:
    """Rope (rotate-half pairs) on a head's first ``rotary_dim`` dims; the rest pass.

    ``x`` [B, T, N, H], ``positions`` [B, T]. The angles in float32 (``position *
    inv_freq``, transformers' product), cos and sin cast to x's dtype as it casts them."""
    if rotary_dim == 0:
        return x
    inv = jnp.asarray(inverse_frequencies(rotary_dim, theta))
    angles = positions.astype(jnp.float32)[..., None] * inv  # [B, T, rotary_dim / 2]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
    cos = jnp.cos(angles).astype(x.dtype)
    sin = jnp.sin(angles).astype(x.dtype)
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated = jnp.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
    return jnp.concatenate([rot * cos + rotated * sin, rest], axis=-1)


class Attention(nnx.Module):
    """Gated attention: Tunix's Qwen3 attention (GQA, per-head q/k norms, the same cache
    writes and mask reads) with a sigmoid gate on its output and partial rope."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        d, h, kv, hd = config.embed_dim, config.num_heads, config.num_kv_heads, config.head_dim
        kw = _kw(config, rngs)
        # per head: the query's head_dim values, then the gate's
        self.q_proj = Einsum("BTD,DNH->BTNH", (d, h, 2 * hd), **kw)
        self.k_proj = Einsum("BSD,DKH->BSKH", (d, kv, hd), **kw)
        self.v_proj = Einsum("BSD,DKH->BSKH", (d, kv, hd), **kw)
        self.o_proj = Einsum("BTNH,NHD->BTD", (h, hd, d), **kw)
        self.q_norm = RMSNorm(hd, norm_eps=config.norm_eps, **kw)
        self.k_norm = RMSNorm(hd, norm_eps=config.norm_eps, **kw)

    def __call__(
        self,
        x: jax.Array,
        positions: jax.Array,
        cache: LayerCache | None,
        attn_mask: jax.Array | None,
    ) -> tuple[LayerCache | None, jax.Array]:
        config = self.config
        hd = config.head_dim
        seq_len = x.shape[1]
        qg = self.q_proj(x)
        query, gate = qg[..., :hd], qg[..., hd:]
        query = self.q_norm(query)
        key = self.k_norm(self.k_proj(x))
        value = self.v_proj(x)
        query = apply_partial_rope(query, positions, config.rotary_dim, config.rope_theta)
        key = apply_partial_rope(key, positions, config.rotary_dim, config.rope_theta)

        if cache is not None:
            end_index = cache["end_index"][0]
            slice_indices = (0, end_index % cache["v"].shape[1], 0, 0)
            value = jax.lax.dynamic_update_slice(
                cache["v"], value.astype(cache["v"].dtype), slice_indices
            )
            key = jax.lax.dynamic_update_slice(
                cache["k"], key.astype(cache["k"].dtype), slice_indices
            )

        b, t, qh, d = query.shape
        kh = key.shape[2]
        query = query.reshape((b, t, kh, qh // kh, d))
        attn = jnp.einsum("BTHGD,BSHD->BHGTS", query, key.astype(query.dtype)) * hd**-0.5
        if attn_mask is not None:
            attn = jnp.where(attn_mask[:, None, None, :, :], attn, K_MASK)
        attn = jax.nn.softmax(attn.astype(jnp.float32), axis=-1).astype(query.dtype)
        out = jnp.einsum("BHGTS,BSHD->BTHGD", attn, value.astype(query.dtype))
        out = out.reshape((b, t, qh, d))
        out = out * jax.nn.sigmoid(gate)
        out = self.o_proj(out)

        new_cache = None
        if cache is not None:
            new_cache = {"v": value, "k": key, "end_index": cache["end_index"] + seq_len}
        return new_cache, out


class Conv1d(nnx.Module):
    """The DeltaNet's depthwise causal conv weight, ``w`` [kernel, channels]."""

    def __init__(self, kernel: int, channels: int, *, rngs: nnx.Rngs, param_dtype: Any):
        bound = kernel**-0.5  # torch's Conv1d default (fan_in = kernel for a depthwise conv)
        self.w = nnx.Param(
            jax.random.uniform(rngs.params(), (kernel, channels), param_dtype, -bound, bound)
        )


class GatedDeltaNet(nnx.Module):
    """The linear-attention layer (transformers' ``Qwen3_5GatedDeltaNet``).

    Its cache: ``conv`` [B, K-1, conv_dim] (the last K-1 inputs of the conv), ``state``
    [B, Hv, dk, dv] float32 (the delta rule's), ``end_index`` (tokens seen, as the
    attention layers count them). A call with a cache continues from it; one token with
    a cache takes the recurrent form, anything else the chunked one.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        d, hv = config.embed_dim, config.linear_num_value_heads
        kw = _kw(config, rngs)
        self.in_proj_qkv = Einsum("BTD,DF->BTF", (d, config.conv_dim), **kw)
        self.in_proj_z = Einsum("BTD,DF->BTF", (d, config.linear_value_dim), **kw)
        self.in_proj_b = Einsum("BTD,DF->BTF", (d, hv), **kw)
        self.in_proj_a = Einsum("BTD,DF->BTF", (d, hv), **kw)
        self.out_proj = Einsum("BTF,FD->BTD", (config.linear_value_dim, d), **kw)
        self.conv1d = Conv1d(
            config.conv_kernel, config.conv_dim, rngs=rngs, param_dtype=config.param_dtype
        )
        self.dt_bias = nnx.Param(jnp.ones((hv,), config.param_dtype))
        # transformers' init: A ~ U(0, 16); kept as its log
        a = jax.random.uniform(rngs.params(), (hv,), jnp.float32, 1e-4, 16.0)
        self.A_log = nnx.Param(jnp.log(a).astype(config.param_dtype))
        self.norm = GatedRMSNorm(config.linear_value_head_dim, norm_eps=config.norm_eps, **kw)

    def __call__(
        self,
        x: jax.Array,
        positions: jax.Array,
        cache: LayerCache | None,
        attn_mask: jax.Array | None,
    ) -> tuple[LayerCache | None, jax.Array]:
        del positions  # a recurrence: its order is its position
        config = self.config
        b, t, _ = x.shape
        hk, hv = config.linear_num_key_heads, config.linear_num_value_heads
        dk, dv = config.linear_key_head_dim, config.linear_value_head_dim
        if attn_mask is not None:
            # transformers' apply_mask_to_padding_states: a (left) pad's input is zero,
            # so its conv inputs and its k and v are zero, and the states stay zero
            real = jnp.any(attn_mask, axis=-1)
            x = x * real[..., None].astype(x.dtype)
        mixed = self.in_proj_qkv(x)
        z = self.in_proj_z(x).reshape(b, t, hv, dv)
        beta = jax.nn.sigmoid(self.in_proj_b(x))
        a = self.in_proj_a(x)
        g = -jnp.exp(self.A_log[...].astype(jnp.float32)) * jax.nn.softplus(
            a.astype(jnp.float32) + self.dt_bias[...].astype(jnp.float32)
        )

        conv_state = None if cache is None else cache["conv"]
        mixed, new_conv = deltanet.causal_conv1d(mixed, self.conv1d.w[...], conv_state)
        kd = config.linear_key_dim
        query = mixed[..., :kd].reshape(b, t, hk, dk)
        key = mixed[..., kd : 2 * kd].reshape(b, t, hk, dk)
        value = mixed[..., 2 * kd :].reshape(b, t, hv, dv)
        if hv != hk:  # each key head serves hv / hk consecutive value heads
            query = jnp.repeat(query, hv // hk, axis=2)
            key = jnp.repeat(key, hv // hk, axis=2)

        state = None if cache is None else cache["state"]
        if cache is not None and t == 1:
            out, new_state = deltanet.recurrent_gated_delta_rule(
                query, key, value, g, beta, initial_state=state
            )
        else:
            out, new_state = deltanet.chunk_gated_delta_rule(
                query, key, value, g, beta, initial_state=state, chunk_size=config.chunk_size
            )
        out = self.norm(out.astype(config.dtype), z)
        out = self.out_proj(out.reshape(b, t, config.linear_value_dim))

        new_cache = None
        if cache is not None:
            new_cache = {
                "conv": new_conv.astype(cache["conv"].dtype),
                "state": new_state.astype(cache["state"].dtype),
                "end_index": cache["end_index"] + t,
            }
        return new_cache, out


class MLP(nnx.Module):
    """SwiGLU MLP (Tunix's Qwen3 MLP: ``nnx.Linear`` without bias)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        kw: dict[str, Any] = {
            "use_bias": False,
            "rngs": rngs,
            "dtype": config.dtype,
            "param_dtype": config.param_dtype,
        }
        self.gate_proj = nnx.Linear(config.embed_dim, config.hidden_dim, **kw)
        self.up_proj = nnx.Linear(config.embed_dim, config.hidden_dim, **kw)
        self.down_proj = nnx.Linear(config.hidden_dim, config.embed_dim, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(nnx.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nnx.Module):
    """One pre-norm layer: ``attn`` (full attention) or ``linear_attn`` (DeltaNet), then
    the MLP."""

    def __init__(self, config: ModelConfig, layer_type: str, *, rngs: nnx.Rngs):
        self.config = config
        self.layer_type = layer_type
        kw = _kw(config, rngs)
        self.input_layernorm = RMSNorm(config.embed_dim, norm_eps=config.norm_eps, **kw)
        if layer_type == FULL:
            self.attn = Attention(config, rngs=rngs)
        else:
            self.linear_attn = GatedDeltaNet(config, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(config.embed_dim, norm_eps=config.norm_eps, **kw)
        self.mlp = MLP(config, rngs=rngs)

    def __call__(
        self,
        x: jax.Array,
        positions: jax.Array,
        cache: LayerCache | None,
        attn_mask: jax.Array | None,
    ) -> tuple[LayerCache | None, jax.Array]:
        mixer = self.attn if self.layer_type == FULL else self.linear_attn
        cache, mixed = mixer(self.input_layernorm(x), positions, cache, attn_mask)
        x = x + mixed
        return cache, x + self.mlp(self.post_attention_layernorm(x))


def _module_list(layers: list[DecoderLayer]) -> Any:
    """``nnx.List`` where flax has it (0.12+), as Tunix's ``compat.ModuleList``."""
    return nnx.List(layers) if hasattr(nnx, "List") else layers


class Qwen3_5(nnx.Module):
    """Qwen3.5's text model (``Qwen3_5ForCausalLM``), called as Tunix's Qwen3."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        # the linear-attention layers: their cache is a conv window and a recurrent
        # state, so the model makes its own (``kv_cache.own_cache`` asks this)
        self.recurrent_layers = tuple(i for i, t in enumerate(config.layer_types) if t == LINEAR)
        kw = _kw(config, rngs)
        self.embedder = Embedder(config.vocab_size, config.embed_dim, **kw)
        self.layers = _module_list(
            [DecoderLayer(config, kind, rngs=rngs) for kind in config.layer_types]
        )
        self.final_norm = RMSNorm(config.embed_dim, norm_eps=config.norm_eps, **kw)
        if not config.use_tied_embedding:
            self.lm_head = Einsum("BTD,DV->BTV", (config.embed_dim, config.vocab_size), **kw)

    def init_cache(self, batch_size: int, cache_size: int, dtype: Any) -> Cache:
        """An empty cache: attention layers' ``{k, v, end_index}`` as Tunix's, DeltaNet
        layers' ``{conv, state, end_index}`` (``state`` always float32)."""
        c = self.config
        cache: Cache = {}
        for i, kind in enumerate(c.layer_types):
            end = jnp.zeros((batch_size,), jnp.int32)
            if kind == FULL:
                shape = (batch_size, cache_size, c.num_kv_heads, c.head_dim)
                cache[f"layer_{i}"] = {
                    "k": jnp.zeros(shape, dtype),
                    "v": jnp.zeros(shape, dtype),
                    "end_index": end,
                }
            else:
                cache[f"layer_{i}"] = {
                    "conv": jnp.zeros((batch_size, c.conv_kernel - 1, c.conv_dim), dtype),
                    "state": jnp.zeros(
                        (
                            batch_size,
                            c.linear_num_value_heads,
                            c.linear_key_head_dim,
                            c.linear_value_head_dim,
                        ),
                        jnp.float32,
                    ),
                    "end_index": end,
                }
        return cache

    def __call__(
        self,
        input_tokens: jax.Array,  # [B, L]
        positions: jax.Array,  # [B, L]
        cache: Cache | None,
        attention_mask: jax.Array | None,  # [B, L, L'] (L' the cache's size, with one)
        output_hidden_states: bool = False,
    ) -> tuple[jax.Array, Cache | None]:
        """(float32 logits [B, L, V], the new cache or None), as Tunix's Qwen3.

        ``attention_mask[b, i, j]``: causal & real[j]; a (left) pad's row is all False,
        which is how the DeltaNet layers know a pad (its position is never read)."""
        new_cache: Cache | None = None if cache is None else {}
        x = self.embedder.encode(input_tokens)
        for i, layer in enumerate(self.layers):
            name = f"layer_{i}"
            layer_cache, x = layer(
                x, positions, None if cache is None else cache[name], attention_mask
            )
            if new_cache is not None and layer_cache is not None:
                new_cache[name] = layer_cache
        x = self.final_norm(x)
        if output_hidden_states:
            self.sow(nnx.Intermediate, "all_hidden_states", x)
        logits = self.embedder.decode(x) if self.config.use_tied_embedding else self.lm_head(x)
        return jnp.astype(logits, jnp.float32), new_cache
