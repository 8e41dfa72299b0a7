"""What workload backends need of a cluster, as data: CPU node pools, GKE add-ons.

A backend declares them (``Backend.node_pools``); ``cluster create`` makes them
(``gcp/pools.py``), the quota check counts them and the fit check places pods on them.
A plain dataclass: the backend registry is read for ``rlctl --help``, which stays instant.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

# the taint key of the pools a backend brings: only its pods tolerate it
POOL_TAINT_KEY = "rlctl.dev/pool"
NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"


@dataclass(frozen=True)
class PoolRequest:
    """A CPU node pool a backend's pods need beside the accelerator pools. Autoscaled
    from 0, so it costs nothing until a pod of that backend asks for it; tainted so that
    only those pods (which tolerate ``taint``) land on it."""

    name: str  # the pool's name, and the key that leaves it out: 'pools: {NAME: false}'
    machine_type: str
    purpose: str  # for people: "Pathways heads (--backend pathways)"
    max_nodes: int = 1
    tpu_only: bool = True  # made only beside TPU slices (its backend runs on TPUs only)
    # why its pods (and the backend's workers) reach the bucket as the nodes' service
    # account (the host network, outside Workload Identity); None: they do not
    bucket_via_nodes: str | None = None

    @property
    def taint(self) -> tuple[str, str]:
        """(key, value) of its NoSchedule taint (``config.nodes.Taint``)."""
        return POOL_TAINT_KEY, self.name

    @property
    def toleration(self) -> dict[str, str]:
        """The toleration a pod of it carries, as a pod spec writes it."""
        key, value = self.taint
        return {"key": key, "operator": "Equal", "value": value, "effect": "NoSchedule"}

    @property
    def selector(self) -> dict[str, str]:
        return {NODEPOOL_LABEL: self.name}


@dataclass(frozen=True)
class ClusterNeeds:
    """Everything the registered workload backends need of a cluster (``backends.
    cluster_needs``), which ``cluster create`` plans: their CPU pools and the GKE add-ons
    that serve their kinds (``addons_config`` field -> the add-on's name in gcloud, e.g.
    the Ray operator's ``ray_operator_config`` -> ``RayOperator``)."""

    pools: tuple[PoolRequest, ...] = ()
    addons: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
