"""AdamW behind global-norm clipping, fused so the update holds no copy of the model.

optax's ``chain(clip_by_global_norm, adamw)`` computes the same numbers, but its
clipped gradients are a whole tree that XLA materializes: measured with XLA's
memory analysis, one float32 copy of every parameter in the update's
temporaries (513 MiB for SmolLM2-135M, 4.6 GiB for a 1.2B model in bfloat16).
Here each parameter's new value and moments come from one elementwise expression
of its gradient, scaled by a scalar, which XLA fuses and writes in place into the
donated buffers. The state is optax's own (``chain(clip_by_global_norm,
adamw)``'s), so checkpoints keep their layout, and the moments are float32
whatever the parameters' dtype: a bfloat16 second moment underflows (squared
gradients below ~1e-38 flush to zero) and its 8-bit mantissa cannot hold a
running average. ``tests/core/trainer/test_optimizer.py`` checks the numbers
against optax.

The arrays are stepped a unit at a time: a unit is one layer of a model whose layers
are a list (every array under one integer key) or one other array, and each unit's
squared norm and its step are one nested ``jax.jit`` call, so units of one shape share
one body. Why: a program held one AdamW expression per array, 42 operations each, so
the update grew with depth by that alone (issue #44; docs/decisions/trainer.md). Now it
holds one per kind of unit
and a call per unit (tests/core/trainer/test_lowering.py). XLA inlines the calls when
it compiles, so the compiled step is the same elementwise work; what no longer grows
with depth is the program JAX traces and lowers and XLA reads.
"""

from __future__ import annotations

import functools
from typing import Any


def global_norm(grads: Any) -> Any:
    """The float32 norm of all of ``grads`` (of any float dtype)."""
    import jax
    import jax.numpy as jnp

    return jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in jax.tree.leaves(grads)))


def units(tree: Any) -> list[list[int]]:
    """``tree``'s leaves (by their flattened index) grouped into units: the leaves under
    the same integer key of a path (one layer of a list of layers) form one unit, in
    order; every other leaf is a unit of its own."""
    import jax

    groups: dict[Any, list[int]] = {}
    for i, (path, _) in enumerate(jax.tree_util.tree_flatten_with_path(tree)[0]):
        keys = [getattr(k, "key", getattr(k, "idx", None)) for k in path]
        at = next((j for j, k in enumerate(keys) if isinstance(k, int)), None)
        unit = ("layer", *keys[: at + 1]) if at is not None else ("leaf", i)
        groups.setdefault(unit, []).append(i)
    return list(groups.values())


@functools.cache
def _kernels() -> tuple[Any, Any]:
    """(a unit's arrays' float32 squared norms, a unit's AdamW step): jitted once per process,
    so every call of one shape reuses one traced body."""
    import jax
    import jax.numpy as jnp

    f32 = jnp.float32

    @jax.jit
    def square_sums(gs: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(jnp.sum(jnp.square(g.astype(f32))) for g in gs)

    @functools.partial(jax.jit, static_argnames=("b1", "b2", "eps", "weight_decay", "apply"))
    def step(gs, ps, mus, nus, scale, lr, bc1, bc2, *, b1, b2, eps, weight_decay, apply):
        news, new_mus, new_nus = [], [], []
        for g, p, mu, nu in zip(gs, ps, mus, nus, strict=True):
            g = g.astype(f32) * scale
            mu = (1 - b1) * g + b1 * mu
            nu = (1 - b2) * g * g + b2 * nu
            u = (mu / bc1) / (jnp.sqrt(nu / bc2) + eps)
            if weight_decay:
                u = u + weight_decay * p.astype(f32)
            u = (-lr * u).astype(p.dtype)
            # optax.apply_updates' own expression, when the step applies it
            news.append(jnp.asarray(p + u).astype(p.dtype) if apply else u)
            new_mus.append(mu)
            new_nus.append(nu)
        return tuple(news), tuple(new_mus), tuple(new_nus)

    return square_sums, step


def clipped_adamw(
    learning_rate: Any,
    *,
    b1: float,
    b2: float,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    max_norm: float,
) -> Any:
    """An optax transformation equal to ``chain(clip_by_global_norm(max_norm),
    adamw(learning_rate, b1, b2, eps, weight_decay))`` on float32 moments; the updates
    come back in each parameter's dtype. ``learning_rate`` is a float or a schedule.
    Besides optax's ``init`` and ``update`` it has ``apply(grads, state, params)`` ->
    (new params, new state, the gradients' norm): the step with the updates added in
    the same expression (``apply_step``); ``barrier=False`` leaves out the barrier
    between the norm and the step (for gradients that are rows of stacked ones,
    ``layer_rows``, which it would store apart); ``norm``: the gradients' global norm
    where the caller took it already (of the stacked gradients, one reduction per kind
    of array where the rows would need one each: ``Update._grads_and_norm``)."""
    import jax
    import jax.numpy as jnp
    import optax

    reference = optax.chain(
        optax.clip_by_global_norm(max_norm),
        optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay),
    )
    f32 = jnp.float32
    hyper = {"b1": b1, "b2": b2, "eps": eps, "weight_decay": weight_decay}

    def init(params: Any) -> Any:
        return reference.init(jax.tree.map(lambda x: x.astype(f32), params))

    def run(
        grads: Any, state: Any, params: Any, apply: bool, barrier: bool = True, norm: Any = None
    ) -> tuple[Any, Any, Any]:
        clip_state, (adam, decay_state, lr_state) = state
        square_sums, step = _kernels()
        # Any: jaxlib's PyTreeDef has flatten_up_to and unflatten; the type stubs mypy
        # reads here lack them
        treedef: Any = jax.tree.structure(grads)
        groups = units(grads)
        g = treedef.flatten_up_to(grads)
        if norm is None:
            sums: list[Any] = [None] * len(g)
            for u in groups:
                for i, x in zip(u, square_sums(tuple(g[i] for i in u)), strict=True):
                    sums[i] = x
            # added in the leaves' order, as ``global_norm`` adds them: the same float32 sum
            norm = jnp.sqrt(sum(sums))
        # Pitfall: the norm and the moments would share one float32 conversion of each
        # bfloat16 gradient, which XLA:CPU then stores whole (4.6 GiB for a 1.2B
        # model); behind the barrier each converts its own, fused away.
        if barrier:
            g = jax.lax.optimization_barrier(g)
        mu, nu = (treedef.flatten_up_to(t) for t in (adam.mu, adam.nu))
        p = treedef.flatten_up_to(params) if params is not None else mu
        # multiplying by a scalar (not optax's select of a division) keeps each
        # gradient's use elementwise and cheap, so XLA fuses it instead of storing it
        scale = jnp.minimum(1.0, max_norm / norm)
        count = optax.safe_increment(adam.count)
        bc1 = 1 - b1 ** count.astype(f32)
        bc2 = 1 - b2 ** count.astype(f32)
        if callable(learning_rate):
            lr = learning_rate(lr_state.count)
            lr_state = lr_state._replace(count=optax.safe_increment(lr_state.count))
        else:
            lr = learning_rate
        lr = jnp.asarray(lr, f32)
        out: list[Any] = [None] * len(g)
        new_mu: list[Any] = [None] * len(g)
        new_nu: list[Any] = [None] * len(g)
        for u in groups:
            pick = lambda xs, u=u: tuple(xs[i] for i in u)  # noqa: E731
            news, mus, nus = step(
                pick(g), pick(p), pick(mu), pick(nu), scale, lr, bc1, bc2, apply=apply, **hyper
            )
            for i, a, m, n in zip(u, news, mus, nus, strict=True):
                out[i], new_mu[i], new_nu[i] = a, m, n
        new_state = (
            clip_state,
            (
                adam._replace(
                    count=count,
                    mu=treedef.unflatten(new_mu),
                    nu=treedef.unflatten(new_nu),
                ),
                decay_state,
                lr_state,
            ),
        )
        return treedef.unflatten(out), new_state, norm

    def update(grads: Any, state: Any, params: Any = None) -> Any:
        updates, new_state, _ = run(grads, state, params, apply=False)
        return updates, new_state

    def apply(
        grads: Any, state: Any, params: Any, barrier: bool = True, norm: Any = None
    ) -> tuple[Any, Any, Any]:
        return run(grads, state, params, apply=True, barrier=barrier, norm=norm)

    tx = _fused_type()(init, update)
    tx.apply = apply
    return tx


@functools.cache
def _fused_type() -> Any:
    """optax's (init, update) pair as a type that also carries ``apply`` (made on first
    use: optax is imported lazily, as the trainer's heavy imports are)."""
    import optax

    class Fused(optax.GradientTransformation):  # type: ignore[misc]  # optax is untyped here
        apply: Any

    return Fused


def layer_rows(stacked: Any, layers: Any) -> Any:
    """The stacked layers' gradients ``stacked`` (one layer's tree, a leading layer axis)
    as ``layers``' tree (the layers' parameters: ``layers[i]`` each layer's), each
    layer's arrays read at a runtime index.

    Why a runtime index: each row read at a constant offset is its own slice, a body of
    its own wherever XLA fuses it (each layer's AdamW step, ``clipped_adamw``). Read at
    an index XLA cannot fold (a zero behind an optimization barrier, then one added per
    layer), every layer's step of one kind of array has one body, its index an operand
    (``Update._stacked_params`` gives the measurement)."""
    import jax
    import jax.numpy as jnp

    def keys(path: Any) -> tuple[Any, ...]:
        return tuple(getattr(k, "key", getattr(k, "name", getattr(k, "idx", None))) for k in path)

    rows = {keys(p): g for p, g in jax.tree_util.tree_flatten_with_path(stacked)[0]}
    flat, treedef = jax.tree_util.tree_flatten_with_path(layers)
    index = jax.lax.optimization_barrier(jnp.zeros((), jnp.int32))
    at = {}
    for i in sorted(layers["layers"].keys()):  # layer i's row at index i
        at[i] = index
        index = index + 1
    leaves = []
    for path, x in flat:
        _, i, *rest = keys(path)  # ("layers", i, then the path within the layer)
        row = jax.lax.dynamic_index_in_dim(rows[tuple(rest)], at[i], keepdims=False)
        if row.shape != x.shape:
            raise ValueError(f"stacked gradient {rest} does not match layer {i}'s array")
        leaves.append(row)
    return jax.tree.unflatten(treedef, leaves)


def apply_step(
    optimizer: Any, model: Any, grads: Any, barrier: bool = True, norm: Any = None
) -> Any:
    """``optimizer.update(model, grads)`` (flax nnx's, 0.12) with the updates added in
    the optimizer's own expression when it offers ``apply`` (``clipped_adamw``):
    returns the gradients' float32 norm, computed once for the clipping and the step's
    metrics. ``barrier``, ``norm``: ``clipped_adamw``'s."""
    from flax import nnx

    tx = optimizer.tx
    if not hasattr(tx, "apply"):
        optimizer.update(model, grads)
        return norm if norm is not None else global_norm(grads)
    params = nnx.as_pure(nnx.state(model, optimizer.wrt))
    grads = nnx.as_pure(nnx.state(grads, optimizer.wrt))
    new_params, new_state, norm = tx.apply(
        grads, nnx.as_pure(optimizer.opt_state), params, barrier=barrier, norm=norm
    )
    nnx.update(model, new_params)
    nnx.update(optimizer.opt_state, nnx.state(new_state))
    optimizer.step[...] += 1
    return norm
