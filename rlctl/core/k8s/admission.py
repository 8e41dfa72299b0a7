"""What the controllers and admission webhooks a run relies on make of its workload.

A JobSet, PathwaysJob or RayJob is not what the scheduler sees: controllers turn it
into pods, and webhooks change those pods on admission. This module spells out, as
pure functions over rendered manifests, the pods each workload becomes, so that
``fit.py`` can tell before anything is applied whether every pod has a node, and the
test fake (``tests/fakes/k8s.py``) can create the same pods a real cluster would.
Every behaviour names the upstream file and version it follows. What a JobSet,
PathwaysJob or RayJob becomes is its backend's (``backends/<name>/``: JobSet v0.12.0,
pathways-job v0.1.4, KubeRay v1.3-v1.7, each citing its sources); what every pod goes
through, whatever made it, is here:

- Kubernetes (``pkg/apis/core/v1/defaults.go``): a resource with a limit and no request
  is requested at its limit. A pod's request is its containers' plus its native
  sidecars' (``restartPolicy: Always`` init containers), or its largest other init
  container, whichever is more (KEP-753).
- GKE's GCS FUSE CSI webhook (GKE docs, "Configure resources for the sidecar
  container"): a pod annotated ``gke-gcsfuse/volumes: "true"`` gets the
  ``gke-gcsfuse-sidecar`` native sidecar, requesting cpu 250m, memory 256Mi and
  ephemeral storage 5Gi unless ``gke-gcsfuse/{cpu,memory}-request`` say otherwise.
- GKE's ExtendedResourceToleration admission plugin (GKE docs, "About GPUs" and "About
  TPUs in GKE"): a pod that requests ``nvidia.com/gpu`` or ``google.com/tpu`` tolerates
  the matching ``NoSchedule`` taint of accelerator nodes.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rlctl.core.config.nodes import GCSFUSE_SIDECAR
from rlctl.core.units import quantity

GCSFUSE_ANNOTATION = "gke-gcsfuse/volumes"
EXTENDED = ("google.com/tpu", "nvidia.com/gpu")


class Requests(BaseModel):
    """What a pod asks the scheduler for: cores, bytes, and extended resources."""

    model_config = ConfigDict(frozen=True)

    cpu: float = 0.0
    memory: float = 0.0
    extended: dict[str, int] = Field(default_factory=dict)

    def __add__(self, other: Requests) -> Requests:
        ext = dict(self.extended)
        for k, n in other.extended.items():
            ext[k] = ext.get(k, 0) + n
        return Requests(cpu=self.cpu + other.cpu, memory=self.memory + other.memory, extended=ext)

    def at_least(self, other: Requests) -> Requests:
        keys = set(self.extended) | set(other.extended)
        return Requests(
            cpu=max(self.cpu, other.cpu),
            memory=max(self.memory, other.memory),
            extended={k: max(self.extended.get(k, 0), other.extended.get(k, 0)) for k in keys},
        )


class PodGroup(BaseModel):
    """``jobs`` x ``pods`` identical pods of one workload, as the scheduler will see them.

    ``pinned``: every pod of one job lands in the topology domain (of this node label)
    of its first pod, and no two jobs of the group share a domain (JobSet's exclusive
    placement); None: each pod is placed on its own.
    """

    model_config = ConfigDict(frozen=True)

    name: str  # 'JobSet rl, replicated job slice'
    role: str  # what the pods are: 'trainer', 'pathways-head', 'ray-head', ...
    jobs: int = 1
    pods: int = 1  # per job
    requests: Requests
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    pinned: str | None = None
    host_network: bool = False
    service_account: str | None = None
    pod: dict[str, Any] = Field(default_factory=dict, description="the pod spec as admitted")

    @property
    def total(self) -> int:
        return self.jobs * self.pods


# --- pod specs ---------------------------------------------------------------------------
def _container_requests(c: dict[str, Any]) -> Requests:
    res = c.get("resources") or {}
    req = {**(res.get("limits") or {}), **(res.get("requests") or {})}  # limit -> request
    return Requests(
        cpu=quantity(req["cpu"]) if "cpu" in req else 0.0,
        memory=quantity(req["memory"]) if "memory" in req else 0.0,
        extended={k: int(quantity(req[k])) for k in EXTENDED if k in req},
    )


def pod_requests(spec: dict[str, Any]) -> Requests:
    """The pod's effective request (KEP-753: containers + native sidecars, or the largest
    plain init container)."""
    total = Requests()
    for c in spec.get("containers") or []:
        total = total + _container_requests(c)
    peak_init = Requests()
    for c in spec.get("initContainers") or []:
        if c.get("restartPolicy") == "Always":
            total = total + _container_requests(c)
        else:
            peak_init = peak_init.at_least(_container_requests(c))
    return total.at_least(peak_init)


def _gcsfuse(meta: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """GKE's GCS FUSE webhook: the sidecar it injects into an annotated pod."""
    ann = meta.get("annotations") or {}
    if str(ann.get(GCSFUSE_ANNOTATION, "")).lower() != "true":
        return spec
    req = {
        "cpu": ann.get("gke-gcsfuse/cpu-request", GCSFUSE_SIDECAR["cpu"]),
        "memory": ann.get("gke-gcsfuse/memory-request", GCSFUSE_SIDECAR["memory"]),
    }
    sidecar = {
        "name": "gke-gcsfuse-sidecar",
        "restartPolicy": "Always",
        "resources": {"requests": req},
    }
    return {**spec, "initContainers": [sidecar, *(spec.get("initContainers") or [])]}


def _tolerations(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod's tolerations plus those ExtendedResourceToleration adds on GKE."""
    out = list(spec.get("tolerations") or [])
    asked = pod_requests(spec).extended
    for key in EXTENDED:
        if asked.get(key):
            out.append({"key": key, "operator": "Exists", "effect": "NoSchedule"})
    return out


def group(
    name: str,
    role: str,
    meta: dict[str, Any],
    spec: dict[str, Any],
    jobs: int = 1,
    pods: int = 1,
    pinned: str | None = None,
) -> PodGroup:
    """One group of identical pods as the scheduler sees them, once GKE's webhooks and
    plugins have admitted them (the backends' ``pod_groups`` call it per pod template)."""
    spec = _gcsfuse(meta, spec)
    return PodGroup(
        name=name,
        role=role,
        jobs=jobs,
        pods=pods,
        requests=pod_requests(spec),
        node_selector=dict(spec.get("nodeSelector") or {}),
        tolerations=_tolerations(spec),
        pinned=pinned,
        host_network=bool(spec.get("hostNetwork")),
        service_account=spec.get("serviceAccountName"),
        pod=spec,
    )
