"""Llama's decoder layers as one scanned layer body: a program holds one layer,
whatever the model's depth.

Why: Tunix's Llama keeps its layers as a Python list and rlctl's forwards walked it, so
every program (the update, the sampler's prefill and decode, the eval) held every
layer, compiled anew. On one H200 the default update took 90 s to compile and a
16 x 8 x 256 batch never reached step 1 in 185 s (issue #44). Scanned, the
layers' parameters are stacked on a leading axis (a copy per call, the size of the
layers' weights) and ``lax.scan`` runs one compiled body over them, as MaxText's
``scan_layers`` does; the KV cache is stacked the same way (``kv_cache(stacked=True)``).

Which backends scan is the numerics table's choice (``numerics.Numerics.scan_layers``).
Plain Llama-family models only (``Capabilities.scanned_layers``): a LoRA model's adapters are qwix's
interceptions of each layer's call, and Qwen and Gemma run Tunix's whole model call.
The numerics are the unrolled loop's: the same layer function, applied in the same
order (tested: equal logits and gradients on a tiny model).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rlctl.core.trainer.tunix_adapter.llama.decode import plain
from rlctl.core.trainer.tunix_adapter.llama.mlp_grad import decoder_layer
from rlctl.core.trainer.tunix_adapter.mixed import dtype_of, narrow


def scans(model: Any, info: Any) -> bool:
    """Whether ``model``'s layers can run scanned here: its family declares it
    (``Capabilities.scanned_layers``) and it has no LoRA adapters."""
    return info.capabilities.scanned_layers and plain(model)


def stack(layers: Any) -> tuple[Any, Any]:
    """(the graph of one layer, every layer's state stacked on a leading axis)."""
    graphdef, _ = nnx.split(layers[0])
    states = [nnx.split(layer)[1] for layer in layers]
    return graphdef, jax.tree.map(_stacked, *states)


def _stacked(*xs: jax.Array) -> jax.Array:
    """``jnp.stack(xs)`` as one concatenation and one reshape: ``jnp.stack`` reshapes
    each array first, so its program grew by an operation per layer and array."""
    if xs[0].ndim == 0:
        return jnp.stack(xs)
    return jnp.concatenate(xs, axis=0).reshape(len(xs), *xs[0].shape)


def part(states: Any, start: int, stop: int) -> Any:
    """Layers ``start`` to ``stop`` of stacked ``states``."""
    return jax.tree.map(lambda x: x[start:stop], states)


def scan(body: Callable[[Any, Any], Any], carry: Any, states: Any) -> Any:
    """``carry`` through ``body(carry, state)`` for each layer of stacked ``states``."""
    return jax.lax.scan(lambda c, s: (body(c, s), None), carry, states)[0]


def narrowed(states: Any, dtype: str) -> Any:
    """Stacked layer ``states`` with their matrices cast to the compute ``dtype`` once
    (the norms' vectors kept): a decode loop then reads each weight narrow, where
    ``mixed``'s products would cast it at every token. The same values the products
    read either way."""
    if not narrow(dtype):
        return states
    dt = dtype_of(dtype)
    return jax.tree.map(
        lambda x: x.astype(dt) if x.ndim >= 3 and jnp.issubdtype(x.dtype, jnp.floating) else x,
        states,
    )


def scan_trunk(
    model: Any,
    tokens: jax.Array,
    positions: jax.Array,
    cache: Any,
    mask: jax.Array,
    dtype: str = "float32",
    stacked: tuple[Any, Any] | None = None,
) -> tuple[jax.Array, Any]:
    """``logprobs.trunk`` with the layers scanned: the final-norm hidden states and the
    new stacked cache (``cache`` stacked, or None). Each layer is rlctl's
    (``mlp_grad.decoder_layer``: Tunix's operations in float32, its products reading
    ``dtype``). ``stacked``: the layers as ``stack`` gives them, stacked once outside
    a loop (else here, a copy of the layers' weights per call)."""
    graphdef, states = stacked or stack(model.layers)

    def body(x: jax.Array, each: Any) -> tuple[jax.Array, Any]:
        state, layer_cache = each
        new_cache, x = decoder_layer(
            nnx.merge(graphdef, state),
            x,
            positions,
            layer_cache,
            mask,
            None,
            dtype,
            own_gradient=False,
        )
        return x, new_cache

    x, new_cache = jax.lax.scan(body, model.embedder.encode(tokens), (states, cache))
    return model.final_norm(x), new_cache
