"""The generator's own copies of the policy, pushed by the learner version by version.

A pipelined run (``rollout.placement=split`` or ``rollout.max_staleness`` >= 1)
samples from weights the learner does not touch: the update donates its state, so
even colocated the generator reads a copy. ``push`` makes it, on the generator's
devices (a transfer between meshes, resharded to one whole copy per generator
device) or, colocated, where the weights are; ``use`` loads the version a step asks
for into the generator's sampler and lets the older ones go.

Within one process this is JAX's own device-to-device transfer (``jax.device_put``).
Across pods (a split cluster run) the transfer would be a collective or the run
store; that is not built yet (docs/async.md).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from rlctl.core.trainer.rollout.placement import Placement


@dataclass(frozen=True)
class Push:
    """One version's weights copied for the generator: its bytes and seconds."""

    version: int
    bytes: int
    seconds: float


class Generator:
    """Versions of the policy on the generator's devices, and the sampler reading them."""

    def __init__(self, sampler: Any, placement: Placement) -> None:
        from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

        self.sampler = sampler  # rlctl's JAX sampler (sampler.Sampler), its own instance
        self.placement = placement
        self.lock = threading.Lock()
        self.versions: dict[int, Any] = {}
        self.graphdef: Any = None
        self.target: Any = None  # colocated: each array where the learner keeps it
        if placement.split:
            devices = placement.generator
            self.target = (
                SingleDeviceSharding(devices[0])
                if len(devices) == 1
                else NamedSharding(Mesh(list(devices), ("generator",)), PartitionSpec())
            )

    def push(self, version: int, model: Any) -> Push:
        """A copy of ``model``'s weights as version ``version``, on the generator's
        devices, complete when this returns (the next update may donate the source)."""
        import jax
        from flax import nnx

        from rlctl.core.trainer.checkpoint.checkpoint_memory import device_copy

        t0 = time.perf_counter()
        graphdef, state = nnx.split(model)
        if self.target is None:  # a copy where each array is: the update donates it
            copies = jax.tree.map(device_copy, state)
        else:
            copies = jax.device_put(state, self.target, may_alias=False)
        jax.block_until_ready(copies)
        seconds = time.perf_counter() - t0
        with self.lock:
            self.graphdef = graphdef
            self.versions[version] = copies
        # the bytes of one whole copy: what crossed to each generator device when split
        size = sum(int(getattr(x, "nbytes", 0)) for x in jax.tree.leaves(copies))
        return Push(version, size, seconds)

    def use(self, version: int) -> None:
        """The sampler reads version ``version`` (pushed before); older ones are freed."""
        with self.lock:
            state = self.versions[version]
            for old in [v for v in self.versions if v < version]:
                del self.versions[old]
            graphdef = self.graphdef
        self.sampler.load(graphdef, state)
