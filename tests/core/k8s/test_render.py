"""Rendered workloads: every backend x {1, 2 slices} x {TPU, GPU where it applies}
validates strictly against the CRD schemas and kubernetes-validate --strict."""

from __future__ import annotations

import copy
import json

import pytest

from rlctl.core.errors import ConfigError
from rlctl.core.k8s import backends
from rlctl.core.k8s.render import WorkloadView, make_view, render_workload
from rlctl.core.k8s.shapes import SliceShape
from rlctl.core.k8s.validate import ManifestError, validate_manifests
from tests.core.k8s.conftest import HF_SENTINEL, make_spec
from tests.fakes.shapes import h100_8, v6e_16

CASES = [
    (b.name, kind, n)
    for b in backends.registered()
    for kind in ("tpu", "gpu")
    for n in (1, 2)
    if not (b.tpu_only and kind == "gpu")
]


def shape(kind: str, slices: int) -> SliceShape:
    return v6e_16(slices) if kind == "tpu" else h100_8(hosts=2, num_slices=slices)


def view(backend: str = "jobset", kind: str = "tpu", slices: int = 1, **kw) -> WorkloadView:
    spec = make_spec(kw.pop("name", "r1"))
    fields = dict(
        run=spec.name,
        backend=backend,
        image="us-docker.pkg.dev/p/r/rlctl:1",
        run_uri=f"gs://bkt/runs/{spec.name}",
        shape=shape(kind, slices),
        hf_secret=f"{spec.name}-hf-token",
        dcn_networks=["dcn-a", "dcn-b"] if slices > 1 and kind == "tpu" else [],
    )
    return make_view(**{**fields, **kw})


def by_kind(objs: list[dict]) -> dict[str, dict]:
    return {o["kind"]: o for o in objs}


def pod_specs(node) -> list[dict]:
    """Every pod spec in a workload (the objects that list containers), in order."""
    if isinstance(node, list):
        return [p for n in node for p in pod_specs(n)]
    if not isinstance(node, dict):
        return []
    if isinstance(node.get("containers"), list):
        return [node]
    return [p for v in node.values() for p in pod_specs(v)]


def env(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or []}


@pytest.mark.parametrize(("backend", "kind", "slices"), CASES)
class TestEveryBackendValidates:
    def test_strictly_valid(self, crds, backend, kind, slices):
        validate_manifests(render_workload(view(backend, kind, slices)), crds)

    def test_shared_pieces(self, crds, backend, kind, slices):
        objs = render_workload(view(backend, kind, slices))
        for o in objs:
            labels = o["metadata"]["labels"]
            assert labels["managed-by"] == "rlctl"
            if o["kind"] != "ServiceAccount":
                assert labels["rlctl.dev/run"] == "r1"
        ksa = by_kind(objs)["ServiceAccount"]
        assert "annotations" not in ksa["metadata"]  # principal-based WI: no annotation
        # the pods read the spec from the run store; only Ray has files to mount
        assert ("ConfigMap" in by_kind(objs)) == (backend == "ray")
        workload = objs[-1]
        if backend == "ray":  # KubeRay's submitter only talks to the Ray dashboard: no
            # KSA (no bucket access), no volumes, no token; its own test is test_upstream
            submitter = workload["spec"].pop("submitterPodTemplate")["spec"]
            assert "serviceAccountName" not in submitter and "volumes" not in submitter
        for pod in pod_specs(workload):
            assert pod["serviceAccountName"] == "rlctl"
            assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
            for c in pod["containers"]:
                assert env(c)["HF_TOKEN"] == {
                    "secretKeyRef": {"name": "r1-hf-token", "key": "token"}
                }
                assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
                assert "RLCTL_SPEC_FILE" not in env(c)
                assert c["resources"]["requests"]
        if backend != "ray":  # the trainer entrypoint on the run (Ray: via the driver)
            c = pod_specs(workload)[0]["containers"][0]
            entry = ["python", "-m", "rlctl.core.runs.pod", "--run", "gs://bkt/runs/r1"]
            if backend == "lws":  # a StatefulSet's pods restart always: a shell idles them
                assert c["command"][:2] == ["sh", "-c"]
                assert c["command"][2].startswith(
                    'python -m rlctl.core.runs.pod --run "$RLCTL_RUN";'
                )
                assert env(c)["RLCTL_RUN"] == entry[-1]
            else:
                assert c["command"] == entry


class TestJobSet:
    def test_tpu_multislice_layout(self, crds):
        js = render_workload(view("jobset", "tpu", 2))[-1]
        (rj,) = js["spec"]["replicatedJobs"]
        assert rj["replicas"] == 2
        job = rj["template"]["spec"]
        assert (job["completionMode"], job["parallelism"], job["completions"]) == ("Indexed", 4, 4)
        pod = job["template"]["spec"]
        assert pod["nodeSelector"] == {
            "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
            "cloud.google.com/gke-tpu-topology": "4x4",
        }
        c = pod["containers"][0]
        assert c["resources"]["limits"] == {"google.com/tpu": 4, "memory": "628Gi"}
        assert c["resources"]["requests"]["google.com/tpu"] == 4
        e = env(c)
        assert e["MEGASCALE_NUM_SLICES"] == "2" and e["MEGASCALE_PORT"] == "9915"
        assert e["MEGASCALE_SLICE_ID"] == {
            "fieldRef": {"fieldPath": "metadata.annotations['jobset.sigs.k8s.io/job-index']"}
        }
        assert e["MEGASCALE_COORDINATOR_ADDRESS"] == "r1-slice-0-0.r1"
        fp = js["spec"]["failurePolicy"]
        assert fp["maxRestarts"] == 3 and all(r["name"] for r in fp["rules"])
        assert pod["resourceClaims"] == [{"name": "dcn", "resourceClaimTemplateName": "r1-dcn"}]

    def test_gpu_variant(self, crds):
        js = render_workload(view("jobset", "gpu", 2))[-1]
        (rj,) = js["spec"]["replicatedJobs"]
        pod = rj["template"]["spec"]["template"]["spec"]
        assert rj["template"]["spec"]["parallelism"] == 4  # 2 slices x 2 hosts
        assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
        assert pod["containers"][0]["resources"]["limits"] == {
            "nvidia.com/gpu": 8,
            "memory": "1644Gi",
        }
        assert env(pod["containers"][0])["JAX_NUM_PROCESSES"] == "4"


class TestPathways:
    def test_layout(self, crds):
        pj = render_workload(view("pathways", "tpu", 2))[-1]
        assert pj["spec"]["workers"] == [
            {"type": "ct6e-standard-4t", "topology": "4x4", "numSlices": 2, "maxSliceRestarts": 3}
        ]
        c = pj["spec"]["controller"]["template"]["spec"]["containers"][0]
        assert env(c)["JAX_PLATFORMS"] == "proxy"
        assert pj["spec"]["controller"]["mainContainerName"] == c["name"]

    def test_gpu_is_refused(self):
        with pytest.raises(ConfigError, match="TPU slices only"):
            view("pathways", "gpu", 1)

    def test_the_server_images_are_the_release_of_the_trainers_jax(self, crds):
        """Without pathwaysVersion the controller pulls ':latest' (pathways-job v0.1.4,
        MakeComponentImage), whatever JAX the trainer's IFRT proxy client runs."""
        from rlctl.core.image.context import read_lock
        from rlctl.core.image.lock import parse_lock

        pj = render_workload(view("pathways", "tpu", 2))[-1]
        validate_manifests([pj], crds)
        assert pj["spec"]["pathwaysVersion"] == f"jax-{parse_lock(read_lock('tpu'))['jax']}"

    def test_what_the_head_pod_needs_is_on_the_pathwaysjob_itself(self):
        """The controller builds the head pod's metadata from the PathwaysJob's annotations
        only: the GCS FUSE webhook's go there, and the template carries no metadata."""
        pj = render_workload(view("pathways", "tpu", 2, gcs_buckets=["models-b"]))[-1]
        assert pj["metadata"]["annotations"]["gke-gcsfuse/volumes"] == "true"
        tmpl = pj["spec"]["controller"]["template"]
        assert "metadata" not in tmpl
        (vol,) = [v for v in tmpl["spec"]["volumes"] if v["name"] == "gcs-0"]
        assert vol["csi"]["volumeAttributes"]["hostNetworkPodKSA"] == "true"
        no_gcs = render_workload(view("pathways", "tpu", 2))[-1]
        assert not any(k.startswith("gke-gcsfuse/") for k in no_gcs["metadata"]["annotations"])


class TestRay:
    def test_worker_group_probes_and_driver(self, crds):
        objs = render_workload(view("ray", "tpu", 2, min_slices=1, max_restarts=5))
        rj = objs[-1]
        (wg,) = rj["spec"]["rayClusterSpec"]["workerGroupSpecs"]
        assert (wg["numOfHosts"], wg["replicas"], wg["minReplicas"], wg["maxReplicas"]) == (
            4,
            2,
            1,
            2,
        )
        head = rj["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
        assert head["readinessProbe"]["httpGet"]["port"] == 8265
        assert head["startupProbe"]["tcpSocket"]["port"] == 6379
        driver = by_kind(objs)["ConfigMap"]["data"]["ray_driver.py"]
        compile(driver, "ray_driver.py", "exec")
        assert "num_workers=(MIN_WORKERS, MAX_WORKERS)" in driver
        assert "MIN_WORKERS = 4" in driver and "MAX_WORKERS = 8" in driver
        assert "FailureConfig(max_failures=MAX_FAILURES)" in driver and "MAX_FAILURES = 5" in driver
        rct = by_kind(objs)["ResourceClaimTemplate"]
        # the seed's two-netdev claim: one request of ExactCount 2, no selector
        (req,) = rct["spec"]["spec"]["devices"]["requests"]
        assert req["exactly"] == {
            "deviceClassName": "netdev.google.com",
            "allocationMode": "ExactCount",
            "count": 2,
        }


class TestSliceCoordinates:
    """Issue 55 points 1, 4 and 5: the megascale coordinates only where several slices
    meet, never baked into a Ray worker, and a finished RayJob lets its hosts go."""

    @pytest.mark.parametrize("backend", ["jobset", "ray"])
    def test_one_slice_gets_no_megascale_variable_or_port(self, backend, crds):
        objs = render_workload(view(backend, "tpu", 1))
        validate_manifests(objs, crds)
        hosts = [p for p in pod_specs(objs[-1]) if "nodeSelector" in p]
        assert hosts
        for c in (c for p in hosts for c in p["containers"]):
            assert not [k for k in env(c) if k.startswith("MEGASCALE_")], env(c)
            assert not [p for p in c.get("ports", []) if p["name"] == "megascale"]

    def test_ray_workers_carry_no_slice_count_of_their_own(self, crds):
        """Ray Train's JAX backend sets the coordinates for the group it starts (ray
        2.60.0, train/v2/jax/config.py): a baked MEGASCALE_NUM_SLICES=2 would outlive a
        shrink to one slice."""
        objs = render_workload(view("ray", "tpu", 2, min_slices=1))
        (wg,) = objs[-1]["spec"]["rayClusterSpec"]["workerGroupSpecs"]
        (c,) = wg["template"]["spec"]["containers"]
        e = env(c)
        assert e["MEGASCALE_PORT"] == "9915"
        assert not {"MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID"} & set(e)

    def test_a_finished_rayjob_keeps_no_hosts(self):
        rj = render_workload(view("ray", "tpu", 2))[-1]
        assert rj["spec"]["shutdownAfterJobFinishes"] is True
        assert rj["spec"]["ttlSecondsAfterFinished"] == 0


class TestValidatorIsStrict:
    @pytest.mark.parametrize(
        ("backend", "path", "bad"),
        [
            ("jobset", ["spec"], "replicatedJob"),
            (
                "jobset",
                ["spec", "replicatedJobs", 0, "template", "spec", "template", "spec"],
                "nodeSelecter",
            ),
            (
                "jobset",
                [
                    "spec",
                    "replicatedJobs",
                    0,
                    "template",
                    "spec",
                    "template",
                    "spec",
                    "containers",
                    0,
                ],
                "imagePullPolicyy",
            ),
            ("ray", ["spec", "rayClusterSpec", "workerGroupSpecs", 0], "numOfHost"),
            ("ray", ["spec", "rayClusterSpec", "headGroupSpec", "template", "metadata"], "label"),
            ("pathways", ["spec", "workers", 0], "numSlice"),
            ("pathways", ["spec", "controller", "template", "spec", "containers", 0], "envv"),
        ],
    )
    def test_a_misspelt_field_is_caught_with_its_path(self, crds, backend, path, bad):
        objs = render_workload(view(backend, "tpu", 1))
        broken = copy.deepcopy(objs[-1])
        node = broken
        for p in path:
            node = node[p]
        node[bad] = "x"
        with pytest.raises(ManifestError) as e:
            validate_manifests([broken], crds)
        assert any(bad in err for err in e.value.errors), e.value.errors

    def test_core_kinds_are_strict_too(self, crds):
        cm = copy.deepcopy(render_workload(view())[1])
        cm["dataa"] = {}
        with pytest.raises(ManifestError, match="dataa"):
            validate_manifests([cm], crds)

    def test_a_wrong_type_is_caught(self, crds):
        js = copy.deepcopy(render_workload(view())[-1])
        js["spec"]["failurePolicy"]["maxRestarts"] = "three"
        with pytest.raises(ManifestError, match=r"failurePolicy\.maxRestarts"):
            validate_manifests([js], crds)


EVIL = [
    'he said "hi"',
    "line1\nline2: x",
    "{{ 7*7 }} {% if %}",
    "a: b",
    "- [x]: {y}",
    "'; kind: Secret",
    "\u2028tab\there #c",
    "&anchor *ref !!python/object",
]


class TestYamlInjection:
    @pytest.mark.parametrize("name", ['r1"', "r1\nkind: Secret", "{{r}}", "r: 1", "R1", "r1 "])
    def test_a_crafted_run_name_is_a_validation_error(self, name):
        with pytest.raises(ConfigError, match="run name"):
            make_view(run=name, backend="jobset", image="i", run_uri="gs://b/r", shape=v6e_16())

    @pytest.mark.parametrize("evil", EVIL)
    def test_crafted_values_round_trip_exactly(self, crds, evil):
        objs = render_workload(
            view("ray", "tpu", 1, image=evil, env=[{"name": "NOTE", "value": evil}])
        )
        validate_manifests(objs, crds)
        cm = by_kind(objs)["ConfigMap"]
        assert list(cm["data"]) == ["ray_driver.py"]
        head = objs[-1]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
        assert head["containers"][0]["image"] == evil
        assert env(head["containers"][0])["NOTE"] == evil
        assert [o["kind"] for o in objs] == ["ServiceAccount", "ConfigMap", "RayJob"]

    def test_bad_quantities_and_env_names_are_refused(self):
        with pytest.raises(ConfigError, match="quantity"):
            view(memory="1Gi\nkind: Secret")
        with pytest.raises(ConfigError, match="environment variable"):
            view(env=[{"name": "A: b", "value": "x"}])


def test_no_manifest_holds_the_token_value(crds, monkeypatch):
    """The token is only ever referenced by Secret name, whatever the environment holds."""
    monkeypatch.setenv("HF_TOKEN", HF_SENTINEL)
    for backend, kind, slices in CASES:
        objs = render_workload(view(backend, kind, slices))
        assert HF_SENTINEL not in json.dumps(objs)


class TestKueue:
    """--queue and --priority: Kueue's labels on the job object, on every backend whose
    kind Kueue integrates (kueue pkg/controller/jobs: JobSet, RayJob, LeaderWorkerSet)."""

    @pytest.mark.parametrize("backend", [b.name for b in backends.registered() if b.queueable])
    def test_the_workload_carries_its_queue_and_priority(self, crds, backend):
        objs = render_workload(view(backend, "tpu", 2, queue="team-a", priority="high"))
        validate_manifests(objs, crds)
        labels = objs[-1]["metadata"]["labels"]
        assert labels["kueue.x-k8s.io/queue-name"] == "team-a"
        assert labels["kueue.x-k8s.io/priority-class"] == "high"
        assert all("kueue.x-k8s.io/queue-name" not in o["metadata"]["labels"] for o in objs[:-1])

    def test_none_without_the_flags(self):
        objs = render_workload(view("jobset", "tpu", 2))
        assert not [k for k in objs[-1]["metadata"]["labels"] if k.startswith("kueue")]

    def test_a_kind_kueue_does_not_queue_is_one_line(self):
        with pytest.raises(ConfigError, match="Kueue has no integration for the pathways"):
            view("pathways", "tpu", 2, queue="team-a")

    def test_a_bad_queue_name_is_one_line(self):
        with pytest.raises(ConfigError, match="queue: Value error, 'Team_A' is not a Kueue"):
            view("jobset", "tpu", 2, queue="Team_A")
        assert view("jobset", "tpu", 2, queue="gpu.team-a").queue == "gpu.team-a"
