"""The memory a checkpoint's save and restore hold beside the run's own arrays.

Orbax copies the state to the host in bounded pieces (``in_flight_limit``), the
optimizer's fresh moments are freed before a restore reads the saved ones (``free``),
a CPU restore's arrays are re-made in buffers XLA owns (``owned``), and a background
save copies the state on its device first (``device_copy``). Each of these was a
measured peak (the figures are beside them); ``Checkpoints`` (checkpointing.py)
composes them.
"""

from __future__ import annotations

from typing import Any

# Bytes of the state Orbax may have copied at once while saving. Its default, 96 GB,
# copies the whole state first: measured on the default run, the save then raised the
# process's resident memory by 0.8-1.3 GB (its peak); 256 MB in flight holds that to
# about 0.25 GB at the same speed. An array larger than this is let through whole.
# The default of ``Checkpoints(in_flight=...)``: a caller that wants another passes it.
SAVE_IN_FLIGHT = 256 * 2**20


def in_flight_limit(state: Any, floor: int = SAVE_IN_FLIGHT) -> int:
    """``floor``, raised to the state's largest array (plus 1 MiB) when that is above
    it: Orbax refuses to read or write an array larger than its limit ("Requested
    more bytes than we reserved space for"), which on a restore would set a sound
    checkpoint aside as damaged."""
    import jax

    return max([floor, *(getattr(x, "nbytes", 0) + 2**20 for x in jax.tree.leaves(state))])


def free(tree: Any, keep: Any) -> None:
    """Delete the device buffers of ``tree``'s arrays, but those also in ``keep``."""
    import jax

    held = {id(x) for x in jax.tree.leaves(keep)}
    for x in jax.tree.leaves(tree):
        if isinstance(x, jax.Array) and id(x) not in held and not x.is_deleted():
            x.delete()


def owned(tree: Any) -> Any:
    """``tree`` with each restored array replaced by a copy XLA allocated, one array
    at a time (each source freed before the next copy: at most one array more).

    On the CPU a restored array wraps the host buffer TensorStore read it into; the
    first step over such weights (the sampler's compile and first decode) peaked about
    1 GiB above a fresh run's on the default model with the same live arrays: whole
    runs 4.88 vs 3.86 GiB; over XLA's own copies 3.94 vs 3.85
    (bench/bench_resume_memory.py)."""
    import jax
    import jax.numpy as jnp

    leaves, treedef = jax.tree.flatten(tree)
    for i, x in enumerate(leaves):
        if isinstance(x, jax.Array):
            leaves[i] = jnp.array(x, copy=True)
            x.delete()
    return jax.tree.unflatten(treedef, leaves)


def device_copy(x: Any) -> Any:
    """A copy of ``x`` in its own device buffer, where it is (a background save's): a
    transfer, not a compiled program, so a save after the first step is no late
    compile (``compiles.CompileWatch``)."""
    import jax

    if not isinstance(x, jax.Array):
        return x
    return jax.device_put(x, x.sharding, may_alias=False)
