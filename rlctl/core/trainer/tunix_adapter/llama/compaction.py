"""The update's MLPs and vocabulary head on the completions' real tokens only, in one
compiled program.

Why: the rollout pads every completion to ``rollout.max_new_tokens`` so the update
compiles once, but most completions stop early: in the default run 380 of the 768
completion positions of a step were real. The MLP, 60% of the update's work on a
completion token of SmolLM2, acts on each token alone, so it can run on the real
tokens packed together and skip the pads. XLA needs static shapes, so the packed
tokens run at the smallest of ``BUCKETS`` fixed sizes that holds them (a
``lax.switch`` whose branch is picked at run time): one compiled program whatever
the step's lengths, at most T/BUCKETS positions of pads computed.

Which positions count: the loss reads a completion token's log-prob where the
batch's mask is set, off the hidden state one position before, which attends to
every earlier position; so a position's MLPs are needed where any later position of
its row is masked in (``needed_positions``). The skipped positions keep finite
values (the residual stream without the MLP) that nothing masked in reads.

The vocabulary head (``head_logps``) is packed the same way, on the positions whose
log-prob the loss reads (the mask itself): it was a fifth of the default update's
time (1.58 s of ~8 for 768 positions, 1.10 s for 512, on a 2-core Zen 3 EPYC).

Pitfall (why the head has its own gradient): differentiated, a ``lax.switch`` keeps
the residuals of every branch (JAX's partial evaluation of ``cond`` gives each branch
the union of all branches' residuals), so a head packed through JAX's own
differentiation kept [128 + 256 + ... + 768, 49152] logits: the default update's
temporaries rose from 0.63 to 1.06 GiB (XLA's memory analysis). ``head_logps`` is a
``custom_vjp`` whose forward switch keeps one [T, V] array of probabilities (what the
whole grid kept) and whose backward switch computes the head's two gradients
itself. Inside a layer that is recomputed in the backward pass (``training.remat``)
the MLP's union lives one layer at a time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rlctl.core.trainer.tunix_adapter.mixed import dot, dot_nt, dtype_of, narrow

# What the lowered programs call these switches (their operations' named scopes), so
# a test can tell that an accelerator's program holds none of them.
ROWS_SCOPE = "packed_mlp_rows"
HEAD_SCOPE = "packed_head"
BUCKETS = 6  # packed sizes: T/6, 2T/6, ... T (each one more branch to compile)
# the head's: one switch in the whole update (the MLPs have one per layer), so finer
# steps cost little compile time and waste fewer rows (the default run's ~390 real
# positions of 768 run as 448, not 512)
HEAD_BUCKETS = 12
ALIGN = 8  # packed sizes are multiples of this (rows of a matmul tile)


class Packing(NamedTuple):
    """Where the kept tokens of a [R, L] grid go: ``order`` lists the flat positions,
    kept ones first; ``inverse`` undoes it; ``branch`` picks the packed size."""

    order: jax.Array
    inverse: jax.Array
    branch: jax.Array


def sizes(tokens: int, buckets: int = BUCKETS) -> list[int]:
    """The packed sizes for a grid of ``tokens``: ``buckets`` steps up to it, each a
    multiple of ``ALIGN`` (the last is ``tokens`` itself)."""
    out = sorted(
        {min(tokens, -(-tokens * i // buckets // ALIGN) * ALIGN) for i in range(1, buckets + 1)}
    )
    return [s for s in out if s > 0] or [tokens]


def needed_positions(mask: jax.Array) -> jax.Array:
    """[R, L] where a completion position's hidden state is read: some later target of
    its row is masked in (target j is predicted by position j - 1)."""
    later = jnp.flip(jnp.cumsum(jnp.flip(mask.astype(jnp.int32), axis=1), axis=1), axis=1)
    return jnp.concatenate([later[:, 1:] > 0, jnp.zeros_like(later[:, :1], bool)], axis=1)


def plan(keep: jax.Array, buckets: int = BUCKETS) -> Packing:
    """The ``Packing`` of the positions where ``keep`` [R, L] is set."""
    flat = keep.reshape(-1)
    order = jnp.argsort(~flat, stable=True).astype(jnp.int32)
    inverse = jnp.argsort(order).astype(jnp.int32)
    n = flat.sum()
    branch = jnp.searchsorted(jnp.asarray(sizes(flat.shape[0], buckets), jnp.int32), n, side="left")
    return Packing(order, inverse, branch.astype(jnp.int32))


@jax.custom_vjp
def permute(x: jax.Array, order: jax.Array, inverse: jax.Array) -> jax.Array:
    """``x[order]``, whose gradient is a gather by ``inverse`` (JAX's own transpose of
    a gather is a scatter-add, element by element on XLA:CPU)."""
    return jnp.take(x, order, axis=0)


def _permute_fwd(x, order, inverse):
    return jnp.take(x, order, axis=0), inverse


def _permute_bwd(inverse, g):
    return jnp.take(g, inverse, axis=0), None, None


permute.defvjp(_permute_fwd, _permute_bwd)


def packed(fn: Callable[[jax.Array], jax.Array], x: jax.Array, packing: Packing) -> jax.Array:
    """``fn`` applied to the kept rows of ``x`` [T, ...], its output [T, ...] back in
    ``x``'s order.

    ``fn`` acts on each row alone (its output's rows are its input's); it runs on the
    smallest packed size that holds the kept rows, so it also runs on a few rows not
    kept (computed as usual) and the others' outputs are zeros.
    """
    T = x.shape[0]
    xs = permute(x, packing.order, packing.inverse)

    def branch(m: int) -> Callable[[jax.Array], jax.Array]:
        def run(xs):
            out = fn(xs[:m])
            return jnp.pad(out, [(0, T - m)] + [(0, 0)] * (out.ndim - 1))

        return run

    with jax.named_scope(ROWS_SCOPE):
        out = jax.lax.switch(packing.branch, [branch(m) for m in sizes(T)], xs)
    return permute(out, packing.inverse, packing.order)


def head_logps(
    h: jax.Array,
    targets: jax.Array,
    w: jax.Array,
    temperature: float,
    keep: jax.Array,
    dtype: str = "float32",
) -> tuple[jax.Array, jax.Array]:
    """Log-prob of each target [T] under the head ``w`` [D, V] from hidden states
    ``h`` [T, D], and the entropy of its distribution (no gradient), computed where
    ``keep`` [T] is set and 0 elsewhere; the head's [m, D] x [D, V] products run on
    the smallest of ``HEAD_BUCKETS`` sizes that holds the kept positions, reading
    ``dtype`` and summing in float32 (``mixed``), forward and backward."""
    p = plan(keep, HEAD_BUCKETS)
    return _head(temperature, dtype, h, w, targets, keep, p.order, p.inverse, p.branch)


def _scaled_logits(h: jax.Array, w: jax.Array, temperature: float, dtype: str) -> jax.Array:
    """As ``logprobs.token_logps`` computes them: float32, over the temperature. ``w``
    is [D, V] in float32 and, narrow, [V, D] (``_head_weight``)."""
    logits = dot_nt(h, w, dtype) if narrow(dtype) else dot(h, w, dtype)
    return logits / temperature if temperature not in (0.0, 1.0) else logits


def _head_weight(w: jax.Array, dtype: str) -> jax.Array:
    """The head as the products read it: ``w`` [D, V] itself in float32; narrow, cast
    and taken as [V, D] (a tied head's embedding as it is stored), so that both the
    logits (``mixed.dot_nt``) and their input's gradient (``mixed.dot``) are products
    XLA:CPU runs narrow."""
    return w.T.astype(dtype_of(dtype)) if narrow(dtype) else w


def _head_forward(temperature, dtype, h, w, targets, keep, order, inverse, branch):
    T = h.shape[0]
    hp, tp = jnp.take(h, order, axis=0), jnp.take(targets, order)
    wc = _head_weight(w, dtype)  # cast once for every branch, kept for the backward

    def run(m: int):
        def fn(hp, tp):
            logits = _scaled_logits(hp[:m], wc, temperature, dtype)
            lse = jax.nn.logsumexp(logits, axis=-1)
            logp = jnp.take_along_axis(logits, tp[:m, None], axis=-1)[:, 0] - lse
            probs = jnp.exp(logits - lse[:, None])
            ent = lse - (probs * logits).sum(-1)
            return (
                jnp.pad(logp, (0, T - m)),
                jnp.pad(ent, (0, T - m)),
                jnp.pad(probs, ((0, T - m), (0, 0))),
            )

        return fn

    with jax.named_scope(HEAD_SCOPE):
        logp, ent, probs = jax.lax.switch(branch, [run(m) for m in sizes(T, HEAD_BUCKETS)], hp, tp)
    # the packed size's extra rows were computed too: 0 there as elsewhere
    out = (
        jnp.where(keep, jnp.take(logp, inverse), 0.0),
        jax.lax.stop_gradient(jnp.where(keep, jnp.take(ent, inverse), 0.0)),
    )
    marks = jnp.zeros((0,), w.dtype)  # the head's own dtype, for its gradient
    return out, (hp, wc, tp, probs, keep, order, inverse, branch, marks)


def _head_backward(temperature, dtype, saved, grads):
    hp, wc, tp, probs, keep, order, inverse, branch, w_mark = saved
    thin = narrow(dtype)
    g = jnp.take(jnp.where(keep, grads[0], 0.0), order)  # the entropy has no gradient
    T = hp.shape[0]
    scale = 1.0 / temperature if temperature not in (0.0, 1.0) else 1.0

    def run(m: int):
        def fn(hp, tp, probs, g):
            onehot = jnp.arange(probs.shape[1])[None, :] == tp[:m, None]
            # d logp / d logits = onehot - softmax; the logits are (h @ w) / temperature
            dl = (g[:m, None] * scale * (onehot - probs[:m])).astype(hp.dtype)
            if thin:  # wc is [V, D]; the head's own gradient float32 (mixed._mm_backward)
                dh = dot(dl, wc, dtype).astype(hp.dtype)
            else:  # contracted as JAX's own transpose rule does, no transposed copy of w
                dh = jnp.einsum("tv,dv->td", dl, wc.astype(hp.dtype))
            dw = jnp.einsum("td,tv->dv", hp[:m], dl)
            return jnp.pad(dh, ((0, T - m), (0, 0))), dw.astype(w_mark.dtype)

        return fn

    with jax.named_scope(HEAD_SCOPE):
        dh, dw = jax.lax.switch(branch, [run(m) for m in sizes(T, HEAD_BUCKETS)], hp, tp, probs, g)
    return jnp.take(dh, inverse, axis=0), dw, None, None, None, None, None


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _head(temperature, dtype, h, w, targets, keep, order, inverse, branch):
    return _head_forward(temperature, dtype, h, w, targets, keep, order, inverse, branch)[0]


_head.defvjp(_head_forward, _head_backward)
