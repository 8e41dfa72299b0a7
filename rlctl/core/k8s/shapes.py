"""The accelerator shape a workload asks for, as plain typed data.

The GCP accelerator catalog (infra branch) knows machine types, topologies and
chips per host; workload templates only need this small view of it, so a
``SliceShape`` can be filled from the catalog or written by hand in tests.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SliceShape(BaseModel):
    """``num_slices`` identical slices of ``hosts_per_slice`` nodes with
    ``chips_per_host`` accelerators each (a GPU "slice" is a group of nodes)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["tpu", "gpu"] = "tpu"
    accelerator: str = Field(
        description="Node label value: cloud.google.com/gke-tpu-accelerator (tpu-v6e-slice) "
        "or cloud.google.com/gke-accelerator (nvidia-h100-80gb)."
    )
    machine_type: str = Field(description="GCE machine type, e.g. ct6e-standard-4t.")
    topology: str | None = Field(None, description="TPU topology, e.g. 4x4; None for GPUs.")
    hosts_per_slice: int = Field(ge=1)
    chips_per_host: int = Field(ge=1)
    num_slices: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _tpu_has_topology(self) -> SliceShape:
        if self.kind == "tpu" and not self.topology:
            raise ValueError("a TPU slice shape needs a topology (e.g. 4x4)")
        return self

    @property
    def resource(self) -> str:
        return "google.com/tpu" if self.kind == "tpu" else "nvidia.com/gpu"

    @property
    def node_selector(self) -> dict[str, str]:
        if self.kind == "tpu":
            assert self.topology is not None
            return {
                "cloud.google.com/gke-tpu-accelerator": self.accelerator,
                "cloud.google.com/gke-tpu-topology": self.topology,
            }
        return {"cloud.google.com/gke-accelerator": self.accelerator}

    @property
    def total_hosts(self) -> int:
        return self.hosts_per_slice * self.num_slices


def v6e_16(num_slices: int = 1) -> SliceShape:
    """v6e-16: ct6e-standard-4t, topology 4x4, 4 hosts x 4 chips (DESIGN.md section 3)."""
    return SliceShape(kind="tpu", accelerator="tpu-v6e-slice", machine_type="ct6e-standard-4t",
                      topology="4x4", hosts_per_slice=4, chips_per_host=4,
                      num_slices=num_slices)


def h100_8(hosts: int = 1, num_slices: int = 1) -> SliceShape:
    """a3-highgpu-8g nodes with 8 H100s each."""
    return SliceShape(kind="gpu", accelerator="nvidia-h100-80gb", machine_type="a3-highgpu-8g",
                      hosts_per_slice=hosts, chips_per_host=8, num_slices=num_slices)
