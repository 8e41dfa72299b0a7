"""The accelerator shape a workload asks for, as plain typed data.

The GCP accelerator catalog (infra branch) knows machine types, topologies and
chips per host; workload templates only need this small view of it, so a
``SliceShape`` can be filled from the catalog or written by hand in tests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rlctl.core.config import kinds

if TYPE_CHECKING:  # pragma: no cover
    from rlctl.core.config.catalog import Accelerator


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
    topology: str | None = Field(default=None, description="TPU topology, e.g. 4x4; None for GPUs.")
    hosts_per_slice: int = Field(ge=1)
    chips_per_host: int = Field(ge=1)
    num_slices: int = Field(default=1, ge=1)
    threads_per_core: int | None = Field(
        None,
        ge=0,
        le=2,
        description="Of the hosts' node pool; 1 halves the vCPUs a host "
        "has (rlctl's TPU pools), None or 0 = the machine type's default (2).",
    )

    @model_validator(mode="after")
    def _tpu_has_topology(self) -> SliceShape:
        if self.strategy.needs_topology and not self.topology:
            raise ValueError("a TPU slice shape needs a topology (e.g. 4x4)")
        return self

    @property
    def strategy(self) -> kinds.AcceleratorKind:
        """Everything that differs between TPU and GPU, for this shape's kind."""
        return kinds.of(self.kind)

    @property
    def resource(self) -> str:
        return self.strategy.resource

    @property
    def count(self) -> int:
        """What ``-a "TYPE xN"`` set: slices (TPU) or machines (GPU)."""
        return int(getattr(self, self.strategy.count_field))

    def with_count(self, count: int) -> SliceShape:
        return self.model_copy(update={self.strategy.count_field: count})

    @property
    def node_selector(self) -> dict[str, str]:
        return self.strategy.selector(self.accelerator, self.topology)

    @property
    def total_hosts(self) -> int:
        return self.hosts_per_slice * self.num_slices

    @property
    def megascale(self) -> bool:
        """Several slices of a libtpu kind joined over DCN: what the megascale variables
        and port are for (one slice is one ICI domain, with nothing to join)."""
        return self.strategy.libtpu and self.num_slices > 1


def slice_shape(acc: Accelerator, count: int, threads_per_core: int | None = -1) -> SliceShape:
    """The shape of ``count`` slices (TPU) or machines (GPU) of a catalog accelerator.

    ``threads_per_core``: of the pools that hold it, as GKE reports them; -1 = as
    ``rlctl cluster create`` makes them (one thread per core on v6e hosts).
    """
    kind = acc.strategy
    if threads_per_core == -1:
        threads_per_core = kind.threads(acc)
    return SliceShape(
        kind=acc.kind,
        machine_type=acc.machine_type,
        threads_per_core=threads_per_core,
        **kind.shape_fields(acc, count),
    )
