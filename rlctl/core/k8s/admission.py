"""What the controllers and admission webhooks a run relies on make of its workload.

A JobSet, PathwaysJob or RayJob is not what the scheduler sees: controllers turn it
into pods, and webhooks change those pods on admission. This module spells out, as
pure functions over rendered manifests, the pods each workload becomes, so that
``fit.py`` can tell before anything is applied whether every pod has a node, and the
test fake (``tests/fakes/k8s.py``) can create the same pods a real cluster would.
Every behaviour below names the upstream file and version it follows:

- JobSet v0.12.0 (commit f22e565a), the controller ``cluster create`` installs:
  ``pkg/controllers/jobset_controller.go`` (one Job per replica of each replicated
  job; ``exclusive-topology`` copied from the JobSet's or the replicated job
  template's annotations), ``pkg/webhooks/pod_webhook.go`` (the leader pod, completion
  index 0, gets a required pod affinity to its own job and an anti-affinity to other
  jobs on ``topologyKey``; each follower is admitted only once the leader has a node,
  with ``nodeSelector[topologyKey]`` = the leader node's value: every pod of a job
  lands in the leader's domain).
- pathways-job v0.1.4 (commit c0cc7594), ``internal/controller/pathwaysjob_controller.go``:
  the head pod is the user's controller template's spec (its metadata is dropped: the
  pod's annotations are the PathwaysJob's own, ``MakePathwaysHeadReplicatedJob``) plus
  two native sidecars,
  ``pathways-rm`` (limits cpu 8, memory 32000000000) and ``pathways-proxy`` (limits cpu
  16, memory 100000000000), with ``hostNetwork: true``; in ``default`` mode the head
  job is exclusive on ``kubernetes.io/hostname`` and gets no node selector or
  toleration of its own. Workers: one job per slice, ``prod(topology) / chips per VM``
  pods (8 for ``ct6e-standard-8t``/``ct5lp-hightpu-8t``, else 4), each a
  ``pathways-worker`` container with limits ``google.com/tpu: chips``, host network, the
  TPU node selector, exclusive on ``cloud.google.com/gke-nodepool``, and no service
  account (the namespace's ``default``).
- KubeRay (ray-operator v1.3-v1.7, ``controllers/ray/common/pod.go``,
  ``utils/constant.go``, ``common/job.go``): a head pod, ``replicas x numOfHosts``
  pods per worker group, and in ``K8sJobMode`` a submitter Job whose default pod
  uses the head's image with requests cpu 500m / memory 200Mi (limits 1 / 1Gi).
  Readiness and liveness probes are injected into container 0 of head and worker
  pods, each only where the container has none: ``httpGet :52365/api/healthz`` on
  v1.6+ when ``rayVersion`` >= 2.53.0, otherwise ``bash -c "wget ... | grep success"``.
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

import math
import re
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rlctl.core.config.nodes import GCSFUSE_SIDECAR, PATHWAYS_SIDECARS
from rlctl.core.units import quantity

EXCLUSIVE_KEY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
GCSFUSE_ANNOTATION = "gke-gcsfuse/volumes"
PATHWAYS_HEAD_JOB = "pathways-head"  # pathways-job v0.1.4: the head's replicated job
# KubeRay: the default submitter pod of K8sJobMode (common/job.go)
RAY_SUBMITTER = {
    "requests": {"cpu": "500m", "memory": "200Mi"},
    "limits": {"cpu": "1", "memory": "1Gi"},
}
# KubeRay: the first version that probes with httpGet (PR #4448, v1.6.0), and the Ray
# version from which it does (a /api/healthz endpoint in the dashboard agent).
KUBERAY_HTTP_PROBES = (1, 6, 0)
RAY_HTTP_PROBES = (2, 53, 0)
RAY_AGENT_PORT = 52365
RAY_DASHBOARD_PORT = 8265
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


def _group(
    name: str,
    role: str,
    meta: dict[str, Any],
    spec: dict[str, Any],
    jobs: int = 1,
    pods: int = 1,
    pinned: str | None = None,
) -> PodGroup:
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


# --- JobSet ------------------------------------------------------------------------------
def _exclusive(jobset: dict[str, Any], rjob: dict[str, Any]) -> str | None:
    """jobset_controller.go: the replicated job template's annotation wins over the
    JobSet's; pod template annotations reach the pods too (pathways-job puts it there)."""
    tmpl = rjob.get("template") or {}
    pod_tmpl = (tmpl.get("spec") or {}).get("template") or {}
    for ann in (
        (pod_tmpl.get("metadata") or {}).get("annotations"),
        (tmpl.get("metadata") or {}).get("annotations"),
        (jobset.get("metadata") or {}).get("annotations"),
    ):
        if ann and ann.get(EXCLUSIVE_KEY):
            return str(ann[EXCLUSIVE_KEY])
    return None


def jobset_groups(jobset: dict[str, Any], roles: dict[str, str] | None = None) -> list[PodGroup]:
    """One group per replicated job: ``replicas`` Jobs of ``parallelism`` pods."""
    name = jobset["metadata"]["name"]
    out = []
    for rjob in jobset["spec"]["replicatedJobs"]:
        job = rjob["template"]["spec"]
        pod = job["template"]
        out.append(
            _group(
                f"{jobset['kind']} {name}, replicated job {rjob['name']}",
                (roles or {}).get(rjob["name"], "trainer"),
                pod.get("metadata") or {},
                pod["spec"],
                jobs=int(rjob.get("replicas", 1)),
                pods=int(job.get("parallelism", 1)),
                pinned=_exclusive(jobset, rjob),
            )
        )
    return out


# --- PathwaysJob -------------------------------------------------------------------------
def _chips_per_vm(machine_type: str) -> int:
    return 8 if machine_type in ("ct6e-standard-8t", "ct5lp-hightpu-8t") else 4


def _tpu_label(machine_type: str) -> str:
    """pathways-job's cloud.google.com/gke-tpu-accelerator for a worker machine type
    (GKEAcceleratorType): the catalog's label of that machine's TPU generation."""
    from rlctl.core.config.catalog import all_types

    return next(
        (
            a.gke_accelerator or ""
            for a in all_types()
            if a.kind == "tpu" and a.machine_type == machine_type
        ),
        machine_type,
    )


def pathways_jobset(pw: dict[str, Any]) -> dict[str, Any]:
    """The JobSet pathways-job v0.1.4 creates for a PathwaysJob (``createJobSet``),
    restricted to what placement and admission depend on."""
    spec = pw["spec"]
    md = pw["metadata"]
    worker = spec["workers"][0]
    machine = worker["type"]
    chips = _chips_per_vm(machine)
    vms = max(1, math.prod(int(d) for d in worker["topology"].split("x")) // chips)
    controller = spec.get("controller") or {}
    user = controller.get("template") or {}
    head_spec = dict(user.get("spec") or {})
    sidecars = [
        {"name": n, "restartPolicy": "Always", "resources": {"limits": dict(limits)}}
        for n, limits in PATHWAYS_SIDECARS.items()
    ]
    head_spec.update(
        hostNetwork=True,
        dnsPolicy="ClusterFirstWithHostNet",
        initContainers=[*(head_spec.get("initContainers") or []), *sidecars],
    )
    # MakePathwaysHeadReplicatedJob: the head pod's metadata is the PathwaysJob's own
    # annotations (plus exclusive placement in default mode), nothing of the template's
    head_ann = {**(md.get("annotations") or {})}
    if controller.get("deploymentMode", "default") == "default":
        head_ann[EXCLUSIVE_KEY] = "kubernetes.io/hostname"
    head_meta = {"annotations": head_ann}
    worker_spec = {
        "hostNetwork": True,
        "dnsPolicy": "ClusterFirstWithHostNet",
        "nodeSelector": {
            **(worker.get("nodeSelector") or {}),
            "cloud.google.com/gke-tpu-accelerator": _tpu_label(machine),
            "cloud.google.com/gke-tpu-topology": worker["topology"],
        },
        "containers": [
            {"name": "pathways-worker", "resources": {"limits": {"google.com/tpu": str(chips)}}}
        ],
    }
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": md["name"], "namespace": md.get("namespace")},
        "spec": {
            "replicatedJobs": [
                {
                    "name": PATHWAYS_HEAD_JOB,
                    "replicas": 1,
                    "template": {
                        "metadata": {"annotations": head_ann},
                        "spec": {
                            "parallelism": 1,
                            "completions": 1,
                            "template": {"metadata": head_meta, "spec": head_spec},
                        },
                    },
                },
                {
                    "name": "worker",
                    "replicas": int(worker.get("numSlices", 1)),
                    "template": {
                        "spec": {
                            "parallelism": vms,
                            "completions": vms,
                            "template": {
                                "metadata": {
                                    "annotations": {EXCLUSIVE_KEY: "cloud.google.com/gke-nodepool"}
                                },
                                "spec": worker_spec,
                            },
                        }
                    },
                },
            ]
        },
    }


# --- RayJob ------------------------------------------------------------------------------
def _version(v: str | None) -> tuple[int, ...] | None:
    m = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", v or "")
    return None if not m else tuple(int(x or 0) for x in m.groups())


def ray_probes(
    container: dict[str, Any], head: bool, ray_version: str | None, kuberay_version: tuple[int, ...]
) -> dict[str, Any]:
    """Container 0 of a Ray pod after KubeRay's probe injection (pod.go
    ``initLivenessAndReadinessProbe``): each probe the container lacks is added."""
    rv = _version(ray_version)
    http = kuberay_version >= KUBERAY_HTTP_PROBES and rv is not None and rv >= RAY_HTTP_PROBES
    tries = " --tries 1" if kuberay_version >= (1, 4, 0) else ""
    cmds = [
        f"wget{tries} -T 2 -q -O- http://localhost:{RAY_AGENT_PORT}"
        "/api/local_raylet_healthz | grep success"
    ]
    if head:
        cmds.append(
            f"wget{tries} -T 10 -q -O- http://localhost:{RAY_DASHBOARD_PORT}"
            "/api/gcs_healthz | grep success"
        )
    action: dict[str, Any] = (
        {"httpGet": {"path": "/api/healthz", "port": RAY_AGENT_PORT}}
        if http
        else {"exec": {"command": ["bash", "-c", " && ".join(cmds)]}}
    )
    timeout = 5 if head else 2
    out = dict(container)
    if out.get("readinessProbe") is None:
        out["readinessProbe"] = {
            **action,
            "initialDelaySeconds": 10,
            "periodSeconds": 5,
            "timeoutSeconds": timeout,
            "successThreshold": 1,
            "failureThreshold": 10,
        }
    if out.get("livenessProbe") is None:
        out["livenessProbe"] = {
            **action,
            "initialDelaySeconds": 30,
            "periodSeconds": 5,
            "timeoutSeconds": timeout,
            "successThreshold": 1,
            "failureThreshold": 120,
        }
    return out


def _ray_pod(
    spec: dict[str, Any], head: bool, ray_version: str | None, kuberay_version: tuple[int, ...]
) -> dict[str, Any]:
    containers = list(spec.get("containers") or [])
    if containers:
        containers[0] = ray_probes(containers[0], head, ray_version, kuberay_version)
    return {**spec, "containers": containers}


def rayjob_groups(
    rayjob: dict[str, Any], kuberay_version: tuple[int, ...] = (1, 5, 2)
) -> list[PodGroup]:
    """The head, each worker group's pods, and the submitter (K8sJobMode)."""
    name = rayjob["metadata"]["name"]
    spec = rayjob["spec"]
    cluster = spec["rayClusterSpec"]
    rv = cluster.get("rayVersion")
    head = cluster["headGroupSpec"]["template"]
    out = [
        _group(
            f"RayJob {name}, head",
            "ray-head",
            head.get("metadata") or {},
            _ray_pod(head["spec"], True, rv, kuberay_version),
        )
    ]
    for g in cluster.get("workerGroupSpecs") or []:
        t = g["template"]
        out.append(
            _group(
                f"RayJob {name}, worker group {g['groupName']}",
                "ray-worker",
                t.get("metadata") or {},
                _ray_pod(t["spec"], False, rv, kuberay_version),
                jobs=int(g.get("replicas", 1)),
                pods=int(g.get("numOfHosts", 1)),
            )
        )
    if spec.get("submissionMode", "K8sJobMode") == "K8sJobMode":
        tmpl = spec.get("submitterPodTemplate") or {
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "ray-job-submitter",
                        "image": head["spec"]["containers"][0].get("image"),
                        "resources": RAY_SUBMITTER,
                    }
                ],
            }
        }
        out.append(
            _group(
                f"RayJob {name}, submitter",
                "ray-submitter",
                tmpl.get("metadata") or {},
                tmpl["spec"],
            )
        )
    return out


# --- any workload --------------------------------------------------------------------------
def pod_groups(
    objs: Iterable[dict[str, Any]], kuberay_version: tuple[int, ...] = (1, 5, 2)
) -> list[PodGroup]:
    """Every pod the run's objects become, grouped; objects that make no pods are skipped.

    ``kuberay_version``: which KubeRay's probe injection to apply (GKE's add-on does not
    publish its version; 1.5.2, the last with exec probes only, is the stricter one).
    """
    out: list[PodGroup] = []
    for o in objs:
        kind = o.get("kind")
        if kind == "JobSet":
            out += jobset_groups(o)
        elif kind == "PathwaysJob":
            out += jobset_groups(
                pathways_jobset(o),
                roles={PATHWAYS_HEAD_JOB: "pathways-head", "worker": "pathways-worker"},
            )
        elif kind == "RayJob":
            out += rayjob_groups(o, kuberay_version)
        elif kind == "Job":
            t = o["spec"]["template"]
            out.append(
                _group(
                    f"Job {o['metadata']['name']}",
                    "job",
                    t.get("metadata") or {},
                    t["spec"],
                    pods=int(o["spec"].get("parallelism", 1)),
                )
            )
    return out
