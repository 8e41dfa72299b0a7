"""Accelerator kinds (TPU, GPU): one strategy each, for everything that differs.

A TPU is bought as slices (one node pool per slice, a fixed topology, chips per host,
one thread per core in rlctl's pools); a GPU as machines (one pool of ``count``
machines, GPUs per machine, resized in place). Every place that used to branch on
``kind == "tpu"`` asks the kind's strategy instead: how many chips an accelerator
has, its node labels (the pods' node selector), extended resource and taint, the
shape of ``count`` of it, its node pool's body, its price key, and what a count means.
``of(kind)`` resolves a catalog kind once; ``Accelerator.strategy`` and
``SliceShape.strategy`` do it for their own kind.

Pure data and arithmetic: no imports from the rest of the config package (the
catalog imports this), so accelerators are typed by the fields used (``Slice``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Protocol

# rlctl's v6e node pools run one thread per core (`gcloud container node-pools create
# ... --threads-per-core=1`), which halves the vCPUs a host reports. Only v6e: that is
# where seed 001 sets it; on the other TPU generations whether GKE accepts it is
# unverified, so their pools keep the machine's default (issue 55 point 3).
TPU_THREADS_PER_CORE = 1
ONE_THREAD_PER_CORE_FAMILIES = frozenset({"v6e"})
TPU_ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TPU_TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
GPU_ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
TPU_RESOURCE = "google.com/tpu"
GPU_RESOURCE = "nvidia.com/gpu"


class Slice(Protocol):
    """The catalog fields a strategy reads (``catalog.Accelerator`` has them all)."""

    @property
    def machine_type(self) -> str: ...
    @property
    def family(self) -> str | None: ...
    @property
    def gke_accelerator(self) -> str | None: ...
    @property
    def chips_per_host(self) -> int: ...
    @property
    def hosts(self) -> int: ...
    @property
    def topology(self) -> str | None: ...
    @property
    def gpu_type(self) -> str | None: ...
    @property
    def gpus(self) -> int: ...


class AcceleratorKind(ABC):
    """What differs between accelerator kinds; one instance per kind (``KINDS``)."""

    name: str  # the catalog's kind, also the image flavour (rlctl-<name>, Dockerfile.<name>.j2)
    resource: str  # the extended resource its pods request
    unit: str  # what its count of chips is called: "chips", "GPUs"
    count_word: str  # what ``-a "TYPE xN"`` counts: "slice", "machine"
    count_field: str  # the SliceShape field N sets: num_slices, hosts_per_slice
    api: str | None = None  # the Google API its capacity needs besides Compute's
    libtpu: bool = False  # its pods run libtpu (its init args, XLA flags)
    needs_topology: bool = False  # its shape names a topology (4x4)
    # several of it join one job only when each is multi-host (GKE Multislice)
    multislice_needs_multi_host: bool = False
    resizable: bool = False  # its pools are resized in place (not a fixed slice)

    def threads(self, acc: Slice) -> int | None:
        """Threads per core of the pools rlctl makes for ``acc`` (None: the machine's
        default)."""
        return None

    @abstractmethod
    def chips(self, acc: Slice) -> int:
        """Chips in one slice (TPU) or GPUs in one machine."""

    @abstractmethod
    def multi_host(self, acc: Slice) -> bool: ...

    @abstractmethod
    def node_labels(self, acc: Slice) -> dict[str, str]:
        """The accelerator labels GKE puts on its nodes."""

    @abstractmethod
    def per_node(self, acc: Slice) -> int:
        """Its extended resource on one node."""

    @abstractmethod
    def selector(self, accelerator: str, topology: str | None) -> dict[str, str]:
        """The node selector of a pod on it (``accelerator``: GKE's label value)."""

    @abstractmethod
    def shape_fields(self, acc: Slice, count: int) -> dict[str, Any]:
        """SliceShape's fields for ``count`` of it (without threads_per_core)."""

    @abstractmethod
    def pool_sizes(self, acc: Slice, count: int) -> list[int]:
        """Nodes of each pool ``cluster create`` makes for ``count`` of it."""

    @abstractmethod
    def count_from_pools(self, pools: int, nodes: int) -> int:
        """``count`` back from a cluster's pools of it (and their nodes)."""

    @abstractmethod
    def pool_config(self, acc: Slice) -> dict[str, Any]:
        """Its part of a GKE node pool's ``config``."""

    @abstractmethod
    def pool_extras(self, acc: Slice) -> dict[str, Any]:
        """Its part of a GKE node pool's body besides ``config``."""

    @abstractmethod
    def plan_fields(self, acc: Slice) -> dict[str, Any]:
        """What a plan shows of a pool of it."""

    @abstractmethod
    def price_key(self, acc: Slice) -> tuple[str, str, int]:
        """(prices table, key, units per node) its hourly price is read from."""

    @abstractmethod
    def quota_key(self, acc: Slice) -> str:
        """What its Compute Engine quota metric is looked up by (gcp/preflight.py)."""

    @abstractmethod
    def matches(self, acc: Slice, topology: str | None) -> bool:
        """Whether a node pool of its machine type and ``topology`` label is ``acc``."""


class Tpu(AcceleratorKind):
    name = "tpu"
    resource = TPU_RESOURCE
    unit = "chips"
    count_word = "slice"
    count_field = "num_slices"
    api = "tpu.googleapis.com"
    libtpu = True
    needs_topology = True
    multislice_needs_multi_host = True

    def threads(self, acc: Slice) -> int | None:
        return TPU_THREADS_PER_CORE if acc.family in ONE_THREAD_PER_CORE_FAMILIES else None

    def chips(self, acc: Slice) -> int:
        return acc.chips_per_host * acc.hosts

    def multi_host(self, acc: Slice) -> bool:
        return acc.hosts > 1

    def node_labels(self, acc: Slice) -> dict[str, str]:
        return {
            TPU_ACCELERATOR_LABEL: acc.gke_accelerator or "",
            TPU_TOPOLOGY_LABEL: acc.topology or "",
        }

    def per_node(self, acc: Slice) -> int:
        return acc.chips_per_host

    def selector(self, accelerator: str, topology: str | None) -> dict[str, str]:
        assert topology is not None
        return {TPU_ACCELERATOR_LABEL: accelerator, TPU_TOPOLOGY_LABEL: topology}

    def shape_fields(self, acc: Slice, count: int) -> dict[str, Any]:
        return {
            "accelerator": acc.gke_accelerator or "",
            "topology": acc.topology,
            "hosts_per_slice": acc.hosts,
            "chips_per_host": acc.chips_per_host,
            "num_slices": count,
        }

    def pool_sizes(self, acc: Slice, count: int) -> list[int]:
        return [acc.hosts] * count  # one pool per slice

    def count_from_pools(self, pools: int, nodes: int) -> int:
        return pools

    def pool_config(self, acc: Slice) -> dict[str, Any]:
        threads = self.threads(acc)
        return {"advanced_machine_features": {"threads_per_core": threads}} if threads else {}

    def pool_extras(self, acc: Slice) -> dict[str, Any]:
        if not self.multi_host(acc):
            return {}
        return {"placement_policy": {"type_": "COMPACT", "tpu_topology": acc.topology}}

    def plan_fields(self, acc: Slice) -> dict[str, Any]:
        return {
            "topology": acc.topology,
            "chips": self.chips(acc),
            "threads_per_core": self.threads(acc),
        }

    def price_key(self, acc: Slice) -> tuple[str, str, int]:
        return "tpu_chip_hour", acc.family or "", acc.chips_per_host

    def quota_key(self, acc: Slice) -> str:
        return acc.family or ""

    def matches(self, acc: Slice, topology: str | None) -> bool:
        return acc.topology == topology if topology else acc.hosts == 1


class Gpu(AcceleratorKind):
    name = "gpu"
    resource = GPU_RESOURCE
    unit = "GPUs"
    count_word = "machine"
    count_field = "hosts_per_slice"
    resizable = True

    def chips(self, acc: Slice) -> int:
        return acc.gpus

    def multi_host(self, acc: Slice) -> bool:
        return False

    def node_labels(self, acc: Slice) -> dict[str, str]:
        return {GPU_ACCELERATOR_LABEL: acc.gpu_type or ""}

    def per_node(self, acc: Slice) -> int:
        return acc.gpus

    def selector(self, accelerator: str, topology: str | None) -> dict[str, str]:
        return {GPU_ACCELERATOR_LABEL: accelerator}

    def shape_fields(self, acc: Slice, count: int) -> dict[str, Any]:
        return {
            "accelerator": acc.gpu_type or "",
            "hosts_per_slice": count,
            "chips_per_host": acc.gpus,
        }

    def pool_sizes(self, acc: Slice, count: int) -> list[int]:
        return [count]  # one pool of ``count`` machines

    def count_from_pools(self, pools: int, nodes: int) -> int:
        return max(nodes, 1)

    def pool_config(self, acc: Slice) -> dict[str, Any]:
        return {
            "accelerators": [
                {
                    "accelerator_count": acc.gpus,
                    "accelerator_type": acc.gpu_type,
                    "gpu_driver_installation_config": {"gpu_driver_version": "LATEST"},
                }
            ]
        }

    def pool_extras(self, acc: Slice) -> dict[str, Any]:
        return {}

    def plan_fields(self, acc: Slice) -> dict[str, Any]:
        return {"gpus": f"{acc.gpus} x {acc.gpu_type}"}

    def price_key(self, acc: Slice) -> tuple[str, str, int]:
        return "machine_hour", acc.machine_type, 1

    def quota_key(self, acc: Slice) -> str:
        return acc.gpu_type or ""

    def matches(self, acc: Slice, topology: str | None) -> bool:
        return True


KINDS: dict[str, AcceleratorKind] = {k.name: k for k in (Tpu(), Gpu())}


def of(kind: str) -> AcceleratorKind:
    """The strategy of a catalog kind ("tpu", "gpu")."""
    return KINDS[kind]
