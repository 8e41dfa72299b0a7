"""Cluster runs end to end through typer's CliRunner: ``train --cluster``, ``status``,
``logs``, ``resume`` and ``delete run``.

The real google-cloud clients talk to the fake GCP server (GKE + fake-gcs-server
for the run store) and the real ``kubernetes`` client to a fake Kubernetes API,
both on 127.0.0.1, all injected through ``AppState(clients=...)``. The seeded GKE
cluster's endpoint is the fake Kubernetes API, so the lookup -> Kubernetes client
path is the production one.
"""

from __future__ import annotations

import json

import pytest

from rlctl.core.k8s import backends
from tests.core.k8s.conftest import HF_SENTINEL, KUBE_TOKEN
from tests.fakes.k8s import nodes_of_cluster

IMAGE = "us-docker.pkg.dev/p/r/rlctl:1"
LOC = ["--project", "p", "--region", "us-central1"]
BUCKET = "c-runs"
STORE = f"gs://{BUCKET}/runs"
RUN = "r1"
JOBSET = ("jobset.x-k8s.io/v1alpha2", "jobsets", "default", RUN)


@pytest.fixture(autouse=True)
def _hf_token(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", HF_SENTINEL)


@pytest.fixture()
def kube():
    pytest.importorskip("kubernetes")
    from tests.fakes.k8s import FakeKube

    with FakeKube() as k:
        yield k


@pytest.fixture()
def clients(fake, kube):
    """The production factory at the fakes, with credentials that hold an access token."""
    from google.oauth2.credentials import Credentials

    from rlctl.core.clients import SERVICES, Clients

    c = Clients(
        "p",
        "us-central1",
        Credentials(token=KUBE_TOKEN),
        {s: fake.url for s in SERVICES},
        retry_initial=0.01,
        poll_interval=0.01,
        retry_deadline=5.0,
    )
    _seed_cluster(fake, kube.url)
    kube.seed_ready()  # what 'cluster create' installs: CRDs, namespace, KSA
    kube.nodes = nodes_of_cluster(fake, "c")  # applied workloads become scheduled pods
    _seed_image(fake)  # what 'rlctl image build' pushed
    bucket = c.storage.bucket(BUCKET)
    bucket.labels = {"managed-by": "rlctl", "rlctl-cluster": "c"}
    c.storage.create_bucket(bucket, location="US-CENTRAL1")
    yield c
    for b in c.storage.list_blobs(BUCKET):
        b.delete()


def _seed_image(fake) -> None:
    fake.repositories[("us", "r")] = {"name": "projects/p/locations/us/repositories/r"}
    fake.docker_images[("us", "r", "rlctl")] = {"1": "sha256:" + "2" * 64}


def _seed_cluster(fake, endpoint: str) -> None:
    """A cluster as 'rlctl cluster create c -a "v6e-16 x2"' makes it (tests/fakes/seed.py:
    the production request bodies), with the seeds' older GKE version."""
    from tests.fakes.seed import seed_cluster

    doc = seed_cluster(fake, "c", ("v6e-16 x2",), endpoint=endpoint, version="1.33.1-gke.1")
    doc["resourceLabels"] = {"managed-by": "rlctl", "rlctl-cluster": "c"}


@pytest.fixture()
def cli(clients, crds, kube):
    from typer.testing import CliRunner

    from rlctl.cli._options import AppState
    from rlctl.cli.app import app

    calls = []

    def invoke(*args: str):
        r = CliRunner().invoke(app, list(args), obj=AppState(clients=clients))
        calls.append(r)
        return r

    invoke.calls = calls  # type: ignore[attr-defined]
    yield invoke
    for r in calls:  # no command ever shows a secret
        assert HF_SENTINEL not in r.stdout + r.stderr
        assert KUBE_TOKEN not in r.stdout + r.stderr
    # and no workload a command applied has a pod that no node of the cluster can take
    assert kube.unschedulable == []


def _submit(cli, *extra: str):
    return cli(
        "train",
        "grpo",
        "--cluster",
        "c",
        *LOC,
        "--image",
        IMAGE,
        "--name",
        RUN,
        "--steps",
        "4",
        *extra,
    )


def _store_text(clients) -> str:
    return "".join(b.download_as_text() for b in clients.storage.list_blobs(BUCKET))


def _pod(kube, phase: str = "Running", scheduled: bool = True) -> None:
    status: dict = {"phase": phase}
    if not scheduled:
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient google.com/tpu.",
            }
        ]
    kube.put(
        "v1",
        "pods",
        {
            "metadata": {
                "name": f"{RUN}-slice-0-0-abcde",
                "labels": {"managed-by": "rlctl", "rlctl.dev/run": RUN},
            },
            "spec": {
                "containers": [{"name": "trainer"}],
                "nodeSelector": {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice"},
            },
            "status": status,
        },
    )


class TestTrainOnCluster:
    def test_dry_run_json_prints_only_the_manifests_and_changes_nothing(self, cli, kube, clients):
        r = _submit(cli, "--dry-run", "-o", "json")
        assert r.exit_code == 0, r.stderr
        objs = json.loads(r.stdout)  # nothing else on stdout
        kinds = [o["kind"] for o in objs]
        assert kinds == ["ServiceAccount", "JobSet"]
        js = objs[-1]
        assert js["metadata"]["name"] == RUN
        assert (
            len(
                js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
                    "containers"
                ]
            )
            >= 1
        )
        text = json.dumps(objs)
        assert "tpu-v6e-slice" in text and "4x4" in text and IMAGE in text
        assert STORE in text  # the pods use the cluster's bucket as the run store
        assert HF_SENTINEL not in text
        assert kube.mutations() == [] and _store_text(clients) == ""
        assert "dry run" in r.stderr

    def test_dry_run_for_humans_is_yaml(self, cli, kube):
        r = _submit(cli, "--dry-run", "--backend", "ray")
        assert r.exit_code == 0, r.stderr
        assert "kind: RayJob" in r.stdout and "\n---\n" in r.stdout
        assert kube.mutations() == []

    def test_dry_run_shows_the_rollout_engine_the_pods_pick(self, cli, kube):
        """rollout.engine resolved for the accelerator and rlctl's image (its lock), on the
        workload and in the run's first lines; another --image decides in its pods."""
        ours = "us-central1-docker.pkg.dev/p/rlctl/rlctl-tpu:0.1-abc"
        for image, want in ((ours, "vanilla"), (IMAGE, "auto")):
            r = cli(
                "train",
                "grpo",
                "--cluster",
                "c",
                *LOC,
                "--image",
                image,
                "--name",
                RUN,
                "--dry-run",
                "-o",
                "json",
            )
            assert r.exit_code == 0, r.stderr
            js = json.loads(r.stdout)[-1]
            assert js["metadata"]["annotations"]["rlctl.dev/rollout-engine"] == want
            assert (
                js["metadata"]["annotations"]["alpha.jobset.sigs.k8s.io/exclusive-topology"]
                == "cloud.google.com/gke-nodepool"
            )
        assert "rollout engine: rollout.engine=auto: decided in the pods" in r.stderr
        r = cli(
            "train",
            "grpo",
            "--cluster",
            "c",
            *LOC,
            "--image",
            ours,
            "--name",
            RUN,
            "--dry-run",
            "--backend",
            "ray",
        )
        assert "rlctl.dev/rollout-engine: vanilla" in r.stdout
        assert (
            "rollout engine: rollout.engine=auto: vanilla on tpu (rlctl's tpu image has "
            "no vLLM)" in r.stderr
        )

    def test_vllm_where_rlctls_image_has_none_fails_before_anything(self, cli, kube, clients):
        ours = "us-central1-docker.pkg.dev/p/rlctl/rlctl-tpu:0.1-abc"
        for extra in ([], ["--dry-run"]):
            r = cli(
                "train",
                "grpo",
                "--cluster",
                "c",
                *LOC,
                "--image",
                ours,
                "--name",
                RUN,
                "--set",
                "rollout.engine=vllm",
                *extra,
            )
            assert r.exit_code == 2, r.stderr
            assert "rlctl's tpu image carries no vLLM" in r.stderr
            assert "Traceback" not in r.stderr
        assert kube.mutations() == [] and _store_text(clients) == ""

    def test_a_split_rollout_across_hosts_is_refused_before_anything(self, cli, kube, clients):
        """A split runs in one process for now (issue 54): two v6e-16 slices are eight
        JobSet processes, so the pods' trainer would refuse it after the slices were
        paid for; the plan refuses it first, naming what does run."""
        for extra in ([], ["--dry-run"]):
            r = _submit(cli, "--set", "rollout.placement=split", *extra)
            assert r.exit_code == 2, r.stderr
            assert "rollout.placement=split runs in one process for now; 8 hosts" in r.stderr
            assert "--set rollout.placement=colocated" in r.stderr
            assert "Traceback" not in r.stderr
            # generator pods of their own need a slice of one host: not on a TPU cluster
            r = _submit(cli, "--set", "rollout.placement=process", *extra)
            assert r.exit_code == 2, r.stderr
            assert "needs a v6e-16 slice of one host of its own" in r.stderr
            assert "or a GPU cluster" in r.stderr
        assert kube.mutations() == [] and _store_text(clients) == ""

    @pytest.mark.parametrize(
        ("backend", "sets", "line"),
        [
            (
                "jobset",
                ["rollout.max_staleness=1"],
                "rollout: colocated, at most 1 version(s) behind",
            ),
            (
                "pathways",  # one controller over the 32 chips
                ["rollout.placement=split", "rollout.max_staleness=2", "rollout.devices=8"],
                "rollout: split, the generator on 8 of the 32 devices and the learner on 24, "
                "at most 2 version(s) behind",
            ),
        ],
    )
    def test_the_plan_says_how_a_pipelined_rollout_is_placed(self, cli, backend, sets, line):
        extra = [x for s in sets for x in ("--set", s)]
        r = _submit(cli, "--backend", backend, "--dry-run", *extra)
        assert r.exit_code == 0, r.stderr
        assert line in r.stderr

    def test_submit_creates_exactly_the_run_objects_and_writes_the_store(self, cli, kube, clients):
        r = _submit(cli, "-o", "json")
        assert r.exit_code == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["name"] == RUN and out["path"] == f"{STORE}/{RUN}"
        assert out["cluster"] == "c" and out["accelerator"] == "v6e-16"
        assert kube.names() == ["JobSet/r1", "Secret/r1-hf-token", "ServiceAccount/rlctl"]
        js = kube.objects[JOBSET]
        assert js["spec"]["replicatedJobs"][0]["replicas"] == 2  # two v6e-16 pools
        assert {r["authorization"] for r in kube.requests} == {f"Bearer {KUBE_TOKEN}"}
        st = json.loads(
            clients.storage.bucket(BUCKET).blob(f"runs/{RUN}/status.json").download_as_text()
        )
        assert st["cluster"] == "c" and st["backend"] == "jobset" and st["image"] == IMAGE
        assert HF_SENTINEL not in _store_text(clients)
        others = [o for k, o in kube.objects.items() if k[1] != "secrets"]
        assert HF_SENTINEL not in json.dumps(others)

    def test_runs_go_to_the_namespace_and_account_the_cluster_was_made_with(
        self, cli, kube, fake, clients
    ):
        """'cluster create --namespace ml --service-account trainer' bound the bucket to
        ml/trainer; a run anywhere else would be refused by the bucket."""
        fake.clusters[("us-central1", "c")]["resourceLabels"].update(
            {"rlctl-namespace": "ml", "rlctl-ksa": "trainer"}
        )
        # not made yet: refused before anything is written, naming the fix
        r = _submit(cli)
        assert r.exit_code == 2 and "namespace 'ml' does not exist" in r.stderr
        assert (
            "rlctl cluster create c --region us-central1 --namespace ml "
            "--service-account trainer" in r.stderr
        )
        assert not list(clients.storage.list_blobs(BUCKET))
        kube.seed_ready("ml", "trainer")
        assert _submit(cli).exit_code == 0
        kinds = {(k[2], k[3]) for k in kube.objects}
        assert ("ml", RUN) in kinds and ("default", RUN) not in kinds
        js = kube.objects[("jobset.x-k8s.io/v1alpha2", "jobsets", "ml", RUN)]
        pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "trainer"
        assert kube.objects[("v1", "serviceaccounts", "ml", "trainer")]
        st = json.loads(
            clients.storage.bucket(BUCKET).blob(f"runs/{RUN}/status.json").download_as_text()
        )
        assert (st["namespace"], st["service_account"]) == ("ml", "trainer")

    def test_runs_dir_must_be_gs(self, cli, kube, tmp_path):
        r = _submit(cli, "--runs-dir", str(tmp_path), "--dry-run")
        assert r.exit_code == 2 and "gs://" in r.stderr and kube.mutations() == []

    def test_without_image_the_built_one_is_picked_and_checked(self, cli, fake, kube, monkeypatch):
        from rlctl.core.gcp.image import default_tag

        monkeypatch.delenv("RLCTL_IMAGE", raising=False)
        want = f"us-central1-docker.pkg.dev/p/rlctl/rlctl-tpu:{default_tag('tpu')}"
        r = cli("train", "grpo", "--cluster", "c", *LOC, "--name", RUN, "--dry-run", "-o", "json")
        assert r.exit_code == 0, r.stderr
        assert (
            json.loads(r.stdout)[-1]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"][
                "spec"
            ]["containers"][0]["image"]
            == want
        )
        # not built yet: refused before anything is written, naming the command
        r = cli("train", "grpo", "--cluster", "c", *LOC, "--name", RUN)
        assert r.exit_code == 2
        assert (
            f"image {want} does not exist: run 'rlctl image build --cluster c "
            "--region us-central1 --accelerator tpu'" in r.stderr
        )
        assert kube.names("jobsets") == []
        # built: submitted with it
        fake.repositories[("us-central1", "rlctl")] = {"name": "x"}
        fake.docker_images[("us-central1", "rlctl", "rlctl-tpu")] = {
            default_tag("tpu"): "sha256:" + "1" * 64
        }
        r = cli("train", "grpo", "--cluster", "c", *LOC, "--name", RUN, "--steps", "4")
        assert r.exit_code == 0, r.stderr
        assert kube.names("jobsets") == ["JobSet/r1"]

    def test_a_missing_artifact_registry_image_is_refused(self, cli, fake):
        fake.docker_images.clear()
        r = _submit(cli)  # IMAGE is in Artifact Registry (us-docker.pkg.dev/p/r)
        assert r.exit_code == 2 and f"image {IMAGE} does not exist" in r.stderr

    @pytest.mark.parametrize("dry_run", [True, False])
    def test_a_pathways_server_tag_no_one_publishes_is_refused_with_the_newest(
        self, cli, fake, kube, dry_run
    ):
        """#55 point 2: the PathwaysJob's pathwaysVersion is derived from the TPU image's
        JAX; a tag Google has not published would fail every Pathways pod's pull after the
        slices were paid for. Looked up in the public registry (the fake's Artifact
        Registry answers for Google's project as the real one does)."""
        from rlctl.core.k8s.backends.pathways import (
            PROXY_IMAGE,
            SERVER_IMAGE,
            image_pathways_version,
        )

        tag = image_pathways_version()
        for key, tags in fake.public_images.items():
            if key[3] == "server":
                tags.pop(tag)
        r = _submit(cli, "--backend", "pathways", *(["--dry-run"] if dry_run else []))
        assert r.exit_code == 2, r.stderr
        (line,) = [x for x in r.stderr.splitlines() if SERVER_IMAGE in x]
        assert f"image {SERVER_IMAGE}:{tag} (the Pathways server pathways-job runs)" in line
        assert "does not exist in its registry; the newest tag there is jax-0.9.0" in line
        assert "use another --backend (not pathways)" in line
        assert PROXY_IMAGE not in r.stderr  # published: no line
        assert kube.names("pathwaysjobs") == []  # nothing applied
        r = _submit(cli, "--backend", "jobset", "--dry-run")  # pulls none of them
        assert r.exit_code == 0, r.stderr

    def test_an_unknown_cluster_is_not_found(self, cli):
        r = cli("train", "grpo", "--cluster", "nope", *LOC, "--image", IMAGE, "--dry-run")
        assert r.exit_code == 3 and "cluster 'nope' not found" in r.stderr


def _with_dcn(fake) -> None:
    """The seeds' cluster: each v6e-16 pool attached to two DCN networks (DRANET)."""
    for pool in fake.clusters[("us-central1", "c")]["nodePools"]:
        if not pool["name"].startswith("v6e-16-"):
            continue
        pool["networkConfig"] = {
            "additionalNodeNetworkConfigs": [
                {"network": f"c-dcn-{i}", "subnetwork": f"c-dcn-{i}-sub"} for i in range(2)
            ]
        }


class TestSeedShapedDryRun:
    """train --cluster --dry-run for a v6e-16 x2 cluster with two DCN networks renders,
    per backend, the seeds' env, privileged flag, memory, DRANET claim, placement
    strategy and Train v2 driver (item by item in tests/core/k8s/test_seed_workloads.py)."""

    @pytest.mark.parametrize("backend", ["jobset", "pathways", "ray"])
    def test_each_backend(self, cli, fake, backend):
        _with_dcn(fake)
        r = _submit(cli, "--backend", backend, "--dry-run", "-o", "json")
        assert r.exit_code == 0, r.stderr
        objs = {o["kind"]: o for o in json.loads(r.stdout)}
        text = json.dumps(objs)
        if backend == "pathways":
            c = objs["PathwaysJob"]["spec"]["controller"]["template"]["spec"]["containers"][0]
            assert {"name": "ENABLE_PATHWAYS_PERSISTENCE", "value": "1"} in c["env"]
            return
        # the seed's two-netdev claim (issue 24 point 6: c255c2d selected on an attribute
        # no GKE or dranet source publishes)
        (claim,) = objs["ResourceClaimTemplate"]["spec"]["spec"]["devices"]["requests"]
        assert claim["exactly"] == {
            "deviceClassName": "netdev.google.com",
            "allocationMode": "ExactCount",
            "count": 2,
        }
        for needle in (
            '--megascale_grpc_interface_prefixes=eth1,eth2,lo"',
            '"privileged": true',
            '"value": "9915"',
            '"value": "tpu,cpu"',
            '"memory": "628Gi"',
            '"cpu": "80"',
        ):
            assert needle in text, needle
        if backend == "ray":
            driver = objs["ConfigMap"]["data"]["ray_driver.py"]
            assert 'placement_strategy="SPREAD"' in driver
            assert 'accelerator_type="TPU-V6E"' in driver
            assert "from ray.train.v2.api.config import" in driver

    def test_memory_cpu_and_min_slices_flags(self, cli, fake):
        _with_dcn(fake)
        r = _submit(
            cli,
            "--backend",
            "ray",
            "--memory",
            "200G",
            "--cpu",
            "64",
            "--min-slices",
            "1",
            "--dry-run",
            "-o",
            "json",
        )
        assert r.exit_code == 0, r.stderr
        rj = next(o for o in json.loads(r.stdout) if o["kind"] == "RayJob")
        (wg,) = rj["spec"]["rayClusterSpec"]["workerGroupSpecs"]
        assert wg["minReplicas"] == 1 and wg["maxReplicas"] == 2
        res = wg["template"]["spec"]["containers"][0]["resources"]
        assert res["requests"]["memory"] == res["limits"]["memory"] == "200G"
        assert res["requests"]["cpu"] == "64"

    def test_bad_min_slices_and_cluster_only_flags_are_one_line(self, cli, fake):
        r = _submit(cli, "--min-slices", "3", "--dry-run")
        assert r.exit_code == 2 and "--min-slices 3 is more than the cluster's 2" in r.stderr
        r = _submit(cli, "--memory", "lots", "--dry-run")
        assert r.exit_code == 2 and "'lots' is not a Kubernetes quantity" in r.stderr
        r = cli("train", "grpo", "--memory", "200G", "--dry-run")
        assert r.exit_code == 2 and "--memory is for cluster runs" in r.stderr
        assert "Traceback" not in r.stderr


class TestInputsOnGcs:
    def test_gs_inputs_are_mounted_and_the_stored_spec_reads_them_there(self, cli, kube, clients):
        r = _submit(
            cli,
            "--model",
            "gs://models-b/qwen3",
            "--dataset",
            "gsm8k",
            "--data-path",
            "gs://data-b/gsm8k/train.jsonl",
            "--backend",
            "ray",
        )
        assert r.exit_code == 0, r.stderr
        spec = clients.storage.bucket(BUCKET).blob(f"runs/{RUN}/spec.yaml").download_as_text()
        assert "source: /gcs/models-b/qwen3" in spec
        assert "path: /gcs/data-b/gsm8k/train.jsonl" in spec
        rj = kube.objects[("ray.io/v1", "rayjobs", "default", RUN)]
        for group in [
            rj["spec"]["rayClusterSpec"]["headGroupSpec"],
            *rj["spec"]["rayClusterSpec"]["workerGroupSpecs"],
        ]:
            t = group["template"]
            # the seed's sidecar limits lifted (issue 24 point 9)
            assert t["metadata"]["annotations"] == {
                "gke-gcsfuse/volumes": "true",
                "gke-gcsfuse/cpu-limit": "0",
                "gke-gcsfuse/memory-limit": "0",
                "gke-gcsfuse/ephemeral-storage-limit": "0",
            }
            vols = {v["name"]: v for v in t["spec"]["volumes"]}
            assert [
                vols[f"gcs-{i}"]["csi"]["volumeAttributes"]["bucketName"] for i in range(2)
            ] == ["models-b", "data-b"]
            mounts = t["spec"]["containers"][0]["volumeMounts"]
            assert {"name": "gcs-1", "mountPath": "/gcs/data-b", "readOnly": True} in mounts

    @pytest.mark.parametrize("backend", ["jobset", "pathways", "ray"])
    def test_every_pod_that_mounts_a_bucket_gets_its_sidecar_as_the_controllers_make_it(
        self, cli, kube, backend
    ):
        """The GCS FUSE webhook acts on a pod's annotations as its controller wrote them:
        pathways-job gives the head the PathwaysJob's own annotations only, so they are
        rendered there. Mounts are owned by the image's non-root user (uid 1000), and the
        host-network Pathways head authenticates as its KSA (hostNetworkPodKSA)."""
        r = _submit(cli, "--model", "gs://models-b/qwen3", "--backend", backend)
        assert r.exit_code == 0, r.stderr
        mounting = [
            p
            for p in kube.pods_of(RUN)
            if any(
                m["mountPath"].startswith("/gcs/")
                for c in p["spec"]["containers"]
                for m in c.get("volumeMounts") or []
            )
        ]
        assert mounting
        for pod in mounting:
            name = pod["metadata"]["name"]
            assert pod["metadata"]["annotations"].get("gke-gcsfuse/volumes") == "true", name
            assert "gke-gcsfuse-sidecar" in [c["name"] for c in pod["spec"]["initContainers"]]
            (vol,) = [v for v in pod["spec"]["volumes"] if v["name"] == "gcs-0"]
            attrs = vol["csi"]["volumeAttributes"]
            assert (
                attrs["mountOptions"]
                == "implicit-dirs,uid=1000,gid=1000,file-mode=664,dir-mode=775"
            )
            assert (attrs.get("hostNetworkPodKSA") == "true") == bool(
                pod["spec"].get("hostNetwork")
            ), name
        if backend == "pathways":
            (head,) = kube.pods_of(
                RUN, **{"jobset.sigs.k8s.io/replicatedjob-name": "pathways-head"}
            )
            assert head in mounting and head["spec"]["hostNetwork"]
            assert "rlctl.dev/run" not in head["metadata"]["labels"]  # as upstream

    def test_a_local_data_file_is_refused_before_anything_is_written(self, cli, clients, tmp_path):
        f = tmp_path / "train.jsonl"
        f.write_text('{"question": "1+1", "answer": "#### 2"}\n')
        r = _submit(cli, "--dataset", "gsm8k", "--data-path", str(f))
        assert r.exit_code == 2
        err = [x for x in r.stderr.splitlines() if x.startswith("error:")]
        assert len(err) == 1 and "the cluster's pods cannot read it" in err[0]
        assert "gcloud storage cp" in r.stderr
        assert not list(clients.storage.list_blobs(BUCKET))


class TestStatus:
    def test_merges_the_workload_state_and_the_pending_reason(self, cli, kube):
        assert _submit(cli).exit_code == 0
        _pod(kube, "Pending", scheduled=False)
        r = cli("status", RUN, "--runs-dir", STORE, "-o", "json")
        assert r.exit_code == 0, r.stderr
        info = json.loads(r.stdout)
        assert info["phase"] == "pending" and info["cluster"] == "c"
        assert info["workload"]["phase"] == "pending"
        assert "google.com/tpu" in info["reason"]

    @pytest.mark.parametrize("backend", ["jobset", "ray"])
    def test_a_queued_run_over_its_quota_waits_with_kueues_reason(self, cli, kube, backend):
        """#55 Kueue: the fake admits as Kueue v0.19.2 does (tests/fakes/kueue.py); the
        run's 32 chips against a ClusterQueue of 16: suspended, no pod, and status says
        why as Kueue's Workload does; with 64 it is admitted and runs."""
        api = "kueue.x-k8s.io/v1beta2"

        def queue(chips: int) -> None:
            kube.put(
                api, "localqueues", {"metadata": {"name": "team-a"}, "spec": {"clusterQueue": "cq"}}
            )
            kube.put(
                api,
                "clusterqueues",
                {
                    "metadata": {"name": "cq", "namespace": ""},
                    "spec": {
                        "resourceGroups": [
                            {
                                "coveredResources": ["google.com/tpu"],
                                "flavors": [
                                    {
                                        "name": "v6e",
                                        "resources": [
                                            {"name": "google.com/tpu", "nominalQuota": chips}
                                        ],
                                    }
                                ],
                            }
                        ]
                    },
                },
            )

        r = _submit(cli, "--backend", backend, "--queue", "team-a")
        assert r.exit_code == 2 and "the cluster has no Kueue LocalQueue team-a" in r.stderr
        assert kube.names(backends.get(backend).plural) == []  # refused before anything
        queue(16)
        r = _submit(cli, "--backend", backend, "--queue", "team-a", "--priority", "high")
        assert r.exit_code == 0, r.stderr
        assert kube.pods_of(RUN) == []  # suspended by Kueue: no pod
        r = cli("status", RUN, "--runs-dir", STORE, "-o", "json")
        assert r.exit_code == 0, r.stderr
        info = json.loads(r.stdout)
        assert info["workload"]["phase"] == "pending"
        assert info["reason"].startswith(
            "waiting in Kueue queue team-a: couldn't assign flavors to pod set "
        )
        assert (
            "insufficient quota for google.com/tpu in flavor v6e, previously considered "
            "podsets requests (0) + current podset request (32) > maximum capacity (16)"
        ) in info["reason"]
        assert cli("delete", "run", RUN, "--runs-dir", STORE, "--purge", "--yes").exit_code == 0
        queue(64)
        r = _submit(cli, "--backend", backend, "--queue", "team-a")
        assert r.exit_code == 0, r.stderr
        assert kube.pods_of(RUN)  # admitted: the controller made its pods

    def test_cluster_alone_finds_the_store_by_bucket_label(self, cli, kube):
        assert _submit(cli).exit_code == 0
        _pod(kube)
        r = cli("status", RUN, "--cluster", "c", *LOC)
        assert r.exit_code == 0, r.stderr
        assert "workload    running" in r.stdout
        r = cli("status", "--cluster", "c", *LOC, "-o", "json")
        assert [x["name"] for x in json.loads(r.stdout)] == [RUN]

    def test_a_finished_lws_run_says_its_pods_still_hold_the_nodes(self, cli, kube, clients):
        """An LWS never finishes: once the run store says the run is over, status says its
        pods (idling) keep their nodes until the run is deleted."""
        kube.put(
            "apiextensions.k8s.io/v1",
            "customresourcedefinitions",
            {
                "metadata": {"name": "leaderworkersets.leaderworkerset.x-k8s.io", "namespace": ""},
                "status": {"conditions": [{"type": "Established", "status": "True"}]},
            },
        )
        r = _submit(cli, "--backend", "lws")
        assert r.exit_code == 0, r.stderr
        _pod(kube)
        blob = clients.storage.bucket(BUCKET).blob(f"runs/{RUN}/status.json")
        blob.upload_from_string(
            json.dumps({**json.loads(blob.download_as_text()), "phase": "completed"})
        )
        r = cli("status", RUN, "--runs-dir", STORE, "-o", "json")
        assert r.exit_code == 0, r.stderr
        info = json.loads(r.stdout)
        assert info["phase"] == "completed" and info["workload"]["phase"] == "running"
        assert info["reason"] == (
            f"the run is over; its LeaderWorkerSet keeps its pods and their nodes until "
            f"'rlctl delete run {RUN}'"
        )

    def test_watch_refuses_json(self, cli):
        r = cli("status", RUN, "--runs-dir", STORE, "--watch", "-o", "json")
        assert r.exit_code == 2 and "table output only" in r.stderr
        assert json.loads(r.stdout)["exit_code"] == 2

    def test_watch_in_a_pipe_prints_a_line_until_the_run_ends(self, cli, kube):
        assert _submit(cli).exit_code == 0
        kube.objects[JOBSET]["status"] = {"conditions": [{"type": "Completed", "status": "True"}]}
        r = cli("status", RUN, "--runs-dir", STORE, "--watch", "--interval", "0.5")
        assert r.exit_code == 0, r.stderr
        (line,) = r.stdout.splitlines()
        assert f"  {RUN} phase=" in line and line.endswith("workload=completed")


class TestLogs:
    def test_tail_and_follow(self, cli, kube):
        assert _submit(cli).exit_code == 0
        _pod(kube)
        kube.logs[("default", f"{RUN}-slice-0-0-abcde")] = "\n".join(
            f"step {i}" for i in range(1, 6)
        )
        r = cli("logs", RUN, "--runs-dir", STORE, "--tail", "2")
        assert r.exit_code == 0, r.stderr
        assert r.stdout.splitlines() == ["step 4", "step 5"]
        r = cli("logs", RUN, "--runs-dir", STORE, "-o", "json", "--tail", "1")
        assert json.loads(r.stdout)["lines"] == ["step 5"]
        kube.objects[JOBSET]["status"] = {"conditions": [{"type": "Completed", "status": "True"}]}
        r = cli("logs", RUN, "--runs-dir", STORE, "-f", "--tail", "3")
        assert r.exit_code == 0, r.stderr
        assert r.stdout.splitlines() == ["step 3", "step 4", "step 5"]

    def test_the_generator_pods_log_from_the_run_store(self, cli, kube, clients):
        """--generator: what a pipelined run's generator pods keep in the store
        (rlctl.core.trainer.run.generate, as a pod writes it), tail, JSON and -f."""
        from rlctl.core.store import open_store
        from rlctl.core.trainer.run.generate import _Say

        assert _submit(cli).exit_code == 0
        r = cli("logs", RUN, "--runs-dir", STORE, "--generator")
        assert r.exit_code == 3 and "has no generator.log" in r.stderr
        assert "rollout.placement=process" in r.stderr and "Traceback" not in r.stderr
        say = _Say()  # the generator pod's lines, kept in the gs:// store
        say.keep(open_store(STORE, client=clients.storage).existing(RUN))
        for line in ("ready (pid 7)", "step 1 sampled from version 0 in 2.1 s"):
            say(line)
        say.upload()
        r = cli("logs", RUN, "--runs-dir", STORE, "--generator", "--tail", "1")
        assert r.exit_code == 0, r.stderr
        assert [x.split("  ", 1)[1] for x in r.stdout.splitlines()] == [
            "step 1 sampled from version 0 in 2.1 s"
        ]
        r = cli("logs", RUN, "--runs-dir", STORE, "--generator", "-o", "json")
        assert json.loads(r.stdout)["log"] == f"{STORE}/{RUN}/generator.log"
        kube.objects[JOBSET]["status"] = {"conditions": [{"type": "Completed", "status": "True"}]}
        r = cli("logs", RUN, "--runs-dir", STORE, "--generator", "-f")
        assert r.exit_code == 0, r.stderr
        assert len(r.stdout.splitlines()) == 2 and "ready (pid 7)" in r.stdout

    def test_follow_only_prints_new_lines(self):
        from rlctl.core.runs.cluster import _new_lines

        assert _new_lines(["a", "b"], ["a", "b", "c", "d"]) == ["c", "d"]
        assert _new_lines(["a", "b"], ["b", "c"]) == ["c"]
        assert _new_lines(["x"], ["c", "d"]) == ["c", "d"]

    def test_ctrl_c_exits_130(self, cli, kube, monkeypatch):
        assert _submit(cli).exit_code == 0
        _pod(kube)
        kube.logs[("default", f"{RUN}-slice-0-0-abcde")] = "step 1"

        def interrupt(*_a, **_k):
            raise KeyboardInterrupt

        monkeypatch.setattr("time.sleep", interrupt)
        r = cli("logs", RUN, "--runs-dir", STORE, "-f")
        assert r.exit_code == 130 and "interrupted" in r.stderr
        assert r.stdout.splitlines() == ["step 1"]


# The pod that holds the trainer's output, found as its controllers label it (upstream:
# tests/fakes/controllers.py), never by a name or label rlctl chose: JobSet's process 0,
# pathways-job's head (JobSet's labels only), KubeRay's submitter (the Job controller's).
LEADERS = {
    "jobset": {
        "jobset.sigs.k8s.io/replicatedjob-name": "slice",
        "jobset.sigs.k8s.io/job-index": "0",
        "batch.kubernetes.io/job-completion-index": "0",
    },
    "pathways": {"jobset.sigs.k8s.io/replicatedjob-name": "pathways-head"},
    "ray": {"batch.kubernetes.io/job-name": RUN},
}
STEPS = ["step 1/4  reward 0.125", "step 2/4  reward 0.250", "step 3/4  reward 0.375"]


@pytest.mark.parametrize("backend", list(LEADERS))
class TestLogsOfEveryBackend:
    """``rlctl logs`` shows the trainer's step lines whatever the backend: from the run
    store's train.log, which the pods' trainer appends to (rlctl.core.runs.pod), and
    before it has written one from the pod the controllers put its output in."""

    def test_from_the_run_stores_train_log(self, cli, kube, clients, backend):
        from rlctl.core.runs.run_log import RunLog
        from rlctl.core.store import open_store

        assert _submit(cli, "--backend", backend).exit_code == 0
        log = RunLog("pod")  # as the pod's trainer writes it, into the gs:// store
        log.attach(open_store(STORE, client=clients.storage).existing(RUN))
        for line in STEPS:
            log.end(line)
        r = cli("logs", RUN, "--runs-dir", STORE, "--tail", "2")
        assert r.exit_code == 0, r.stderr
        assert [ln.split("  ", 1)[1] for ln in r.stdout.splitlines()] == STEPS[1:]
        assert f"{STORE}/{RUN}/train.log" in r.stderr
        r = cli("logs", RUN, "--runs-dir", STORE, "-o", "json", "--tail", "1")
        out = json.loads(r.stdout)
        assert out["log"] == f"{STORE}/{RUN}/train.log" and "pod" not in out
        assert out["lines"][0].endswith(STEPS[-1])

    def test_follow_reads_it_until_the_workload_ends(
        self, cli, kube, clients, backend, monkeypatch
    ):
        from rlctl.core.runs.run_log import RunLog
        from rlctl.core.store import open_store

        assert _submit(cli, "--backend", backend).exit_code == 0
        log = RunLog("pod")
        log.attach(open_store(STORE, client=clients.storage).existing(RUN))
        log.end(STEPS[0])
        rounds = []

        def later(_s):  # between two polls the trainer writes two more lines, then ends
            rounds.append(1)
            if len(rounds) == 1:
                for line in STEPS[1:]:
                    log.end(line)
                kind = {"jobset": "jobsets", "pathways": "pathwaysjobs", "ray": "rayjobs"}
                (key,) = [k for k in kube.objects if k[1] == kind[backend]]
                kube.objects[key]["status"] = (
                    {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}
                    if backend == "ray"
                    else {"conditions": [{"type": "Completed", "status": "True"}]}
                )

        monkeypatch.setattr("time.sleep", later)
        r = cli("logs", RUN, "--runs-dir", STORE, "-f", "--interval", "0.5")
        assert r.exit_code == 0, r.stderr
        lines = [ln.split("  ", 1)[1] for ln in r.stdout.splitlines()]
        assert lines[-3:] == STEPS and len(rounds) == 1

    def test_from_the_leading_pod_before_the_trainer_wrote_its_log(self, cli, kube, backend):
        assert _submit(cli, "--backend", backend).exit_code == 0
        (leader, *_) = kube.pods_of(RUN, **LEADERS[backend])
        others = [p for p in kube.pods_of(RUN) if p is not leader]
        assert others  # the workload has more pods, which must not be picked
        for p in kube.pods_of(RUN):
            kube.logs[("default", p["metadata"]["name"])] = "not the trainer"
        kube.logs[("default", leader["metadata"]["name"])] = "\n".join(STEPS)
        r = cli("logs", RUN, "--runs-dir", STORE, "-o", "json", "--tail", "2")
        assert r.exit_code == 0, r.stderr
        assert json.loads(r.stdout) == {
            "run": RUN,
            "pod": leader["metadata"]["name"],
            "lines": STEPS[1:],
        }


class TestResume:
    def test_refuses_while_running_then_resubmits_after_a_checkpoint(self, cli, kube, clients):
        assert _submit(cli).exit_code == 0
        _pod(kube)
        r = cli("resume", RUN, "--runs-dir", STORE)
        assert r.exit_code == 4 and "no complete checkpoint" in r.stderr
        bucket = clients.storage.bucket(BUCKET)
        bucket.blob(f"runs/{RUN}/checkpoints/2/COMMITTED").upload_from_string(
            '{"step": 2, "files": []}'
        )
        r = cli("resume", RUN, "--runs-dir", STORE)
        assert r.exit_code == 4 and "still running" in r.stderr
        kube.objects[JOBSET]["status"] = {
            "conditions": [{"type": "Failed", "status": "True", "message": "preempted"}]
        }
        kube.objects.pop(("v1", "pods", "default", f"{RUN}-slice-0-0-abcde"))
        r = cli("resume", RUN, "--runs-dir", STORE, "-o", "json")
        assert r.exit_code == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["checkpoint"] == 2 and out["cluster"] == "c"
        assert "JobSet/r1 (applied)" in out["applied"]
        assert "status" not in kube.objects[JOBSET]  # a fresh JobSet, not the failed one

    def test_a_run_that_no_longer_fits_is_refused_before_anything_is_applied(
        self, cli, kube, clients, monkeypatch
    ):
        """The fit check runs again on resume (spec.yaml, the image or the cluster's
        pools may have changed since the submit), with what it compiled on stderr."""
        from rlctl.core.runs import device_fit
        from rlctl.core.trainer.api import DeviceFit

        assert _submit(cli).exit_code == 0
        bucket = clients.storage.bucket(BUCKET)
        bucket.blob(f"runs/{RUN}/checkpoints/2/COMMITTED").upload_from_string(
            '{"step": 2, "files": []}'
        )
        kube.objects[JOBSET]["status"] = {
            "conditions": [{"type": "Failed", "status": "True", "message": "preempted"}]
        }
        asked = []

        def too_big(spec, acc, count, engine, on_line, storage):
            asked.append((acc, count))
            on_line("update compiled")
            gib = 1 << 30
            return DeviceFit(
                target=f"{acc}", device="TPU v6e", devices=count * 4,
                device_memory=32 * gib, usable=27 * gib, peak=40 * gib,
                fits=False, fix="--set training.remat=true",
            )  # fmt: skip

        monkeypatch.setattr(device_fit, "check", too_big)
        failed = dict(kube.objects[JOBSET])
        r = cli("resume", RUN, "--runs-dir", STORE)
        assert r.exit_code != 0 and asked, r.stderr
        assert "error: the run does not fit" in r.stderr
        assert "hint: --set training.remat=true" in r.stderr
        assert "device memory: update compiled" in r.stderr
        assert kube.objects[JOBSET] == failed  # nothing re-applied


class TestDeleteRun:
    def test_lists_then_removes_only_this_runs_objects(self, cli, kube, clients):
        assert _submit(cli).exit_code == 0
        kube.put(
            "v1",
            "configmaps",
            {
                "metadata": {
                    "name": "other",
                    "labels": {"managed-by": "rlctl", "rlctl.dev/run": "r2"},
                }
            },
        )
        kube.put(
            "v1", "configmaps", {"metadata": {"name": "theirs", "labels": {"rlctl.dev/run": RUN}}}
        )
        r = cli("delete", "run", RUN, "--runs-dir", STORE, "--dry-run", "-o", "json")
        assert r.exit_code == 0, r.stderr
        plan = json.loads(r.stdout)
        assert (plan["operation"], plan["target"], plan["project"], plan["location"]) == (
            "delete",
            RUN,
            "p",
            "us-central1",
        )
        assert [(c["action"], c["kind"], c["name"]) for c in plan["changes"]] == [
            ("delete", "JobSet", "r1"),
            ("delete", "Secret", "r1-hf-token"),
        ]
        assert any("cluster c" in n for n in plan["notes"])
        r = cli("delete", "run", RUN, "--runs-dir", STORE)
        assert r.exit_code == 2 and "--yes" in r.stderr
        assert "JobSet/r1" in kube.names()
        r = cli("delete", "run", RUN, "--runs-dir", STORE, "--yes")
        assert r.exit_code == 0, r.stderr
        rows = [line.split() for line in r.stdout.splitlines()]
        # the plan (at 80 columns, a line per change), one line each
        for kind, name in [("JobSet", "r1"), ("Secret", "r1-hf-token")]:
            assert any(row[:3] == ["delete", kind, name] for row in rows), r.stdout
        assert f"Plan: delete {RUN} (p, us-central1)" in r.stdout
        assert "deleted 2 items" in r.stderr
        assert kube.names() == ["ConfigMap/other", "ConfigMap/theirs", "ServiceAccount/rlctl"]
        assert f"runs/{RUN}/spec.yaml" in [b.name for b in clients.storage.list_blobs(BUCKET)]

    def test_purge_also_removes_the_store_files(self, cli, kube, clients):
        assert _submit(cli).exit_code == 0
        r = cli("delete", "run", RUN, "--runs-dir", STORE, "--purge", "--yes", "-o", "json")
        assert r.exit_code == 0, r.stderr
        doc = json.loads(r.stdout)
        files = doc["plan"]["changes"][-1]
        assert (files["action"], files["kind"], files["name"]) == (
            "delete",
            "files",
            f"{STORE}/{RUN}",
        )
        assert f"files/{STORE}/{RUN}" in doc["result"]["applied"]
        assert doc["result"]["operation"] == "delete" and doc["result"]["target"] == RUN
        assert list(clients.storage.list_blobs(BUCKET)) == []
        assert kube.names() == ["ServiceAccount/rlctl"]

    def test_a_local_store_is_not_searched_on_the_cluster(self, cli, fake, tmp_path):
        """A local --runs-dir means a local run (tests/faults covers deleting one):
        nothing is asked of the cluster."""
        before = len(fake.mutations())
        r = cli("delete", "run", RUN, "--runs-dir", str(tmp_path), "--yes")
        assert r.exit_code == 3 and "not found in" in r.stderr, r.output
        assert len(fake.mutations()) == before


class TestDeleteAliases:
    def test_delete_cluster_is_cluster_delete(self, cli, fake):
        before = len(fake.mutations())  # the seeded bucket
        r = cli("delete", "cluster", "c", *LOC, "--dry-run", "-o", "json")
        assert r.exit_code == 0, r.stderr
        plan = json.loads(r.stdout)
        assert plan["operation"] == "delete" and plan["target"] == "c"
        assert len(fake.mutations()) == before

    def test_delete_network_is_network_delete(self, cli, fake):
        alias = cli("delete", "network", "c", *LOC, "--dry-run", "-o", "json")
        direct = cli("network", "delete", "c", *LOC, "--dry-run", "-o", "json")
        # the cluster still uses its networks: both spellings refuse the same way
        assert alias.exit_code == direct.exit_code == 4
        assert alias.stderr == direct.stderr and "rlctl cluster delete c" in alias.stderr


def test_vllm_generator_pods_on_a_gpu_cluster_are_applied_with_the_vllm_image(
    cli, fake, kube, clients
):
    """rollout.engine=vllm with the generator in pods of their own on a GPU cluster (seed
    004's shape; issues 54 and 55): the submit says how to build rlctl-gpu-vllm while it is
    missing and applies nothing, then applies the JobSet with it once built; both pod
    groups are scheduled on the cluster's two machines."""
    from rlctl.core.gcp.image import default_tag
    from tests.fakes.seed import seed_cluster

    seed_cluster(fake, "g", ("a3-highgpu-8g x2",), endpoint=kube.url, version="1.33.1-gke.1")
    kube.nodes = nodes_of_cluster(fake, "g")
    args = [
        "train",
        "grpo",
        "--cluster",
        "g",
        *LOC,
        "--runs-dir",
        STORE,
        "--name",
        RUN,
        "--steps",
        "4",
        "--set",
        "rollout.engine=vllm",
        "--set",
        "rollout.placement=process",
        "--set",
        "rollout.max_staleness=1",
    ]
    r = cli(*args)
    assert r.exit_code == 2 and kube.mutations() == []
    assert "rlctl image build --cluster g --region us-central1 --accelerator gpu --with vllm'" in (
        r.stderr
    )
    tag = default_tag("gpu-vllm")
    fake.repositories[("us-central1", "rlctl")] = {
        "name": "projects/p/locations/us-central1/repositories/rlctl"
    }
    fake.docker_images[("us-central1", "rlctl", "rlctl-gpu-vllm")] = {tag: "sha256:" + "3" * 64}
    r = cli(*args)
    assert r.exit_code == 0, r.stderr
    (jobset,) = [o for k, o in kube.objects.items() if o["kind"] == "JobSet"]
    images = {
        c["image"]
        for rj in jobset["spec"]["replicatedJobs"]
        for c in rj["template"]["spec"]["template"]["spec"]["containers"]
    }
    assert images == {f"us-central1-docker.pkg.dev/p/rlctl/rlctl-gpu-vllm:{tag}"}
    assert [rj["name"] for rj in jobset["spec"]["replicatedJobs"]] == ["gpu", "generator"]
    pods = kube.names("pods")
    assert len(pods) == 2 and any("-generator-" in p for p in pods), pods
