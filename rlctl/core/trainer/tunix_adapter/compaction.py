"""The update's MLPs on the completions' real tokens only, in one compiled program.

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

Pitfall (why the vocabulary head is not packed too): differentiated, a
``lax.switch`` keeps the residuals of every branch (JAX's partial evaluation of
``cond`` gives each branch the union of all branches' residuals), so a packed head
kept [128 + 256 + ... + 768, 49152] logits: the default update's temporaries rose
from 0.63 to 1.06 GiB (XLA's memory analysis). Inside a layer that is recomputed in
the backward pass (``training.remat``) the MLP's union lives one layer at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

BUCKETS = 6  # packed sizes: T/6, 2T/6, ... T (each one more branch to compile)
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
    out = sorted({min(tokens, -(-tokens * i // buckets // ALIGN) * ALIGN)
                  for i in range(1, buckets + 1)})
    return [s for s in out if s > 0] or [tokens]


def needed_positions(mask: jax.Array) -> jax.Array:
    """[R, L] where a completion position's hidden state is read: some later target of
    its row is masked in (target j is predicted by position j - 1)."""
    later = jnp.flip(jnp.cumsum(jnp.flip(mask.astype(jnp.int32), axis=1), axis=1), axis=1)
    return jnp.concatenate([later[:, 1:] > 0, jnp.zeros_like(later[:, :1], bool)], axis=1)


def plan(keep: jax.Array) -> Packing:
    """The ``Packing`` of the positions where ``keep`` [R, L] is set."""
    flat = keep.reshape(-1)
    order = jnp.argsort(~flat, stable=True).astype(jnp.int32)
    inverse = jnp.argsort(order).astype(jnp.int32)
    n = flat.sum()
    branch = jnp.searchsorted(jnp.asarray(sizes(flat.shape[0]), jnp.int32), n, side="left")
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


def packed(fn: Callable[[jax.Array], jax.Array], x: jax.Array,
           packing: Packing) -> jax.Array:
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

    out = jax.lax.switch(packing.branch, [branch(m) for m in sizes(T)], xs)
    return permute(out, packing.inverse, packing.order)
