"""GKE nodes as the scheduler sees them: what one node of a node pool offers a pod.

A node pool's settings (machine type, threads per core, accelerator, labels, node
count or autoscaling bound) give every node of it the same capacity, allocatable
resources, labels and taints. ``rlctl train --cluster`` checks its pods against these
(``core/k8s/fit.py``) before anything is applied, and sizes a host's trainer pod from
them. Pure: built from plain values, so the same model serves the pools ``cluster
create`` sends and those read back from the GKE API.

Sources, each cited where it is used:
- Compute Engine, "Set the number of threads per core"
  (cloud.google.com/compute/docs/instances/set-threads-per-core): with one thread per
  core a VM has half the vCPUs its machine type lists.
- GKE, "Plan GKE Standard node sizes" / "Standard cluster architecture, node allocatable
  resources" (cloud.google.com/kubernetes-engine/docs/concepts/plan-node-sizes):
  the CPU and memory reservations and the 100 MiB eviction threshold (``catalog``).
- GKE, "About TPUs in GKE" and "Plan TPUs in GKE": TPU nodes carry
  ``cloud.google.com/gke-tpu-accelerator`` and ``cloud.google.com/gke-tpu-topology``
  labels, the taint ``google.com/tpu=present:NoSchedule`` and the extended resource
  ``google.com/tpu`` (chips per host).
- GKE, "About GPUs in GKE Standard": GPU nodes carry ``cloud.google.com/gke-accelerator``,
  the taint ``nvidia.com/gpu=present:NoSchedule`` and the resource ``nvidia.com/gpu``.
- Kubernetes well-known labels (kubernetes.io/docs/reference/labels-annotations-taints):
  ``kubernetes.io/hostname``, ``node.kubernetes.io/instance-type``; GKE adds
  ``cloud.google.com/gke-nodepool`` and ``cloud.google.com/machine-family``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from rlctl.core.config.catalog import Accelerator, Machine, allocatable, machine
from rlctl.core.config.kinds import (  # defined with the kinds; named here as before
    GPU_ACCELERATOR_LABEL as GPU_ACCELERATOR_LABEL,
)
from rlctl.core.config.kinds import GPU_RESOURCE as GPU_RESOURCE
from rlctl.core.config.kinds import TPU_ACCELERATOR_LABEL as TPU_ACCELERATOR_LABEL
from rlctl.core.config.kinds import TPU_RESOURCE as TPU_RESOURCE
from rlctl.core.config.kinds import TPU_THREADS_PER_CORE as TPU_THREADS_PER_CORE
from rlctl.core.config.kinds import TPU_TOPOLOGY_LABEL as TPU_TOPOLOGY_LABEL
from rlctl.core.units import quantity

# What the node's own DaemonSets (metadata server, netd/anetd, logging, GCS FUSE node
# plugin, DRANET, device plugins) take of the allocatable resources; a pod rlctl sizes
# asks for the rest, and the fit check keeps it free. GKE publishes no single figure;
# 10% covers what these DaemonSets request on the machine types of the catalog.
DAEMONSET_SHARE = 0.10

# GKE's default requests of the GCS FUSE sidecar (GKE docs, "Configure resources for the
# sidecar container")
GCSFUSE_SIDECAR = {"cpu": "250m", "memory": "256Mi"}

from rlctl.core.config.pools import NODEPOOL_LABEL as NODEPOOL_LABEL  # noqa: E402

HOSTNAME_LABEL = "kubernetes.io/hostname"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"


class Taint(BaseModel):
    model_config = ConfigDict(frozen=True)

    key: str
    value: str = ""
    effect: str = "NoSchedule"


class NodePool(BaseModel):
    """One node pool: ``nodes`` identical nodes (at most; an autoscaled pool may have
    none yet), each offering ``cpu`` cores and ``memory_gib`` to pods after GKE's
    reservations and its DaemonSets, plus ``extended`` resources (TPU chips, GPUs)."""

    model_config = ConfigDict(frozen=True)

    name: str
    machine_type: str
    nodes: int = Field(ge=0)
    autoscaled: bool = False
    vcpus: int = Field(description="vCPUs of one node after threads per core")
    cpu: float = Field(description="cores one node offers pods (allocatable less DaemonSets)")
    memory_gib: float = Field(description="GiB one node offers pods, likewise")
    extended: dict[str, int] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[Taint] = Field(default_factory=list)

    def describe(self) -> str:
        """``cpu (e2-standard-8, 1 node)``: how the fit check names a pool."""
        n = f"up to {self.nodes}" if self.autoscaled else str(self.nodes)
        return f"{self.name} ({self.machine_type}, {n} node{'s' * (self.nodes != 1)})"


def node_vcpus(m: Machine, threads_per_core: int | None) -> int:
    """vCPUs of a VM of machine type ``m``: halved with one thread per core (Compute
    Engine lists every machine type with two threads per core). 0/None = the default."""
    if threads_per_core == 1:
        return max(1, m.vcpus // 2)
    return m.vcpus


def pod_capacity(m: Machine, threads_per_core: int | None) -> tuple[float, float]:
    """(cores, GiB) one node of ``m`` offers a pod: allocatable after GKE's reservations
    (computed on the VM's real vCPU count), less ``DAEMONSET_SHARE``."""
    real = m.model_copy(update={"vcpus": node_vcpus(m, threads_per_core)})
    cpu, mem = allocatable(real)
    keep = 1 - DAEMONSET_SHARE
    return cpu * keep, mem * keep


def node_pool(
    name: str,
    machine_type: str,
    nodes: int,
    *,
    threads_per_core: int | None = None,
    accelerator: Accelerator | None = None,
    labels: dict[str, str] | None = None,
    autoscaled: bool = False,
) -> NodePool | None:
    """The nodes of a pool as GKE makes them; None for a machine type the catalog lacks."""
    m = machine(machine_type)
    if m is None:
        return None
    cpu, mem = pod_capacity(m, threads_per_core)
    node_labels = {
        **(labels or {}),
        NODEPOOL_LABEL: name,
        INSTANCE_TYPE_LABEL: machine_type,
        "cloud.google.com/machine-family": machine_type.split("-", 1)[0],
    }
    extended: dict[str, int] = {}
    taints: list[Taint] = []
    if accelerator is not None:
        kind = accelerator.strategy
        node_labels.update(kind.node_labels(accelerator))
        extended[kind.resource] = kind.per_node(accelerator)
        taints.append(Taint(key=kind.resource, value="present"))
    return NodePool(
        name=name,
        machine_type=machine_type,
        nodes=nodes,
        autoscaled=autoscaled,
        vcpus=node_vcpus(m, threads_per_core),
        cpu=cpu,
        memory_gib=mem,
        extended=extended,
        labels=node_labels,
        taints=taints,
    )


def host_pod_resources(machine_type: str, threads_per_core: int | None) -> tuple[str, str] | None:
    """(cpu, memory) quantities for the one trainer pod of an accelerator host: what a
    node offers pods, less room for GKE's GCS FUSE sidecar (added to a pod that mounts a
    bucket), in whole cores and GiB (None: a machine type the catalog lacks)."""
    return pod_share(machine_type, threads_per_core, [])


def pod_share(
    machine_type: str, threads_per_core: int | None, sidecars: list[dict[str, str]]
) -> tuple[str, str] | None:
    """(cpu, memory) one pod's main container may ask of a node of ``machine_type``:
    what the node offers pods, less ``sidecars`` (each {cpu, memory}) and GCS FUSE's."""
    m = machine(machine_type)
    if m is None:
        return None
    cpu, mem = pod_capacity(m, threads_per_core)
    for res in (*sidecars, GCSFUSE_SIDECAR):
        cpu -= quantity(res["cpu"])
        mem -= quantity(res["memory"]) / 2**30
    return str(max(1, int(cpu))), f"{max(1, int(mem))}Gi"
