"""Which devices generate and which learn (``rollout.placement``).

Colocated, the rollout samples on the learner's devices between its updates (every
run before issue 54). Split, as Tunix's ``RLCluster`` gives each role its own mesh and
MaxText RL gives its sampler a fraction of the devices, the generator holds a copy of
the weights on devices of its own and the learner keeps the rest; weights move from
one to the other by version (``generator.Generator.push``).

``share`` is pure (a plan or a test reads it without devices); ``place`` applies it
to this process's devices.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, MutableMapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rlctl.core.config.models import RolloutSpec
from rlctl.core.errors import ConfigError

# the CPU's stand-in for a second device (tests, a laptop trying a split run)
HOST_DEVICES_FLAG = "--xla_force_host_platform_device_count"


def share(devices: int, asked: float) -> tuple[int, int]:
    """(learner's, generator's) device counts of ``devices`` for ``rollout.devices``
    ``asked``: a count (>= 1) or a fraction of them (< 1, rounded, at least one)."""
    if devices < 2:
        raise ConfigError(
            f"rollout.placement=split needs at least 2 devices; this run has {devices}",
            hint="set rollout.placement=colocated (rollout.max_staleness works there too), "
            f"or on a CPU give the process two: XLA_FLAGS={HOST_DEVICES_FLAG}=2",
        )
    generator = int(asked) if asked >= 1 else max(1, round(devices * asked))
    if generator >= devices:
        raise ConfigError(
            f"rollout.devices={asked:g} leaves the learner no device of the run's {devices}",
            hint=f"set rollout.devices to at most {devices - 1} (or a fraction such as 0.5)",
        )
    return devices - generator, generator


@dataclass(frozen=True)
class Placement:
    """The learner's devices, and the generator's (the same ones when colocated)."""

    learner: tuple[Any, ...]
    generator: tuple[Any, ...]
    split: bool
    process: bool = False  # the generator is a process of its own (rollout.placement)

    def describe(self) -> str:
        if self.process:
            return (
                f"process: generator in a process of its own, learner on {_devices(self.learner)}"
            )
        if not self.split:
            return f"colocated: generator and learner share {_devices(self.learner)}"
        return (
            f"split: generator on {_devices(self.generator)}, learner on {_devices(self.learner)}"
        )


def place(spec: RolloutSpec, devices: Sequence[Any], multi_process: bool) -> Placement:
    """``spec``'s placement over this process's ``devices``: the learner first, the
    generator on the last ones (a host's devices in order, so each role's are
    neighbours on its interconnect)."""
    devices = tuple(devices)
    if spec.placement == "colocated":
        return Placement(devices, devices, split=False)
    if spec.placement == "process":  # the generator's devices are its own process's
        if multi_process:  # every learner process would ask for each step
            raise ConfigError(
                "rollout.placement=process needs a learner of one process for now; "
                "this run's learner has several",
                hint="one learner host (a cluster of two: one learns, one generates), "
                "or rollout.placement=colocated (docs/async.md)",
            )
        return Placement(devices, (), split=False, process=True)
    if multi_process:
        raise ConfigError(
            "rollout.placement=split runs in one process for now; this run has several",
            hint="set rollout.placement=colocated for a multi-host run "
            "(docs/async.md says what a split cluster run lacks)",
        )
    learner, _ = share(len(devices), spec.devices)
    return Placement(devices[:learner], devices[learner:], split=True)


def _devices(devices: Sequence[Any]) -> str:
    kinds = sorted({getattr(d, "platform", "device") for d in devices})
    ids = ",".join(str(getattr(d, "id", "?")) for d in devices)
    return f"{len(devices)} {'/'.join(kinds)} device{'s' if len(devices) != 1 else ''} [{ids}]"


def give_host_devices(spec: RolloutSpec, env: MutableMapping[str, str]) -> bool:
    """On a CPU, a split run's devices: ``env``'s ``XLA_FLAGS`` gains the host device
    count the split needs (the learner's one and the generator's), unless it names one
    already. Read when JAX's CPU backend starts, so called before anything asks JAX
    for its devices; the flag touches the host platform only (a GPU or TPU run's
    accelerators are unchanged). Returns whether it added the flag."""
    flags = env.get("XLA_FLAGS", "")
    if spec.placement != "split" or HOST_DEVICES_FLAG in flags:
        return False
    count = 1 + (int(spec.devices) if spec.devices >= 1 else 1)
    env["XLA_FLAGS"] = f"{flags} {HOST_DEVICES_FLAG}={count}".strip()
    return True


@contextmanager
def host_devices(spec: RolloutSpec) -> Iterator[None]:
    """``give_host_devices`` on this process's environment for as long as the JAX
    backends take to start in it, then the environment as it was: the processes this
    one starts later (the fit check's, a test's next run) inherit no device count."""
    before = os.environ.get("XLA_FLAGS")
    added = give_host_devices(spec, os.environ)
    try:
        yield
    finally:
        if added:
            if before is None:
                os.environ.pop("XLA_FLAGS", None)
            else:
                os.environ["XLA_FLAGS"] = before
