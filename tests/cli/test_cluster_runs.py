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

from tests.core.k8s.conftest import HF_SENTINEL, KUBE_TOKEN

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

    c = Clients("p", "us-central1", Credentials(token=KUBE_TOKEN),
                {s: fake.url for s in SERVICES}, retry_initial=0.01, poll_interval=0.01,
                retry_deadline=5.0)
    _seed_cluster(fake, kube.url)
    bucket = c.storage.bucket(BUCKET)
    bucket.labels = {"managed-by": "rlctl", "rlctl-cluster": "c"}
    c.storage.create_bucket(bucket, location="US-CENTRAL1")
    yield c
    for b in c.storage.list_blobs(BUCKET):
        b.delete()


def _seed_cluster(fake, endpoint: str) -> None:
    link = "projects/p/locations/us-central1/clusters/c"
    fake.clusters[("us-central1", "c")] = {
        "name": "c", "location": "us-central1", "status": "RUNNING", "endpoint": endpoint,
        "currentMasterVersion": "1.33.1-gke.1", "selfLink": link,
        "resourceLabels": {"managed-by": "rlctl", "rlctl-cluster": "c"},
        "nodePools": [
            {"name": "cpu", "status": "RUNNING", "initialNodeCount": 1,
             "config": {"machineType": "e2-standard-8"}},
            *[{"name": f"v6e-16-{i}", "status": "RUNNING", "initialNodeCount": 4,
               "config": {"machineType": "ct6e-standard-4t"},
               "placementPolicy": {"type": "COMPACT", "tpuTopology": "4x4"},
               "selfLink": f"{link}/nodePools/v6e-16-{i}"} for i in range(2)],
        ],
    }


@pytest.fixture()
def cli(clients, crds):
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


def _submit(cli, *extra: str):
    return cli("train", "grpo", "--cluster", "c", *LOC, "--image", IMAGE, "--name", RUN,
               "--steps", "4", *extra)


def _store_text(clients) -> str:
    return "".join(b.download_as_text() for b in clients.storage.list_blobs(BUCKET))


def _pod(kube, phase: str = "Running", scheduled: bool = True) -> None:
    status: dict = {"phase": phase}
    if not scheduled:
        status["conditions"] = [{"type": "PodScheduled", "status": "False",
                                 "reason": "Unschedulable",
                                 "message": "0/3 nodes are available: 3 Insufficient "
                                 "google.com/tpu."}]
    kube.put("v1", "pods", {
        "metadata": {"name": f"{RUN}-slice-0-0-abcde",
                     "labels": {"managed-by": "rlctl", "rlctl.dev/run": RUN}},
        "spec": {"containers": [{"name": "trainer"}],
                 "nodeSelector": {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice"}},
        "status": status,
    })


class TestTrainOnCluster:
    def test_dry_run_json_prints_only_the_manifests_and_changes_nothing(self, cli, kube,
                                                                        clients):
        r = _submit(cli, "--dry-run", "-o", "json")
        assert r.exit_code == 0, r.stderr
        objs = json.loads(r.stdout)  # nothing else on stdout
        kinds = [o["kind"] for o in objs]
        assert kinds == ["ServiceAccount", "JobSet"]
        js = objs[-1]
        assert js["metadata"]["name"] == RUN
        assert len(js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
                   ["containers"]) >= 1
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

    def test_submit_creates_exactly_the_run_objects_and_writes_the_store(self, cli, kube,
                                                                         clients):
        r = _submit(cli, "-o", "json")
        assert r.exit_code == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["name"] == RUN and out["path"] == f"{STORE}/{RUN}"
        assert out["cluster"] == "c" and out["accelerator"] == "v6e-16"
        assert kube.names() == ["JobSet/r1", "Secret/r1-hf-token",
                                "ServiceAccount/rlctl"]
        js = kube.objects[JOBSET]
        assert js["spec"]["replicatedJobs"][0]["replicas"] == 2  # two v6e-16 pools
        assert {r["authorization"] for r in kube.requests} == {f"Bearer {KUBE_TOKEN}"}
        st = json.loads(clients.storage.bucket(BUCKET).blob(f"runs/{RUN}/status.json")
                        .download_as_text())
        assert st["cluster"] == "c" and st["backend"] == "jobset" and st["image"] == IMAGE
        assert HF_SENTINEL not in _store_text(clients)
        others = [o for k, o in kube.objects.items() if k[1] != "secrets"]
        assert HF_SENTINEL not in json.dumps(others)

    def test_runs_go_to_the_namespace_and_account_the_cluster_was_made_with(
            self, cli, kube, fake, clients):
        """'cluster create --namespace ml --service-account trainer' bound the bucket to
        ml/trainer; a run anywhere else would be refused by the bucket."""
        fake.clusters[("us-central1", "c")]["resourceLabels"].update(
            {"rlctl-namespace": "ml", "rlctl-ksa": "trainer"})
        assert _submit(cli).exit_code == 0
        kinds = {(k[2], k[3]) for k in kube.objects}
        assert ("ml", RUN) in kinds and not any(ns == "default" for ns, _ in kinds)
        js = kube.objects[("jobset.x-k8s.io/v1alpha2", "jobsets", "ml", RUN)]
        pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "trainer"
        assert kube.objects[("v1", "serviceaccounts", "ml", "trainer")]
        st = json.loads(clients.storage.bucket(BUCKET).blob(f"runs/{RUN}/status.json")
                        .download_as_text())
        assert (st["namespace"], st["service_account"]) == ("ml", "trainer")

    def test_runs_dir_must_be_gs(self, cli, kube, tmp_path):
        r = _submit(cli, "--runs-dir", str(tmp_path), "--dry-run")
        assert r.exit_code == 2 and "gs://" in r.stderr and kube.mutations() == []

    def test_an_image_is_required(self, cli, monkeypatch):
        monkeypatch.delenv("RLCTL_IMAGE", raising=False)
        r = cli("train", "grpo", "--cluster", "c", *LOC, "--dry-run")
        assert r.exit_code == 2 and "--image" in r.stderr

    def test_an_unknown_cluster_is_not_found(self, cli):
        r = cli("train", "grpo", "--cluster", "nope", *LOC, "--image", IMAGE, "--dry-run")
        assert r.exit_code == 3 and "cluster 'nope' not found" in r.stderr


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

    def test_cluster_alone_finds_the_store_by_bucket_label(self, cli, kube):
        assert _submit(cli).exit_code == 0
        _pod(kube)
        r = cli("status", RUN, "--cluster", "c", *LOC)
        assert r.exit_code == 0, r.stderr
        assert "workload    running" in r.stdout
        r = cli("status", "--cluster", "c", *LOC, "-o", "json")
        assert [x["name"] for x in json.loads(r.stdout)] == [RUN]

    def test_watch_refuses_json(self, cli):
        r = cli("status", RUN, "--runs-dir", STORE, "--watch", "-o", "json")
        assert r.exit_code == 2 and "table output only" in r.stderr and r.stdout == ""

    def test_watch_redraws_on_stderr_until_the_run_ends(self, cli, kube):
        assert _submit(cli).exit_code == 0
        kube.objects[JOBSET]["status"] = {"conditions": [
            {"type": "Completed", "status": "True"}]}
        r = cli("status", RUN, "--runs-dir", STORE, "--watch", "--interval", "0.5")
        assert r.exit_code == 0, r.stderr
        assert r.stdout == "" and "completed" in r.stderr


class TestLogs:
    def test_tail_and_follow(self, cli, kube):
        assert _submit(cli).exit_code == 0
        _pod(kube)
        kube.logs[("default", f"{RUN}-slice-0-0-abcde")] = "\n".join(
            f"step {i}" for i in range(1, 6))
        r = cli("logs", RUN, "--runs-dir", STORE, "--tail", "2")
        assert r.exit_code == 0, r.stderr
        assert r.stdout.splitlines() == ["step 4", "step 5"]
        r = cli("logs", RUN, "--runs-dir", STORE, "-o", "json", "--tail", "1")
        assert json.loads(r.stdout)["lines"] == ["step 5"]
        kube.objects[JOBSET]["status"] = {"conditions": [
            {"type": "Completed", "status": "True"}]}
        r = cli("logs", RUN, "--runs-dir", STORE, "-f", "--tail", "3")
        assert r.exit_code == 0, r.stderr
        assert r.stdout.splitlines() == ["step 3", "step 4", "step 5"]

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


class TestResume:
    def test_refuses_while_running_then_resubmits_after_a_checkpoint(self, cli, kube,
                                                                     clients):
        assert _submit(cli).exit_code == 0
        _pod(kube)
        r = cli("resume", RUN, "--runs-dir", STORE)
        assert r.exit_code == 4 and "no complete checkpoint" in r.stderr
        bucket = clients.storage.bucket(BUCKET)
        bucket.blob(f"runs/{RUN}/checkpoints/2/COMMITTED").upload_from_string(
            '{"step": 2, "files": []}')
        r = cli("resume", RUN, "--runs-dir", STORE)
        assert r.exit_code == 4 and "still running" in r.stderr
        kube.objects[JOBSET]["status"] = {"conditions": [
            {"type": "Failed", "status": "True", "message": "preempted"}]}
        kube.objects.pop(("v1", "pods", "default", f"{RUN}-slice-0-0-abcde"))
        r = cli("resume", RUN, "--runs-dir", STORE, "-o", "json")
        assert r.exit_code == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["checkpoint"] == 2 and out["cluster"] == "c"
        assert "JobSet/r1 (applied)" in out["applied"]
        assert "status" not in kube.objects[JOBSET]  # a fresh JobSet, not the failed one


class TestDeleteRun:
    def test_lists_then_removes_only_this_runs_objects(self, cli, kube, clients):
        assert _submit(cli).exit_code == 0
        kube.put("v1", "configmaps", {"metadata": {"name": "other", "labels": {
            "managed-by": "rlctl", "rlctl.dev/run": "r2"}}})
        kube.put("v1", "configmaps", {"metadata": {"name": "theirs", "labels": {
            "rlctl.dev/run": RUN}}})
        r = cli("delete", "run", RUN, "--runs-dir", STORE, "--dry-run", "-o", "json")
        assert r.exit_code == 0, r.stderr
        plan = json.loads(r.stdout)
        assert (plan["operation"], plan["target"], plan["project"], plan["location"]) == (
            "delete", RUN, "p", "us-central1")
        assert [(c["action"], c["kind"], c["name"]) for c in plan["changes"]] == [
            ("delete", "JobSet", "r1"), ("delete", "Secret", "r1-hf-token")]
        assert any("cluster c" in n for n in plan["notes"])
        r = cli("delete", "run", RUN, "--runs-dir", STORE)
        assert r.exit_code == 2 and "--yes" in r.stderr
        assert "JobSet/r1" in kube.names()
        r = cli("delete", "run", RUN, "--runs-dir", STORE, "--yes")
        assert r.exit_code == 0, r.stderr
        rows = [line.split() for line in r.stdout.splitlines()]
        # the plan table, one row each
        for kind, name in [("JobSet", "r1"), ("Secret", "r1-hf-token")]:
            assert any(row[1:6:2] == ["delete", kind, name] for row in rows), r.stdout
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
        assert (files["action"], files["kind"], files["name"]) == ("delete", "files",
                                                                  f"{STORE}/{RUN}")
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
