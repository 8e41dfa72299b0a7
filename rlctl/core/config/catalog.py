"""The accelerator catalog: slice names as users say them -> GKE node pool shapes.

The data lives in ``rlctl/data/accelerators.yaml``; this module only loads it and
answers questions about it. Pure: no Google Cloud calls.
"""

from __future__ import annotations

import difflib
import re
from functools import lru_cache
from importlib import resources
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict

from rlctl.core.config import kinds
from rlctl.core.errors import ConfigError


class TpuCompileFacts(BaseModel):
    """A TPU generation as libtpu compiles for it without one (accelerators.yaml's
    ``compile``): its name in a topology, chip configuration, JAX devices per chip and
    each chip's HBM."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    libtpu_name: str
    chip_config: str = "default"
    devices_per_chip: int = 1
    hbm_gib: float


class Accelerator(BaseModel):
    """One accelerator slice type (TPU) or GPU machine type."""

    model_config = ConfigDict(frozen=True)

    name: str
    kind: Literal["tpu", "gpu"]
    machine_type: str
    # TPU fields
    family: str | None = None
    gke_accelerator: str | None = None
    chips_per_host: int = 0
    hosts: int = 1
    topology: str | None = None
    # how the fit check compiles for its generation (TPU; ``compile_targets``)
    compile: TpuCompileFacts | None = None
    # GPU fields
    gpu_type: str | None = None
    gpus: int = 0
    compile_target: str | None = None  # rlctl/data/gpu_targets/<name>.txtpb (None: none)

    @property
    def strategy(self) -> kinds.AcceleratorKind:
        """Everything that differs between TPU and GPU, for this one's kind."""
        return kinds.of(self.kind)

    @property
    def chips(self) -> int:
        """Chips in one slice (TPU) or GPUs in one machine."""
        return self.strategy.chips(self)

    @property
    def multi_host(self) -> bool:
        return self.strategy.multi_host(self)


@lru_cache(maxsize=1)
def _raw() -> dict:
    return yaml.safe_load(resources.files("rlctl").joinpath("data/accelerators.yaml").read_text())


@lru_cache(maxsize=1)
def _load() -> dict[str, Accelerator]:
    raw = _raw()
    out: dict[str, Accelerator] = {}
    for family, fam in raw["tpu"].items():
        for name, t in fam["types"].items():
            out[name] = Accelerator(  # libtpu_flags: see libtpu_flags()
                name=name,
                kind="tpu",
                family=family,
                gke_accelerator=fam["gke_accelerator"],
                compile=fam.get("compile"),
                **t,
            )
    for name, g in raw["gpu"].items():
        out[name] = Accelerator(name=name, kind="gpu", machine_type=name, **g)
    return out


def all_types() -> list[Accelerator]:
    return list(_load().values())


def cores_per_chip(family: str) -> int:
    return int(_raw()["tpu"][family]["cores_per_chip"])


def lookup(name: str) -> Accelerator:
    """The catalog entry for ``name``; unknown names suggest the closest valid ones."""
    key = name.strip().lower()
    cat = _load()
    if key in cat:
        return cat[key]
    close = difflib.get_close_matches(key, list(cat), n=3, cutoff=0.5)
    if not close:  # same family prefix, e.g. "v6e-3" -> the v6e sizes
        prefix = re.split(r"[-]", key)[0]
        close = [n for n in cat if n.startswith(prefix + "-")][:3]
    hint = (
        f"did you mean {', '.join(close)}?"
        if close
        else "valid names look like v6e-16, v5p-128, v5litepod-16, tpu7x-128, a3-highgpu-8g"
    )
    raise ConfigError(f"unknown accelerator type {name!r}", hint=hint)


# --- machine types: what GKE keeps back of a node ---------------------------------------
# GKE keeps back, of a node's memory, 25% of the first 4 GiB, 20% of the next 4, 10% of
# the next 8, 6% of the next 112 and 2% of the rest, plus a 100 MiB eviction threshold;
# of its CPU, 6% of the first core, 1% of the next, 0.5% of the next 2 and 0.25% of the
# rest (GKE docs, "Plan GKE Standard node sizes"; the cluster autoscaler's predictor,
# kubernetes/autoscaler cluster-autoscaler/cloudprovider/gce/reserved.go, computes the
# same). Both as (upper bound, fraction). What a pod may ask of a node, after threads per
# core and GKE's DaemonSets, is ``rlctl.core.config.nodes``.
_MEMORY_RESERVED = ((4, 0.25), (8, 0.20), (16, 0.10), (128, 0.06), (float("inf"), 0.02))
_CPU_RESERVED = ((1, 0.06), (2, 0.01), (4, 0.005), (float("inf"), 0.0025))
_EVICTION_GIB = 100 / 1024


class Machine(BaseModel):
    """A Compute Engine machine type as its documentation lists it (two threads per core).

    ``memory_gib``: what Compute Engine calls GB of machine memory, which are GiB (its
    API's ``memoryMb`` counts MiB: 131072 for n2-standard-32's "128 GB")."""

    model_config = ConfigDict(frozen=True)

    name: str
    vcpus: int
    memory_gib: float


def _tiered(total: float, tiers: tuple[tuple[float, float], ...]) -> float:
    kept, low = 0.0, 0.0
    for high, frac in tiers:
        if total > low:
            kept += (min(total, high) - low) * frac
        low = high
    return kept


@lru_cache(maxsize=1)
def _machines() -> dict[str, Machine]:
    return {n: Machine(name=n, **m) for n, m in (_raw().get("machines") or {}).items()}


def machine(name: str) -> Machine | None:
    return _machines().get(name)


def allocatable(m: Machine) -> tuple[float, float]:
    """(vCPUs, GiB) GKE leaves allocatable to pods on a node with ``m``'s vCPUs and memory."""
    cpu = m.vcpus - _tiered(m.vcpus, _CPU_RESERVED)
    mem = m.memory_gib - _tiered(m.memory_gib, _MEMORY_RESERVED) - _EVICTION_GIB
    return cpu, mem


def libtpu_flags(gke_accelerator: str) -> list[str]:
    """The XLA flags of a TPU generation (by its GKE label) that its hosts pass libtpu."""
    for fam in _raw()["tpu"].values():
        if fam["gke_accelerator"] == gke_accelerator:
            return list(fam.get("libtpu_flags") or [])
    return []


def multislice_refusal(acc: Accelerator, count: int) -> str | None:
    """Why ``count`` slices of ``acc`` cannot run as one job, or None.

    GKE's Multislice joins multi-host slices only ("Multislice only supports multi-host
    TPU slice node pools", cloud.google.com/tpu/docs/tpu-gke-multislice): its webhook
    injects TPU_WORKER_HOSTNAMES and the megascale coordinates only into jobs of more than
    one pod, so single-host slices (v6e-8, v5litepod-4, v4-8, ...) never join each other.
    """
    if not acc.strategy.multislice_needs_multi_host or acc.multi_host or count <= 1:
        return None
    bigger = next(
        (
            a.name
            for a in sorted(_load().values(), key=lambda a: a.chips)
            if a.family == acc.family and a.multi_host and a.chips >= acc.chips * count
        ),
        None,
    )
    alt = f" or one {bigger} slice" if bigger else ""
    return (
        f"{count} slices of {acc.name} cannot train as one job: a {acc.name} slice is a "
        f"single host, and GKE's Multislice joins multi-host slices only; use one "
        f"{acc.name}{alt}"
    )


_SLICES = re.compile(r"^\s*(?P<name>[A-Za-z0-9-]+)\s*(?:\s[xX*]\s*(?P<n>\d+))?\s*$")


def parse_slices(text: str) -> tuple[str, int]:
    """``"v6e-16 x2"`` -> ("v6e-16", 2); ``"v6e-16"`` -> ("v6e-16", 1)."""
    m = _SLICES.match(text)
    if not m:
        raise ConfigError(
            f"cannot read accelerator {text!r}",
            hint="write it as TYPE or 'TYPE xN', e.g. 'v6e-16 x2'",
        )
    n = int(m.group("n") or 1)
    if n < 1:
        raise ConfigError(f"accelerator {text!r}: the count must be at least 1")
    return m.group("name").lower(), n
