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
    return graphdef, stack_states([nnx.split(layer)[1] for layer in layers])


def stack_states(states: list[Any]) -> Any:
    """Layer states (one per layer, of one structure) stacked on a leading axis."""
    return jax.tree.map(_stacked, *states)


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


def _narrowed_mlp(states: Any, dtype: str) -> Any:
    """Stacked layer ``states`` with their MLP's matrices cast to the compute ``dtype``
    once, before the scan, where JAX differentiates the MLP (``mlp_grad.jax_gradient_mlp``,
    an accelerator's row).

    Why: the stacked float32 matrices were a copy of the MLP's weights in the update's
    temporaries (318 MB for SmolLM2), and each layer cast its own inside the body.
    Narrowed before the scan the copy is half as large (XLA fuses the stacking with
    the cast) and the body reads them as they are. The numbers are the same: that MLP
    casts its weights to ``dtype`` first thing, so JAX's gradient of each is the
    narrow product's, cast to float32 by the cast's transpose, inside the scan or
    outside it. The attention's products (``mixed.mm``) give their weights a float32
    gradient of their own, which a narrowed weight would round: they stay float32."""
    if not narrow(dtype):
        return states
    dt = dtype_of(dtype)

    def cast(path: Any, x: jax.Array) -> jax.Array:
        keys = [getattr(k, "key", getattr(k, "name", None)) for k in path]
        return x.astype(dt) if "mlp" in keys and x.ndim >= 3 else x

    return jax.tree_util.tree_map_with_path(cast, states)


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


def stream_hidden(
    model: Any,
    prompt_ids: jax.Array,
    completion_ids: jax.Array,
    *,
    group: int,
    pad_id: int,
    recomputed: int,
    dtype: str,
    own_gradient: bool,
    stacked: tuple[Any, Any] | None = None,
) -> jax.Array:
    """The final-norm hidden states [P*G, Lc, D] that predict each completion token,
    from one token stream per completion (its group's prompt, then itself) through the
    scanned layers, the first ``recomputed`` of them under ``jax.checkpoint``.

    Why one stream (the accelerators' update): the prefix-shared forward
    (``logprobs._layer_pair``) runs every layer twice, over the prompts [P, Lp] and over
    the completions [P*G, Lc] with the prompts' repeated cache, so each of the layer's
    operations is compiled at two shapes, with the cache's updates and repeats between.
    XLA's GPU compiler configures, emits (and on a GPU autotunes) each distinct fusion,
    and the update held 314 where the naive program of the same model
    (bench/bench_compile.py's update-ref) held 83; now 193, with 3x less memory
    (docs/benchmarks.md: the deviceless compile's seconds stayed about the
    reference's). One stream is the reference's own layout: the layer compiled once,
    at one shape; the prompt's tokens are computed G times, a few milliseconds on a GPU.

    Why the checkpoint: each layer then keeps its input alone for the backward pass
    (one [P*G, Lp+Lc, D] array) instead of its ~10 residuals, each a stacked array
    the scan writes and a distinct fusion to compile. A GPU or TPU compiler keeps the
    recomputation in the backward loop; XLA:CPU's hoisting (``logprobs._recomputed_pair``
    says why it ties the recomputation to the gradient there) does not apply here.

    The numbers are the prefix-shared pass's: the same tokens, positions (the prompt's
    from its real tokens, the completion's after them) and keys (a prompt's real tokens,
    then the completion's up to each position), so the same attention over the same
    values (tests/core/trainer/test_layers.py). ``stacked``: the layers as ``stack``
    gives them, stacked by the caller (outside its gradient, ``Update``).
    """
    from tunix.generate import utils as gen_utils

    _, Lp = prompt_ids.shape
    _, Lc = completion_ids.shape
    S = Lp + Lc
    prompts = jnp.repeat(prompt_ids, group, axis=0)
    pmask = prompts != pad_id
    keys = jnp.concatenate([pmask, completion_ids != pad_id], axis=1)
    after = pmask.sum(-1, keepdims=True) + jnp.arange(Lc)[None, :]
    positions = jnp.concatenate([gen_utils.build_positions_from_mask(pmask), after], axis=1)
    mask = keys[:, None, :] & jnp.tril(jnp.ones((S, S), jnp.bool_))[None]
    x = model.embedder.encode(jnp.concatenate([prompts, completion_ids], axis=1))
    graphdef, states = stacked or stack(model.layers)
    if not own_gradient:
        states = _narrowed_mlp(states, dtype)

    def body(x: jax.Array, state: Any) -> jax.Array:
        layer = nnx.merge(graphdef, state)
        return decoder_layer(layer, x, positions, None, mask, None, dtype, own_gradient)[1]

    layers = len(model.layers)
    again = jax.checkpoint(body, prevent_cse=False)
    for fn, lo, hi in ((again, 0, recomputed), (body, recomputed, layers)):
        if hi > lo:
            x = scan(fn, x, part(states, lo, hi))
    # token j is predicted by the position before it: the prompt's last for the first
    return model.final_norm(x[:, Lp - 1 : S - 1])
