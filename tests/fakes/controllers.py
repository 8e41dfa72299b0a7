"""How the controllers a cluster run relies on name, label and start what they make.

The Kubernetes fake (``tests/fakes/k8s.py``) turns a workload into pods with these, so
that a test finds a run's pods the way rlctl must find them on a real cluster, not by
names or labels rlctl chose itself. ``tests/ray_image`` starts Ray and submits a job with
the commands KubeRay would run. Each behaviour names the upstream file and version it
follows; nothing here is imported by rlctl (its own model of placement and admission is
``rlctl.core.k8s.admission``, pinned to the same sources by tests/core/k8s/test_upstream.py).

Kubernetes' Job controller (v1.31, ``pkg/controller/job/job_controller.go`` and
``indexed_job_utils.go``; the labels by the API server, ``pkg/registry/batch/job/strategy.go``
``generateSelector``): a Job's pods are created with ``generateName`` ``JOB-`` (Indexed:
``JOB-INDEX-``, then 5 random characters) and carry the template's labels plus
``batch.kubernetes.io/controller-uid``, ``batch.kubernetes.io/job-name``, ``controller-uid``
and ``job-name`` (and, Indexed, ``batch.kubernetes.io/job-completion-index``).
"""

from __future__ import annotations

import random
import string
from typing import Any

JOB_NAME = "batch.kubernetes.io/job-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"

# KubeRay ray-operator v1.6.1 (tag ray-operator/v1.6.1)
RAY_CLUSTER = "ray.io/cluster"  # utils/constant.go RayClusterLabelKey
RAY_NODE_TYPE = "ray.io/node-type"  # RayNodeTypeLabelKey
RAY_GROUP = "ray.io/group"  # RayNodeGroupLabelKey
RAY_IS_NODE = "ray.io/is-ray-node"  # RayNodeLabelKey
HEAD_GROUP = "headgroup"  # RayNodeHeadGroupLabelValue
DASHBOARD_PORT = 8265  # DefaultDashboardPort
AGENT_PORT = 52365  # DefaultDashboardAgentListenPort
METRICS_PORT = 8080  # DefaultMetricsPort


def suffix(rng: random.Random | None = None, n: int = 5) -> str:
    """The random tail of a generated name (apimachinery's ``utilrand.String``: lowercase
    consonants and digits; any 5 of [a-z0-9] here)."""
    r = rng or random
    return "".join(r.choice(string.ascii_lowercase + string.digits) for _ in range(n))


def job_pod(
    job: str,
    uid: str,
    template_labels: dict[str, str],
    index: int | None = None,
    rng: random.Random | None = None,
) -> tuple[str, dict[str, str]]:
    """(name, labels) of one pod of the Job ``job`` (``index``: an Indexed Job's)."""
    labels = {
        **template_labels,
        "batch.kubernetes.io/controller-uid": uid,
        JOB_NAME: job,
        "controller-uid": uid,
        "job-name": job,
    }
    if index is None:
        return f"{job}-{suffix(rng)}", labels
    return f"{job}-{index}-{suffix(rng)}", {**labels, COMPLETION_INDEX: str(index)}


# --- JobSet v0.12.0 (tag v0.12.0) ---------------------------------------------------------
def jobset_job_name(jobset: str, rjob: str, job_index: int) -> str:
    """``pkg/util/placement`` ``GenJobName``: JOBSET-RJOB-INDEX."""
    return f"{jobset}-{rjob}-{job_index}"


def jobset_pod_labels(
    jobset: str, uid: str, rjob: str, replicas: int, job_index: int, template_labels: dict[str, str]
) -> dict[str, str]:
    """``pkg/controllers/jobset_controller.go`` ``labelAndAnnotateObject``: the replicated
    job's pod template labels plus JobSet's own. The JobSet's metadata labels are not
    copied (only its exclusive-topology annotation is)."""
    return {
        **template_labels,
        "jobset.sigs.k8s.io/jobset-name": jobset,
        "jobset.sigs.k8s.io/jobset-uid": uid,
        "jobset.sigs.k8s.io/replicatedjob-name": rjob,
        "jobset.sigs.k8s.io/restart-attempt": "0",
        "jobset.sigs.k8s.io/replicatedjob-replicas": str(replicas),
        "jobset.sigs.k8s.io/job-index": str(job_index),
    }


# --- pathways-job v0.1.4 (tag v0.1.4, internal/controller/pathwaysjob_controller.go) -------
def pathways_child_jobset(
    pw: dict[str, Any],
    head_spec: dict[str, Any],
    worker_spec: dict[str, Any],
    slices: int,
    vms: int,
) -> dict[str, Any]:
    """The JobSet ``createJobSet`` makes: named after the PathwaysJob, with its labels and
    annotations on the JobSet itself. The head's pod template metadata is built by
    ``MakePathwaysHeadReplicatedJob`` from the PathwaysJob's annotations only (plus the
    exclusive placement of the default deployment mode): the user template's labels and
    annotations never reach the pod. The workers' (``MakeWorkerJob``) carry only the
    node-pool exclusive placement."""
    md = pw["metadata"]
    head_ann = {
        **(md.get("annotations") or {}),
        "alpha.jobset.sigs.k8s.io/exclusive-topology": "kubernetes.io/hostname",
    }
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": md["name"],
            "namespace": md.get("namespace"),
            "labels": dict(md.get("labels") or {}),
            "annotations": dict(md.get("annotations") or {}),
        },
        "spec": {
            "replicatedJobs": [
                {
                    "name": "pathways-head",
                    "replicas": 1,
                    "template": {
                        "metadata": {"annotations": head_ann},
                        "spec": {
                            "parallelism": 1,
                            "completions": 1,
                            "template": {"metadata": {"annotations": head_ann}, "spec": head_spec},
                        },
                    },
                },
                {
                    "name": "worker",
                    "replicas": slices,
                    "template": {
                        "spec": {
                            "parallelism": vms,
                            "completions": vms,
                            "template": {
                                "metadata": {
                                    "annotations": {
                                        "alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"  # noqa: E501
                                    }
                                },
                                "spec": worker_spec,
                            },
                        }
                    },
                },
            ]
        },
    }


# --- KubeRay v1.6.1 -----------------------------------------------------------------------
def ray_cluster_name(rayjob: str, rng: random.Random | None = None) -> str:
    """``utils/util.go`` ``GenerateRayClusterName``: the RayJob's RayCluster, RAYJOB-xxxxx
    (``rayjob_controller.go`` line 881)."""
    return f"{rayjob}-{suffix(rng)}"


def ray_pod(
    cluster: str,
    group: str | None,
    template_labels: dict[str, str],
    rng: random.Random | None = None,
) -> tuple[str, dict[str, str]]:
    """(name, labels) of a head (``group`` None) or worker pod: ``utils/util.go`` ``PodName``
    (CLUSTER-head-xxxxx, CLUSTER-GROUP-worker-xxxxx; raycluster_controller.go lines 1396,
    1424) and ``common/pod.go`` ``labelPod`` (the template's labels, then KubeRay's; node
    type, group and cluster cannot be overridden)."""
    kind = "head" if group is None else "worker"
    prefix = cluster if group is None else f"{cluster}-{group}"
    labels = {
        **template_labels,
        RAY_IS_NODE: "yes",
        RAY_CLUSTER: cluster,
        RAY_NODE_TYPE: kind,
        RAY_GROUP: group or HEAD_GROUP,
        "ray.io/identifier": f"{cluster}-{kind}",
        "app.kubernetes.io/name": "kuberay",
        "app.kubernetes.io/created-by": "kuberay-operator",
    }
    return f"{prefix[:50]}-{kind}-{suffix(rng)}", labels


def submitter_template(rayjob: dict[str, Any]) -> dict[str, Any]:
    """``common/job.go`` ``GetSubmitterTemplate``: the RayJob's ``submitterPodTemplate``, or
    a default one with no labels (``GetDefaultSubmitterContainer``). The submitter Job is
    named after the RayJob (``rayjob_controller.go`` ``createNewK8sJob``), so its pod is
    RAYJOB-xxxxx with the Job controller's labels and the template's."""
    spec = rayjob["spec"]
    head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    return spec.get("submitterPodTemplate") or {
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "ray-job-submitter",
                    "image": head.get("image"),
                    "resources": {
                        "limits": {"cpu": "1", "memory": "1Gi"},
                        "requests": {"cpu": "500m", "memory": "200Mi"},
                    },
                }
            ],
        }
    }


def ray_start_command(
    params: dict[str, str], head: bool, limits: dict[str, str] | None = None
) -> list[str]:
    """The ``ray start`` a Ray pod runs: ``common/pod.go`` ``setMissingRayStartParams``
    (workers' ``address``, the head's ``dashboard-host``, ``metrics-export-port`` 8080,
    ``block``, ``dashboard-agent-listen-port`` 52365, each unless given),
    ``generateRayStartCommand`` (``num-cpus``, ``memory`` and ``num-gpus`` from the
    container's limits, unless given) and ``convertParamMap`` (keys sorted; "true" is a
    bare switch)."""
    from rlctl.core.units import quantity

    p = dict(params)
    if head:
        p.setdefault("dashboard-host", "0.0.0.0")
    p.setdefault("metrics-export-port", str(METRICS_PORT))
    p["block"] = "true"
    p.setdefault("dashboard-agent-listen-port", str(AGENT_PORT))
    limits = limits or {}
    if "num-cpus" not in p and "cpu" in limits:
        p["num-cpus"] = str(int(quantity(limits["cpu"])))
    if "memory" not in p and "memory" in limits:
        p["memory"] = str(int(quantity(limits["memory"])))
    # addWellKnownAcceleratorResources (same file, v1.6.1): ``num-gpus`` from the first
    # limit whose key ends in "gpu" (utils/resources.go IsGPUResourceKey), unless given
    for key in sorted(limits):
        if "num-gpus" not in p and key.endswith("gpu") and int(quantity(limits[key])):
            p["num-gpus"] = str(int(quantity(limits[key])))
    flags = []
    for k in sorted(p):
        v = str(p[k])
        if v.lower() in ("true", "false") and k not in ("log-color", "include-dashboard"):
            if v.lower() == "true":
                flags.append(f"--{k}")
        else:
            flags.append(f"--{k}={v}")
    return ["ray", "start", *(["--head"] if head else []), *flags]


def submitter_command(rayjob: dict[str, Any], dashboard: str, job_id: str) -> str:
    """The shell line of K8sJobMode's submitter (``common/job.go`` ``BuildJobSubmitCommand``,
    run with ``bash -ec``): submit once (``ray job status`` guards a retried pod), without
    waiting, then follow the job's logs until it ends (that command's exit is the pod's)."""
    address = dashboard if dashboard.startswith("http://") else f"http://{dashboard}"
    entry = rayjob["spec"]["entrypoint"].strip()
    return (
        f"if ! ray job status --address {address} {job_id} >/dev/null 2>&1 ; then "
        f"ray job submit --address {address} --no-wait --submission-id {job_id} "
        f"-- {entry} ; fi ; ray job logs --address {address} --follow {job_id}"
    )


# --- every pod a workload becomes ---------------------------------------------------------
class Identity(dict):
    """One pod's metadata as its controllers give it: name, labels, annotations."""


def _meta(tmpl: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    md = tmpl.get("metadata") or {}
    return dict(md.get("labels") or {}), dict(md.get("annotations") or {})


def _jobset_identities(js: dict[str, Any], uid: str, rng: random.Random) -> list[list[Identity]]:
    out = []
    name = js["metadata"]["name"]
    for rjob in js["spec"]["replicatedJobs"]:
        replicas = int(rjob.get("replicas", 1))
        job_spec = rjob["template"]["spec"]
        labels, annotations = _meta(job_spec["template"])
        pods = []
        for j in range(replicas):
            job = jobset_job_name(name, rjob["name"], j)
            pod_labels = jobset_pod_labels(name, uid, rjob["name"], replicas, j, labels)
            for i in range(int(job_spec.get("parallelism", 1))):
                pod, pl = job_pod(job, f"{uid}-{j}", pod_labels, index=i, rng=rng)
                pods.append(
                    Identity(
                        name=pod,
                        labels=pl,
                        annotations={**annotations, "jobset.sigs.k8s.io/jobset-name": name},
                    )
                )
        out.append(pods)
    return out


def _lws_identities(lws: dict[str, Any], namespace: str) -> list[list[Identity]]:
    """kubernetes-sigs/lws v0.10.0: leaders ``NAME-G`` of the leader StatefulSet
    (``leaderworkerset_controller.go`` constructLeaderStatefulSetApplyConfiguration),
    workers ``NAME-G-W``, W from 1, of each group's StatefulSet ``NAME-G`` (``pod_controller.go``
    constructWorkerStatefulSetApplyConfiguration; none when size is 1). Labels: the
    template's, ``name`` and ``worker-index`` (0 on leaders, from the StatefulSet template;
    the workers' from their ordinal, ``pod_webhook.go`` Default), ``group-index`` and
    ``group-key`` = sha1 of "NAMESPACE/LEADER" (``genGroupUniqueKey``); annotation ``size``
    on every pod and ``leader-name`` on workers. One list per ``pod_groups`` group: all
    pods when the leaders share the workers' template, else leaders then workers."""
    import hashlib

    name = lws["metadata"]["name"]
    spec = lws.get("spec") or {}
    lwt = spec.get("leaderWorkerTemplate") or {}
    size = int(lwt.get("size", 1))
    worker_labels, worker_ann = _meta(lwt.get("workerTemplate") or {})
    leader_tmpl = lwt.get("leaderTemplate")
    leader_labels, leader_ann = _meta(leader_tmpl) if leader_tmpl else (worker_labels, worker_ann)
    p = "leaderworkerset.sigs.k8s.io/"
    leaders, workers = [], []
    for g in range(int(spec.get("replicas", 1))):
        leader = f"{name}-{g}"
        key = hashlib.sha1(f"{namespace}/{leader}".encode()).hexdigest()
        common = {f"{p}name": name, f"{p}group-index": str(g), f"{p}group-key": key}
        leaders.append(
            Identity(
                name=leader,
                labels={**leader_labels, **common, f"{p}worker-index": "0"},
                annotations={**leader_ann, f"{p}size": str(size)},
            )
        )
        for w in range(1, size):
            workers.append(
                Identity(
                    name=f"{leader}-{w}",
                    labels={**worker_labels, **common, f"{p}worker-index": str(w)},
                    annotations={**worker_ann, f"{p}size": str(size), f"{p}leader-name": leader},
                )
            )
    if leader_tmpl is None or size == 1:  # one group: each leader followed by its workers
        by_group = {ident["name"]: [ident] for ident in leaders}
        for w in workers:
            by_group[w["annotations"][f"{p}leader-name"]].append(w)
        return [[i for pods in by_group.values() for i in pods]]
    return [leaders, workers]


def generic_identities(run: str, sizes: list[int]) -> list[list[Identity]]:
    """The pods of a workload kind none of the controllers above is emulated for, as a
    controller that copies the pod template's labels (batch/v1 Job, JobSet, KubeRay,
    LeaderWorkerSet all do) names them: rlctl's run labels, RUN-GROUP-INDEX. A backend
    whose controller labels its pods otherwise needs its own emulation here."""
    labels = {"managed-by": "rlctl", "rlctl.dev/run": run}
    return [
        [Identity(name=f"{run}-{g}-{i}", labels=dict(labels), annotations={}) for i in range(n)]
        for g, n in enumerate(sizes)
    ]


def pod_identities(
    obj: dict[str, Any], rng: random.Random, worker_vms: int = 1
) -> list[list[Identity]]:
    """The pods of a JobSet, LeaderWorkerSet, PathwaysJob or RayJob, one list per group
    in the order of ``rlctl.core.k8s.backends.pod_groups`` (JobSet: its replicated jobs;
    LWS: its groups; Pathways: head, workers; Ray: head, each worker group, submitter),
    each ``jobs`` x ``pods`` long."""
    kind, md = obj["kind"], obj["metadata"]
    uid = md.get("uid") or "uid"
    if kind == "JobSet":
        return _jobset_identities(obj, uid, rng)
    if kind == "LeaderWorkerSet":
        return _lws_identities(obj, md.get("namespace") or "default")
    if kind == "PathwaysJob":
        worker = obj["spec"]["workers"][0]
        child = pathways_child_jobset(obj, {}, {}, int(worker.get("numSlices", 1)), worker_vms)
        return _jobset_identities(child, f"{uid}-js", rng)
    if kind == "RayJob":
        spec = obj["spec"]
        cluster = ray_cluster_name(md["name"], rng)
        head_labels, head_ann = _meta(spec["rayClusterSpec"]["headGroupSpec"]["template"])
        name, labels = ray_pod(cluster, None, head_labels, rng)
        out = [[Identity(name=name, labels=labels, annotations=head_ann)]]
        for g in spec["rayClusterSpec"].get("workerGroupSpecs") or []:
            glabels, gann = _meta(g["template"])
            pods = []
            for _ in range(int(g.get("replicas", 1)) * int(g.get("numOfHosts", 1))):
                name, labels = ray_pod(cluster, g["groupName"], glabels, rng)
                pods.append(Identity(name=name, labels=labels, annotations=gann))
            out.append(pods)
        if spec.get("submissionMode", "K8sJobMode") == "K8sJobMode":
            slabels, sann = _meta(submitter_template(obj))
            name, labels = job_pod(md["name"], f"{uid}-submitter", slabels, rng=rng)
            out.append([Identity(name=name, labels=labels, annotations=sann)])
        return out
    return []
