"""A PathwaysJob: one controller (the Pathways head) drives TPU slices.

What its controller makes of it follows pathways-job v0.1.4 (commit c0cc7594),
``internal/controller/pathwaysjob_controller.go``, the controller ``rlctl cluster
create`` installs beside JobSet's: it creates a JobSet named after the run. The head
pod is the user's controller template's spec (its metadata is dropped: the pod's
annotations are the PathwaysJob's own, ``MakePathwaysHeadReplicatedJob``) plus two
native sidecars, ``pathways-rm`` (limits cpu 8, memory 32000000000) and
``pathways-proxy`` (limits cpu 16, memory 100000000000), with ``hostNetwork: true``;
in ``default`` mode the head job is exclusive on ``kubernetes.io/hostname`` and gets
no node selector or toleration of its own. Workers: one job per slice,
``prod(topology) / chips per VM`` pods (8 for ``ct6e-standard-8t``/``ct5lp-hightpu-8t``,
else 4), each a ``pathways-worker`` container with limits ``google.com/tpu: chips``,
host network, the TPU node selector, exclusive on ``cloud.google.com/gke-nodepool``,
and no service account (the namespace's ``default``). Those worker pods carry none of
rlctl's labels (its CRD has no worker pod template), so they are found by the JobSet
name label.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from rlctl.core.config.pools import PoolRequest
from rlctl.core.k8s.backends.base import (
    Backend,
    Controller,
    View,
    condition_phase,
    pod_template,
    run_selector,
)
from rlctl.core.k8s.backends.jobset import (
    EXCLUSIVE_KEY,
    JOBSET_CONTROLLER,
    JOBSET_NAME_LABEL,
    jobset_groups,
)

if TYPE_CHECKING:  # pydantic, imported where used: the CLI reads the registry for --help
    from rlctl.core.k8s.admission import PodGroup
    from rlctl.core.k8s.shapes import SliceShape
    from rlctl.core.phases import Phase

PATHWAYS_HEAD_JOB = "pathways-head"  # pathways-job v0.1.4: the head's replicated job
# the images pathways-job v0.1.4 runs its resource manager and workers, and its proxy, from
# (pathwaysjob_controller.go DefaultPathwaysRMAndWorkerImage, DefaultPathwaysProxyImage;
# MakeComponentImage tags them with spec.pathwaysVersion, or 'latest')
SERVER_IMAGE = "us-docker.pkg.dev/cloud-tpu-v2-images/pathways/server"
PROXY_IMAGE = "us-docker.pkg.dev/cloud-tpu-v2-images/pathways/proxy_server"
PATHWAYS_CONTROLLER = Controller(
    "pathways-job",
    "v0.1.4",
    "pathways-job-v0.1.4.yaml",
    ("pathwaysjobs.pathways-job.pathways.domain",),
    "PathwaysJob controller",
    after=("jobset",),  # it makes JobSets
)


def image_pathways_version() -> str:
    """The Pathways server images' tag for the TPU image's JAX (``jax[tpu]==X`` in
    rlctl/data/images.yaml): ``jax-X``, as Google publishes them
    (us-docker.pkg.dev/cloud-tpu-v2-images/pathways/server:jax-0.10.0, ...). The proxy and
    the client's JAX must be one release: the trainer's IFRT proxy client is that JAX."""
    from rlctl.core.errors import ConfigError
    from rlctl.core.image.context import image_pins

    for req in image_pins("tpu").requirements:
        m = re.fullmatch(r"jax(\[[^\]]*\])?==([0-9.]+)", req.split("#")[0].strip())
        if m:
            return f"jax-{m.group(2)}"
    raise ConfigError("rlctl/data/images.yaml pins no jax for the tpu image")


# The CPU pool a Pathways head runs on. pathways-job v0.1.4 adds two sidecars to the head
# pod that request 24 CPU and 132 GB between them (pathwaysjob_controller.go,
# MakeResourceManagerContainer / MakeProxyContainer), beside the trainer: XPK makes a
# pool `cpu-np` of n2-standard-64 for them (src/xpk/core/nodepool.py, 1..20 nodes).
# rlctl's is tainted so that nothing else lands on it, and scales from 0 to 1 node, so
# it costs nothing until a Pathways run asks for it (XPK keeps one node up).
HEAD_POOL = PoolRequest(
    name="pathways",
    machine_type="n2-standard-64",
    max_nodes=1,
    purpose="Pathways heads (--backend pathways)",
    # pathways-job v0.1.4 runs its head and worker pods on the host network
    # (pathwaysjob_controller.go: HostNetwork: true), and GKE's Workload Identity does not
    # serve host-network pods (GKE docs, "Workload Identity Federation for GKE",
    # limitations): they reach the bucket (pathwaysDir, checkpoints) as the node's account
    bucket_via_nodes="Pathways pods run on the host network, outside Workload Identity",
)
# the limits pathways-job sets on its head's sidecars (requested alike), as it writes them
HEAD_SIDECARS = {
    "pathways-rm": {"cpu": "8", "memory": "32000000000"},
    "pathways-proxy": {"cpu": "16", "memory": "100000000000"},
}


def head_resources() -> tuple[str, str]:
    """(cpu, memory) of the trainer container in a Pathways head pod: what a node of the
    head's pool offers, less the controller's two sidecars and GCS FUSE's."""
    from rlctl.core.config.nodes import pod_share

    found = pod_share(HEAD_POOL.machine_type, None, list(HEAD_SIDECARS.values()))
    assert found is not None, "the Pathways machine type is in the catalog"
    return found


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
        for n, limits in HEAD_SIDECARS.items()
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


class PathwaysBackend(Backend):
    name = "pathways"
    template = "pathways.yaml.j2"
    api_version = "pathways-job.pathways.domain/v1"
    kind = "PathwaysJob"
    help = "a PathwaysJob, one controller drives TPU slices"
    crd_schema = "pathwaysjob-pathways-job.pathways.domain-v1.json"
    controllers = (JOBSET_CONTROLLER, PATHWAYS_CONTROLLER)  # it becomes a JobSet
    tpu_only = True
    single_controller = True
    # Kueue v0.19.2 has no PathwaysJob integration (pkg/controller/jobs/jobs.go
    # RegisterIntegrations); XPK queues the JobSets it submits itself
    queueable = False
    dcn_claim = False  # its controller builds the worker pods itself
    node_pools = (HEAD_POOL,)

    def pod_groups(
        self, obj: dict[str, Any], controller_version: tuple[int, ...] | None = None
    ) -> list[PodGroup]:
        return jobset_groups(
            pathways_jobset(obj),
            roles={PATHWAYS_HEAD_JOB: "pathways-head", "worker": "pathways-worker"},
        )

    def phase(self, workload: dict[str, Any]) -> tuple[Phase | None, str | None]:
        return condition_phase(workload)

    def pod_selectors(self, run: str) -> tuple[str, ...]:
        return (run_selector(run), f"{JOBSET_NAME_LABEL}={run}")

    def misfit_hint(self, role: str, reason: str, create: str, accelerator: str) -> str | None:
        """The head goes to its own pool; the workers ask more chips than small hosts have."""
        pool, machine = HEAD_POOL.name, HEAD_POOL.machine_type
        if role == "pathways-head":
            if reason == "selector":
                return (
                    f"re-run '{create} -a {accelerator}' to add the '{pool}' pool "
                    f"({machine}, 0 nodes until a head needs one)"
                )
            return (
                f"the Pathways head needs a {machine} node (its controller "
                "adds 24 CPU and 132 GB of sidecars); give it the pool "
                f"'{pool}' that '{create}' makes"
            )
        if role == "pathways-worker" and reason == "accelerator":
            return (
                "pathways-job v0.1.4 asks 4 TPU chips of every host (8 on -8t machines), "
                f"more than {accelerator} hosts have: use --backend jobset or ray"
            )
        return None

    def pulled_images(self, shape: SliceShape) -> Mapping[str, str]:
        """The Pathways server and proxy at the tag of the TPU image's JAX."""
        tag = image_pathways_version()
        return MappingProxyType(
            {
                f"{SERVER_IMAGE}:{tag}": "the Pathways server pathways-job runs",
                f"{PROXY_IMAGE}:{tag}": "the Pathways proxy pathways-job runs",
            }
        )

    def view_fields(self, view: View) -> Mapping[str, Any]:
        """The server images' tag, the head's pool, and the trainer's share of a node of it
        (what a node of the pool offers beside the controller's sidecars)."""
        cpu, memory = head_resources()
        return MappingProxyType(
            {
                "pathways_version": image_pathways_version(),
                "pool": {"selector": HEAD_POOL.selector, "toleration": HEAD_POOL.toleration},
                "head_cpu": cpu,
                "head_memory": memory,
            }
        )

    def embedded_templates(self, obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        spec = obj.get("spec") or {}
        yield pod_template(
            "spec.controller.template", (spec.get("controller") or {}).get("template") or {}
        )


BACKEND = PathwaysBackend()
