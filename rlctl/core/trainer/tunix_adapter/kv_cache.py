"""The KV cache the sampler decodes with, and the replicated weights it decodes on."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from rlctl.core.trainer.tunix_adapter.weights import ModelInfo


# rlctl samples with its own prefix-shared sampler (sampler.py); Tunix's sampler is
# the yardstick bench/bench_rollout.py measures it against (tests/.../yardsticks.py).
def shares_kv(model: Any) -> bool:
    """A Tunix model whose later layers reuse earlier layers' keys and values (Tunix's
    Gemma 4): its layers differ in cache shape (global layers' own head size, sliding
    layers' ring of window slots, shared layers none), so it makes its own cache
    (``init_cache``), and a prefill cannot continue a cached one (its prefill attends
    to the new tokens' keys only). Asked of the Tunix model, not of a family."""
    return hasattr(model, "kv_cache_sharing_patterns") and hasattr(model, "init_cache")


def own_cache(model: Any) -> bool:
    """A model that makes its own cache (``init_cache``), its layers' caches differing
    in shape: Tunix's Gemma 4 (``shares_kv``), and rlctl's Qwen3.5, whose
    linear-attention layers keep a convolution window and a recurrent state instead
    of keys and values (``recurrent_layers``). Asked of the model, not of a family."""
    return shares_kv(model) or bool(getattr(model, "recurrent_layers", ()))


def kv_cache(
    info: ModelInfo, batch: int, size: int, stacked: bool = False, model: Any = None
) -> Any:
    """An empty KV cache of ``size`` slots per row in the layout Tunix's attention
    layers write (``layer_i: {k, v, end_index}``); the model's dtype, as
    ``shared_prefix_logps`` makes it. ``stacked``: one ``{k, v, end_index}`` whose
    arrays have a leading layer axis, as scanned layers read and write it
    (``layers.scan_trunk``). ``model``: one that makes its own (``own_cache``)."""
    if model is not None and own_cache(model):
        return model.init_cache(batch, size, jnp.dtype(info.dtype))
    if stacked:
        one = layer_cache(info, batch, size)
        return jax.tree.map(lambda x: jnp.zeros((info.num_layers, *x.shape), x.dtype), one)
    from tunix.generate import sampler as sampler_lib

    return sampler_lib._init_cache(
        info.num_layers, size, batch, info.num_kv_heads, info.head_dim, jnp.dtype(info.dtype)
    )


def layer_cache(info: ModelInfo, batch: int, size: int) -> Any:
    """One layer's empty cache (``kv_cache``'s ``layer_0``)."""
    from tunix.generate import sampler as sampler_lib

    return sampler_lib._init_cache(
        1, size, batch, info.num_kv_heads, info.head_dim, jnp.dtype(info.dtype)
    )["layer_0"]


def repeat_rows(cache: Any, times: int, stacked: bool = False) -> Any:
    """Each row of ``cache`` repeated ``times`` times in place (a group's rows after
    its prompt's); a stacked cache's rows are its second axis."""
    return jax.tree.map(lambda x: jnp.repeat(x, times, axis=1 if stacked else 0), cache)


def whole_weights(state: Any, mesh: Any) -> Any:
    """Every array of ``state`` replicated on every device of ``mesh`` (one all-gather).

    The sampler decodes on such a copy across processes: left FSDP-sharded, every
    decoded token would all-gather every layer (docs/decisions/trainer.md).
    """
    return _replicator(mesh)(state)


@functools.lru_cache(maxsize=4)
def _replicator(mesh: Any) -> Any:
    """One jitted identity per mesh: a new lambda per call would trace it anew."""
    from jax.sharding import NamedSharding, PartitionSpec

    return jax.jit(lambda t: t, out_shardings=NamedSharding(mesh, PartitionSpec()))
