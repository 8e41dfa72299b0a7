"""What rlctl compiles for when the accelerator is not there: a catalog accelerator and
its count as the compile-only devices XLA needs.

XLA compiles for a TPU or a GPU on a machine with neither, and what it compiles is the
real executable with its real memory analysis (it cannot run). MaxText's
``train_compile.py`` checks a configuration for a v5e-256 that way before any TPU is
paid for; rlctl's fit check (``rlctl train --cluster C --dry-run``) does it inside the
submit path. This module is the pure half: which devices to ask JAX for, how many,
and how much memory each has. The trainer's ``runtime/targets.py`` turns a
``CompileTarget`` into devices (libtpu for a TPU, JAX's CUDA plugin with a device
description for a GPU).

Pure: reads package data only (``rlctl/data/gpu_targets/*.txtpb``, each naming the
XLA source it was taken from).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict

from rlctl.core.config.catalog import Accelerator
from rlctl.core.units import human_bytes

GIB = 2**30


class CompileTarget(BaseModel):
    """``count`` of a catalog accelerator, as compile-only devices: TPU slices from
    libtpu's topology description, GPU machines from a device description."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["tpu", "gpu"]
    label: str  # "v6e-16 x2", "a3-ultragpu-8g x2": as a plan names it
    devices: int  # JAX devices in all (each compiles its own shard of the program)
    device_memory: int  # bytes of one device's memory (a TPU chip's HBM / its devices)
    device_name: str  # "TPU v6e", "NVIDIA H200 141GB HBM3e"
    # TPU: libtpu's get_topology_desc arguments
    topology_name: str | None = None  # "v6e:4x4"
    chips_per_host_bounds: tuple[int, int, int] | None = None
    chip_config: str = "default"
    num_slices: int = 1
    # GPU: the device description (package data) and the machines of it
    gpu_target: str | None = None  # rlctl/data/gpu_targets/<gpu_target>.txtpb
    hosts: int = 1
    per_host: int = 1

    @property
    def memory_line(self) -> str:
        """``32 GiB per chip`` / ``141 GiB per GPU``, as the fit line says it."""
        unit = "chip" if self.kind == "tpu" else "GPU"
        return f"{human_bytes(self.device_memory)} per {unit}"

    @property
    def extra(self) -> str:
        """The pip extra that compiles for it (``rlctl[compile-tpu]``)."""
        return f"compile-{self.kind}"


def _host_bounds(chips_per_host: int) -> tuple[int, int, int]:
    """A host's chips as libtpu lays them out: 1 -> 1x1x1, 4 -> 2x2x1, 8 -> 2x4x1
    (MaxText's accelerator_to_spec_map, and GKE's ct6e-standard-8t)."""
    return {1: (1, 1, 1), 2: (1, 2, 1), 4: (2, 2, 1), 8: (2, 4, 1)}.get(
        chips_per_host, (chips_per_host, 1, 1)
    )


def compile_target(acc: Accelerator, count: int = 1) -> CompileTarget | None:
    """``count`` slices (TPU) or machines (GPU) of ``acc`` as compile-only devices;
    None where rlctl has no description of the accelerator (the L4)."""
    label = acc.name if count == 1 else f"{acc.name} x{count}"
    if acc.kind == "tpu":
        facts = acc.compile
        if facts is None or not acc.topology:
            return None
        per_chip = facts.devices_per_chip
        return CompileTarget(
            kind="tpu",
            label=label,
            devices=acc.chips_per_host * acc.hosts * per_chip * count,
            device_memory=int(facts.hbm_gib * GIB) // per_chip,
            device_name=f"TPU {acc.family}",
            topology_name=f"{facts.libtpu_name}:{acc.topology}",
            chips_per_host_bounds=_host_bounds(acc.chips_per_host),
            chip_config=facts.chip_config,
            num_slices=count,
        )
    if not acc.compile_target:
        return None
    text = gpu_target_text(acc.compile_target)
    return CompileTarget(
        kind="gpu",
        label=label,
        devices=acc.gpus * count,
        device_memory=_field_int(text, "device_memory_size"),
        device_name=_field_str(text, "device_description_str"),
        gpu_target=acc.compile_target,
        hosts=count,
        per_host=acc.gpus,
    )


@cache
def gpu_target_text(name: str) -> str:
    """The device description ``name`` (a ``GpuTargetConfigProto`` as text)."""
    return resources.files("rlctl").joinpath(f"data/gpu_targets/{name}.txtpb").read_text("utf-8")


def gpu_targets() -> list[str]:
    """Every device description rlctl ships."""
    folder = resources.files("rlctl").joinpath("data/gpu_targets")
    return sorted(
        p.name.removesuffix(".txtpb") for p in folder.iterdir() if p.name.endswith(".txtpb")
    )


def _field_int(text: str, key: str) -> int:
    m = re.search(rf"^\s*{key}:\s*(\d+)\s*$", text, re.M)
    if not m:
        raise ValueError(f"no {key} in a GPU target description")
    return int(m.group(1))


def _field_str(text: str, key: str) -> str:
    m = re.search(rf'^\s*{key}:\s*"([^"]*)"\s*$', text, re.M)
    if not m:
        raise ValueError(f"no {key} in a GPU target description")
    return m.group(1)
