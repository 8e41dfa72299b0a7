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

from rlctl.core.errors import ConfigError


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
    # GPU fields
    gpu_type: str | None = None
    gpus: int = 0

    @property
    def chips(self) -> int:
        """Chips in one slice (TPU) or GPUs in one machine."""
        return self.chips_per_host * self.hosts if self.kind == "tpu" else self.gpus

    @property
    def multi_host(self) -> bool:
        return self.kind == "tpu" and self.hosts > 1


@lru_cache(maxsize=1)
def _load() -> dict[str, Accelerator]:
    raw = yaml.safe_load(resources.files("rlctl").joinpath("data/accelerators.yaml").read_text())
    out: dict[str, Accelerator] = {}
    for family, fam in raw["tpu"].items():
        for name, t in fam["types"].items():
            out[name] = Accelerator(
                name=name, kind="tpu", family=family, gke_accelerator=fam["gke_accelerator"],
                **t,
            )
    for name, g in raw["gpu"].items():
        out[name] = Accelerator(name=name, kind="gpu", machine_type=name, **g)
    return out


def all_types() -> list[Accelerator]:
    return list(_load().values())


def cores_per_chip(family: str) -> int:
    raw = yaml.safe_load(resources.files("rlctl").joinpath("data/accelerators.yaml").read_text())
    return int(raw["tpu"][family]["cores_per_chip"])


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
        f"did you mean {', '.join(close)}?" if close
        else "valid names look like v6e-16, v5p-128, v5litepod-16, tpu7x-128, a3-highgpu-8g"
    )
    raise ConfigError(f"unknown accelerator type {name!r}", hint=hint)


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
