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
"""

from __future__ import annotations

from typing import Any


def global_norm(grads: Any) -> Any:
    """The float32 norm of all of ``grads`` (of any float dtype)."""
    import jax
    import jax.numpy as jnp

    return jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in jax.tree.leaves(grads)))


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
    come back in each parameter's dtype. ``learning_rate`` is a float or a schedule."""
    import jax
    import jax.numpy as jnp
    import optax

    reference = optax.chain(
        optax.clip_by_global_norm(max_norm),
        optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay),
    )
    f32 = jnp.float32

    def init(params: Any) -> Any:
        return reference.init(jax.tree.map(lambda x: x.astype(f32), params))

    def update(grads: Any, state: Any, params: Any = None) -> Any:
        clip_state, (adam, decay_state, lr_state) = state
        # multiplying by a scalar (not optax's select of a division) keeps each
        # gradient's use elementwise and cheap, so XLA fuses it instead of storing it
        scale = jnp.minimum(1.0, max_norm / global_norm(grads))
        count = optax.safe_increment(adam.count)
        bc1 = 1 - b1 ** count.astype(f32)
        bc2 = 1 - b2 ** count.astype(f32)
        if callable(learning_rate):
            lr = learning_rate(lr_state.count)
            lr_state = lr_state._replace(count=optax.safe_increment(lr_state.count))
        else:
            lr = learning_rate

        def one(g: Any, p: Any, mu: Any, nu: Any) -> tuple[Any, Any, Any]:
            g = g.astype(f32) * scale
            mu = (1 - b1) * g + b1 * mu
            nu = (1 - b2) * g * g + b2 * nu
            u = (mu / bc1) / (jnp.sqrt(nu / bc2) + eps)
            if weight_decay:
                u = u + weight_decay * p.astype(f32)
            return (-lr * u).astype(p.dtype), mu, nu

        treedef = jax.tree.structure(grads)
        # Pitfall: the norm and the moments would share one float32 conversion of each
        # bfloat16 gradient, which XLA:CPU then stores whole (4.6 GiB for a 1.2B
        # model); behind the barrier each converts its own, fused away.
        grads = jax.lax.optimization_barrier(grads)
        # jaxlib's PyTreeDef has these methods; the type stubs mypy reads here lack them
        out = treedef.flatten_up_to(  # type: ignore[attr-defined]
            jax.tree.map(one, grads, params, adam.mu, adam.nu)
        )
        updates, mu, nu = (
            treedef.unflatten([o[i] for o in out])  # type: ignore[attr-defined]
            for i in range(3)
        )
        return updates, (
            clip_state,
            (adam._replace(count=count, mu=mu, nu=nu), decay_state, lr_state),
        )

    return optax.GradientTransformation(init, update)
