"""A KubeRay RayJob: elastic over slices, the trainer started by a Ray driver.

What KubeRay makes of it follows ray-operator v1.3-v1.7 (``controllers/ray/common/pod.go``,
``utils/constant.go``, ``common/job.go``): a head pod, ``replicas x numOfHosts`` pods
per worker group, and in ``K8sJobMode`` a submitter Job whose default pod uses the
head's image with requests cpu 500m / memory 200Mi (limits 1 / 1Gi). Readiness and
liveness probes are injected into container 0 of head and worker pods, each only where
the container has none: ``httpGet :52365/api/healthz`` on v1.6+ when ``rayVersion`` >=
2.53.0, otherwise ``bash -c "wget ... | grep success"``. The operator is GKE's own
add-on (RayOperator), enabled with the cluster: rlctl installs no controller for it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from rlctl.core.k8s.backends.base import Backend, View, pod_template, run_selector

if TYPE_CHECKING:  # pydantic, imported where used: the CLI reads the registry for --help
    from rlctl.core.k8s.admission import PodGroup
    from rlctl.core.phases import Phase

# KubeRay: the default submitter pod of K8sJobMode (common/job.go)
RAY_SUBMITTER = {
    "requests": {"cpu": "500m", "memory": "200Mi"},
    "limits": {"cpu": "1", "memory": "1Gi"},
}
# KubeRay: the first version that probes with httpGet (PR #4448, v1.6.0), and the Ray
# version from which it does (a /api/healthz endpoint in the dashboard agent).
KUBERAY_HTTP_PROBES = (1, 6, 0)
KUBERAY_ASSUMED = (1, 5, 2)
RAY_HTTP_PROBES = (2, 53, 0)
RAY_AGENT_PORT = 52365
# where Ray exports its metrics (its default); libtpu's megascale port is therefore 9915
RAY_METRICS_EXPORT_PORT = 8080


def image_ray_version() -> str:
    """The Ray version the cluster images pin (``ray[train]==X`` in rlctl/data/images.yaml)."""
    from rlctl.core.errors import ConfigError
    from rlctl.core.image.context import pins

    for image in pins().images.values():
        for req in image.requirements:
            m = re.fullmatch(r"ray(\[[^\]]*\])?==([0-9.]+)", req.split("#")[0].strip())
            if m:
                return m.group(2)
    raise ConfigError("rlctl/data/images.yaml pins no ray version")


# The name Ray gives each TPU generation of the catalog (ray.util.accelerators: TPU-V4,
# TPU-V5P, TPU-V5LITEPOD, TPU-V6E, TPU-V7X), by GKE's accelerator label: Ray Train's
# ScalingConfig(accelerator_type=...) must use it exactly, and Ray places TPU workers
# only on nodes advertising it.
RAY_TPU_TYPES = {
    "tpu-v4-podslice": "TPU-V4",
    "tpu-v5p-slice": "TPU-V5P",
    "tpu-v5-lite-podslice": "TPU-V5LITEPOD",
    "tpu-v6e-slice": "TPU-V6E",
    "tpu7x": "TPU-V7X",
}


def ray_accelerator_type(gke_accelerator: str) -> str:
    """Ray's name of the TPU generation of a GKE accelerator label (tpu-v6e-slice ->
    TPU-V6E)."""
    from rlctl.core.errors import ConfigError

    found = RAY_TPU_TYPES.get(gke_accelerator)
    if found is None:
        raise ConfigError(
            f"no Ray accelerator type for {gke_accelerator!r}",
            hint="the ray backend needs a TPU type from the catalog",
        )
    return found


RAY_DASHBOARD_PORT = 8265


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


# A pipelined run's generator (rollout.placement=process): a worker group of one host
# whose Ray node offers this custom resource, and the learner's group LEARNER_RESOURCE, so
# the driver's generator task and Ray Train's workers each land on their own hosts
# (rayjob.yaml.j2, ray_driver.py.j2)
GENERATOR_GROUP = "generator"
GENERATOR_RESOURCE = "rlctl_generator"
LEARNER_RESOURCE = "rlctl_learner"


def rayjob_groups(
    rayjob: dict[str, Any], kuberay_version: tuple[int, ...] = (1, 5, 2)
) -> list[PodGroup]:
    """The head, each worker group's pods, and the submitter (K8sJobMode)."""
    from rlctl.core.k8s.admission import group

    name = rayjob["metadata"]["name"]
    spec = rayjob["spec"]
    cluster = spec["rayClusterSpec"]
    rv = cluster.get("rayVersion")
    head = cluster["headGroupSpec"]["template"]
    out = [
        group(
            f"RayJob {name}, head",
            "ray-head",
            head.get("metadata") or {},
            _ray_pod(head["spec"], True, rv, kuberay_version),
        )
    ]
    for g in cluster.get("workerGroupSpecs") or []:
        t = g["template"]
        out.append(
            group(
                f"RayJob {name}, worker group {g['groupName']}",
                "ray-generator" if g["groupName"] == GENERATOR_GROUP else "ray-worker",
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
            group(
                f"RayJob {name}, submitter",
                "ray-submitter",
                tmpl.get("metadata") or {},
                tmpl["spec"],
            )
        )
    return out


def rayjob_phase(workload: dict[str, Any]) -> tuple[Phase | None, str | None]:
    """A RayJob's ``jobDeploymentStatus`` and ``jobStatus`` as a phase: unlike a JobSet
    it says when the job runs."""
    from rlctl.core.phases import Phase

    status = workload.get("status") or {}
    deploy = status.get("jobDeploymentStatus") or ""
    job = status.get("jobStatus") or ""
    msg = status.get("message") or None
    if (deploy == "Complete" and job == "SUCCEEDED") or job == "SUCCEEDED":
        return Phase.COMPLETED, None
    if deploy == "Failed" or job in ("FAILED", "STOPPED"):
        return Phase.FAILED, msg or f"Ray job {job.lower() or 'failed'}"
    if deploy == "Suspended" or (workload.get("spec") or {}).get("suspend"):
        return Phase.SUSPENDED, None
    if job == "RUNNING":
        return Phase.RUNNING, None
    return Phase.PENDING, msg


class RayBackend(Backend):
    name = "ray"
    template = "rayjob.yaml.j2"
    api_version = "ray.io/v1"
    kind = "RayJob"
    help = "a KubeRay RayJob, elastic over slices"
    crd_schema = "rayjob-ray.io-v1.json"
    config_files: Mapping[str, str] = MappingProxyType({"ray_driver.py": "ray_driver.py.j2"})
    # KubeRay is GKE's own add-on, enabled with the cluster: rlctl installs no controller
    gke_addons: Mapping[str, str] = MappingProxyType({"ray_operator_config": "RayOperator"})
    # the driver's output, the trainer's lines with it, goes to the submitter
    # ('ray job logs --follow', KubeRay's K8sJobMode), not to the head's log
    leader_container = "ray-job-submitter"

    @property
    def object_kinds(self) -> tuple[str, ...]:
        return (self.kind, "RayCluster")  # a RayCluster's templates validate the same way

    generator_group = True  # a worker group "generator" and a Ray task on it

    def pod_groups(
        self, obj: dict[str, Any], controller_version: tuple[int, ...] | None = None
    ) -> list[PodGroup]:
        """``controller_version``: the KubeRay whose probe injection to model (None: 1.5.2,
        the last with exec probes only and so the stricter: GKE's add-on does not
        publish its version)."""
        return rayjob_groups(obj, controller_version or KUBERAY_ASSUMED)

    def phase(self, workload: dict[str, Any]) -> tuple[Phase | None, str | None]:
        return rayjob_phase(workload)

    def pod_selectors(self, run: str) -> tuple[str, ...]:
        return (run_selector(run),)  # KubeRay copies the templates' labels

    def embedded_templates(self, obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        spec = obj.get("spec") or {}
        rc = spec.get("rayClusterSpec", spec) if obj.get("kind") == self.kind else spec
        yield pod_template(
            "spec.rayClusterSpec.headGroupSpec.template",
            rc.get("headGroupSpec", {}).get("template") or {},
        )
        for i, g in enumerate(rc.get("workerGroupSpecs") or []):
            yield pod_template(
                f"spec.rayClusterSpec.workerGroupSpecs[{i}].template", g.get("template") or {}
            )

    def view_fields(self, view: View) -> Mapping[str, Any]:
        """rayVersion (the Ray the image pins), Ray's metrics export port and its name of
        the TPU generation (on TPU slices)."""
        fields: dict[str, Any] = {
            "ray_version": image_ray_version(),
            "metrics_export_port": RAY_METRICS_EXPORT_PORT,
            "generator_group": GENERATOR_GROUP,
            "generator_resource": GENERATOR_RESOURCE,
            "learner_resource": LEARNER_RESOURCE,
        }
        if view.shape.kind == "tpu":
            fields["accelerator_type"] = ray_accelerator_type(view.shape.accelerator)
        return MappingProxyType(fields)

    def crd_fix(self, cluster: str, where: str) -> str:
        return (
            "(GKE's Ray operator add-on is off): run 'gcloud container clusters update "
            f"{cluster}{where} --update-addons=RayOperator=ENABLED'"
        )


BACKEND = RayBackend()
