"""The real kubernetes client against a fake API server on 127.0.0.1: submit, status,
resume and delete of cluster runs, with the run store on fake-gcs-server."""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path

import pytest

from rlctl.core.errors import AlreadyExistsError, ConfigError, ConflictError, NotFoundError
from rlctl.core.k8s import backends
from rlctl.core.k8s.apply import describe_workload, trainer_logs
from rlctl.core.runs.submit import (
    ClusterOptions,
    apply_delete_run,
    delete_run,
    describe_cluster_run,
    plan_delete_run,
    render_run,
    resume_run,
    submit_run,
)
from rlctl.core.store.local import LocalRunStore
from tests.core.k8s.conftest import HF_SENTINEL, KUBE_TOKEN, make_spec
from tests.fakes.shapes import v6e_16

OPTS = ClusterOptions(image="us-docker.pkg.dev/p/r/rlctl:1")
LABELS = {"managed-by": "rlctl", "rlctl.dev/run": "r1"}


@pytest.fixture()
def store(gcs, tmp_path):
    from rlctl.core.store.gcs import GcsRunStore

    client, bucket = gcs
    return GcsRunStore(f"gs://{bucket}/runs", client=client, staging_root=str(tmp_path / "staging"))


def store_text(store) -> str:
    return "".join(b.download_as_text() for b in store.client.list_blobs(store.bucket))


class TestSubmit:
    def test_creates_exactly_the_expected_objects(self, crds, kube, api, store):
        out = submit_run(
            make_spec("r1"),
            backends.get("jobset"),
            v6e_16(2),
            api,
            store,
            OPTS,
            hf_token=HF_SENTINEL,
        )
        assert kube.names() == ["JobSet/r1", "Secret/r1-hf-token", "ServiceAccount/rlctl"]
        assert out.applied == [
            "ServiceAccount/rlctl (created)",
            "Secret/r1-hf-token (created)",
            "JobSet/r1 (applied)",
        ]
        applies = [r for r in kube.requests if r["method"] == "PATCH"]
        assert [r["path"].rsplit("/", 2)[1] for r in applies] == ["jobsets"]
        assert all(
            r["content_type"] == "application/apply-patch+yaml"
            and r["query"]["fieldManager"] == "rlctl"
            for r in applies
        )
        js = kube.objects[("jobset.x-k8s.io/v1alpha2", "jobsets", "default", "r1")]
        assert js["metadata"]["labels"]["rlctl.dev/run"] == "r1"
        assert js["metadata"]["managedFields"][0]["manager"] == "rlctl"
        run = store.existing("r1")
        assert run.read_json("status.json")["phase"] == "pending"
        assert run.read_text("spec.yaml").startswith("name: r1")
        from rlctl.core.runs.local import load_run_spec

        assert load_run_spec(run).output.root == store.uri  # what the pods will see

    def test_a_taken_name_is_refused_before_anything_is_applied(self, crds, kube, api, store):
        submit_run(make_spec("r1"), backends.get("ray"), v6e_16(1), api, store, OPTS)
        before = kube.mutations()
        with pytest.raises(AlreadyExistsError, match="rlctl resume r1"):
            submit_run(make_spec("r1"), backends.get("ray"), v6e_16(1), api, store, OPTS)
        assert kube.mutations() == before

    def test_an_existing_service_account_is_kept(self, crds, kube, api, store):
        kube.put(
            "v1",
            "serviceaccounts",
            {"metadata": {"name": "rlctl", "annotations": {"owner": "platform-team"}}},
        )
        out = submit_run(make_spec("r1"), backends.get("pathways"), v6e_16(1), api, store, OPTS)
        assert "ServiceAccount/rlctl (exists, kept)" in out.applied
        sa = kube.objects[("v1", "serviceaccounts", "default", "rlctl")]
        assert sa["metadata"]["annotations"] == {"owner": "platform-team"}
        assert "PathwaysJob/r1" in kube.names()

    def test_a_local_run_store_is_refused(self, crds, api, tmp_path):
        with pytest.raises(ConfigError, match="gs://"):
            render_run(
                make_spec("r1"), backends.get("jobset"), v6e_16(), LocalRunStore(tmp_path), OPTS
            )

    def test_the_hf_token_is_only_in_its_secret(self, crds, kube, api, store, caplog, capsys):
        caplog.set_level(logging.DEBUG)
        dry = render_run(
            make_spec("r1"), backends.get("jobset"), v6e_16(2), store, OPTS, with_hf_secret=True
        )
        out = submit_run(
            make_spec("r1"),
            backends.get("jobset"),
            v6e_16(2),
            api,
            store,
            OPTS,
            hf_token=HF_SENTINEL,
        )
        secret = kube.objects[("v1", "secrets", "default", "r1-hf-token")]
        assert base64.b64decode(secret["data"]["token"]).decode() == HF_SENTINEL
        others = [o for k, o in kube.objects.items() if k[1] != "secrets"]
        bodies = [r["body"] for r in kube.requests if "/secrets" not in r["path"]]
        captured = capsys.readouterr()
        for where, text in {
            "manifests (--dry-run)": json.dumps(dry),
            "applied objects": json.dumps(others),
            "request bodies": "".join(bodies),
            "submit result": out.model_dump_json(),
            "logs": caplog.text,
            "stdout/stderr": captured.out + captured.err,
            "run store": store_text(store),
        }.items():
            assert HF_SENTINEL not in text, where


class TestKubeconfig:
    def test_token_is_sent_but_never_logged_or_written(
        self, kube, api, tmp_path, monkeypatch, caplog
    ):
        caplog.set_level(logging.DEBUG)
        api.list("v1", "ConfigMap")
        assert kube.requests[-1]["authorization"] == f"Bearer {KUBE_TOKEN}"
        assert KUBE_TOKEN not in caplog.text
        import tempfile

        for p in Path(tempfile.gettempdir()).glob("rlctl-ca-*"):
            assert KUBE_TOKEN not in p.read_text()

    def test_ca_is_written_and_verified_and_a_token_callable_refreshes(self, kube):
        from rlctl.core.k8s.apply import KubeApi
        from rlctl.core.k8s.kubeconfig import api_client, build_configuration

        pem = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
        cfg = build_configuration("34.1.2.3", base64.b64encode(pem).decode(), "t")
        assert cfg.host == "https://34.1.2.3" and cfg.verify_ssl
        assert Path(cfg.ssl_ca_cert).read_bytes() == pem
        with pytest.raises(ConfigError, match="CA"):
            build_configuration("34.1.2.3", None, "t")
        with pytest.raises(ConfigError, match="base64"):
            build_configuration("34.1.2.3", "%%%", "t")
        tokens = iter(["tok-1", "tok-2", "tok-3"])
        api = KubeApi(api_client(build_configuration(kube.url, None, lambda: next(tokens))))
        api.list("v1", "ConfigMap")
        api.list("v1", "ConfigMap")
        assert [r["authorization"] for r in kube.requests[-2:]] == ["Bearer tok-2", "Bearer tok-3"]


def pod(name: str, phase: str = "Pending", **status) -> dict:
    return {
        "metadata": {"name": name, "labels": dict(LABELS)},
        "spec": {
            "nodeSelector": {
                "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                "cloud.google.com/gke-tpu-topology": "4x4",
            },
            "containers": [
                {
                    "name": "trainer",
                    "image": "img:1",
                    "resources": {"limits": {"google.com/tpu": 4}},
                }
            ],
        },
        "status": {"phase": phase, **status},
    }


def unschedulable(message: str) -> dict:
    return {
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
            }
        ]
    }


def jobset(*conditions: dict) -> dict:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "r1", "labels": dict(LABELS)},
        "spec": {},
        "status": {"conditions": list(conditions)},
    }


class TestStatus:
    @pytest.mark.parametrize(
        ("seed", "phase", "reason"),
        [
            (
                [
                    pod(
                        "r1-slice-0-0",
                        **unschedulable(
                            "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."  # noqa: E501
                        ),
                    )
                ],
                "pending",
                "unschedulable: no node pool matches gke-tpu-accelerator=tpu-v6e-slice, "
                "gke-tpu-topology=4x4",
            ),
            (
                [
                    pod(
                        "r1-slice-0-0",
                        **unschedulable("0/4 nodes are available: 4 Insufficient google.com/tpu."),
                    )
                ],
                "pending",
                "unschedulable: insufficient google.com/tpu (4 per pod) on nodes with "
                "gke-tpu-accelerator=tpu-v6e-slice, gke-tpu-topology=4x4",
            ),
            (
                [
                    pod(
                        "r1-slice-0-0",
                        containerStatuses=[
                            {
                                "name": "trainer",
                                "image": "img:1",
                                "restartCount": 0,
                                "state": {
                                    "waiting": {
                                        "reason": "ImagePullBackOff",
                                        "message": 'Back-off pulling image "img:1"',
                                    }
                                },
                            }
                        ],
                    )
                ],
                "pending",
                'image pull error for img:1: Back-off pulling image "img:1"',
            ),
            (
                [
                    pod(
                        "r1-slice-0-0",
                        "Running",
                        containerStatuses=[
                            {
                                "name": "trainer",
                                "image": "img:1",
                                "restartCount": 3,
                                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                "lastState": {"terminated": {"exitCode": 1}},
                            }
                        ],
                    )
                ],
                "running",
                "crash loop in r1-slice-0-0 (exit 1, 3 restarts): ValueError: the last line",
            ),
            ([pod("r1-slice-0-0", "Running"), pod("r1-slice-0-1", "Running")], "running", None),
        ],
        ids=["no-node-pool", "insufficient-tpu", "image-pull", "crash-loop", "running"],
    )
    def test_each_pending_reason_in_one_line(self, kube, api, seed, phase, reason):
        kube.put("jobset.x-k8s.io/v1alpha2", "jobsets", jobset())
        for p in seed:
            kube.put("v1", "pods", p)
        kube.logs[("default", "r1-slice-0-0")] = "step 3\nTraceback ...\nValueError: the last line"
        got = describe_workload(api, "r1", backends.get("jobset"))
        assert (got.phase, got.reason) == (phase, reason)

    def test_reason_from_a_scheduling_event(self, kube, api):
        kube.put("jobset.x-k8s.io/v1alpha2", "jobsets", jobset())
        kube.put("v1", "pods", pod("r1-slice-0-0"))
        kube.put(
            "v1",
            "events",
            {
                "metadata": {"name": "e1"},
                "type": "Warning",
                "reason": "FailedScheduling",
                "involvedObject": {"kind": "Pod", "name": "r1-slice-0-0"},
                "message": "0/2 nodes are available: 2 Insufficient google.com/tpu.",
            },
        )
        assert describe_workload(api, "r1").reason.startswith(
            "unschedulable: insufficient google.com/tpu"
        )

    def test_finished_workloads(self, kube, api):
        kube.put(
            "jobset.x-k8s.io/v1alpha2",
            "jobsets",
            jobset(
                {
                    "type": "Failed",
                    "status": "True",
                    "message": "jobset failed: rule fail-on-user-error",
                }
            ),
        )
        assert describe_workload(api, "r1").model_dump(include={"phase", "reason"}) == {
            "phase": "failed",
            "reason": "jobset failed: rule fail-on-user-error",
        }
        kube.objects.clear()
        kube.put(
            "ray.io/v1",
            "rayjobs",
            {
                "kind": "RayJob",
                "metadata": {"name": "r1", "labels": dict(LABELS)},
                "status": {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"},
            },
        )
        assert describe_workload(api, "r1").phase == "completed"
        kube.objects.clear()
        assert describe_workload(api, "r1").phase == "absent"

    def test_status_merges_the_run_store(self, crds, kube, api, store):
        submit_run(make_spec("r1"), backends.get("jobset"), v6e_16(1), api, store, OPTS)
        kube.put(
            "v1",
            "pods",
            pod(
                "r1-slice-0-0",
                **unschedulable("0/4 nodes are available: 4 Insufficient google.com/tpu."),
            ),
        )
        info = describe_cluster_run("r1", api, store)
        assert info.phase == "pending" and info.step == 0
        assert info.reason is not None
        assert info.reason.startswith("unschedulable: insufficient google.com/tpu")
        assert info.workload.pods == {"Pending": 1}


def commit_checkpoint(store, step: int) -> None:
    run = store.run("r1")
    d = Path(run.path_for(f"checkpoints/{step}"))
    d.mkdir(parents=True, exist_ok=True)
    (d / "_CHECKPOINT_METADATA").write_text("{}")
    run.publish_checkpoint(step)


class TestResume:
    def test_resubmits_after_a_recorded_checkpoint(self, crds, kube, api, store):
        submit_run(make_spec("r1"), backends.get("jobset"), v6e_16(1), api, store, OPTS)
        commit_checkpoint(store, 2)
        js = kube.objects[("jobset.x-k8s.io/v1alpha2", "jobsets", "default", "r1")]
        js["status"] = {"conditions": [{"type": "Failed", "status": "True"}]}
        old_uid = js["metadata"]["uid"]
        out = resume_run("r1", backends.get("jobset"), v6e_16(1), api, store, OPTS)
        assert out.checkpoint == 2
        new = kube.objects[("jobset.x-k8s.io/v1alpha2", "jobsets", "default", "r1")]
        assert new["metadata"]["uid"] != old_uid and "status" not in new  # a fresh JobSet
        assert (
            "DELETE",
            "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/r1",
        ) in kube.mutations()

    def test_refuses_while_running(self, crds, kube, api, store):
        submit_run(make_spec("r1"), backends.get("jobset"), v6e_16(1), api, store, OPTS)
        commit_checkpoint(store, 2)
        kube.put("v1", "pods", pod("r1-slice-0-0", "Running"))
        before = kube.mutations()
        with pytest.raises(ConflictError, match="still running"):
            resume_run("r1", backends.get("jobset"), v6e_16(1), api, store, OPTS)
        assert kube.mutations() == before

    def test_refuses_without_a_checkpoint(self, crds, kube, api, store):
        submit_run(make_spec("r1"), backends.get("jobset"), v6e_16(1), api, store, OPTS)
        with pytest.raises(ConflictError, match="no complete checkpoint"):
            resume_run("r1", backends.get("jobset"), v6e_16(1), api, store, OPTS)


class TestDelete:
    def test_removes_only_rlctl_objects_of_that_run(self, crds, kube, api, store):
        submit_run(
            make_spec("r1"), backends.get("ray"), v6e_16(1), api, store, OPTS, hf_token=HF_SENTINEL
        )
        submit_run(make_spec("r2"), backends.get("jobset"), v6e_16(2), api, store, OPTS)
        kube.put(
            "v1",
            "configmaps",
            {"metadata": {"name": "r1-notes", "labels": {"rlctl.dev/run": "r1"}}},
        )
        kube.put("v1", "configmaps", {"metadata": {"name": "unrelated"}})
        kube.put("v1", "pods", {"metadata": {"name": "r1-slice-0-0", "labels": dict(LABELS)}})
        planned = plan_delete_run("r1", api, store, purge=True)
        assert [c.key for c in planned] == [
            "RayJob/r1",
            "ConfigMap/r1-config",
            "Secret/r1-hf-token",
            f"files/{store.run('r1').uri}",
        ]
        assert {c.action for c in planned} == {"delete"}
        assert planned[-1].depends_on == [c.key for c in planned[:-1]]  # files after objects
        assert kube.names() != []  # planning deleted nothing
        removed = delete_run("r1", api, store, purge=True)
        assert removed == [c.key for c in planned]
        assert kube.names() == [
            "ConfigMap/r1-notes",
            "ConfigMap/unrelated",
            "JobSet/r2",
            "Pod/r1-slice-0-0",
            "ServiceAccount/rlctl",
        ]
        assert store.list_runs() == ["r2"]

    def test_without_purge_the_run_store_stays(self, crds, kube, api, store):
        submit_run(make_spec("r1"), backends.get("ray"), v6e_16(1), api, store, OPTS)
        assert delete_run("r1", api, store) == ["RayJob/r1", "ConfigMap/r1-config"]
        assert store.list_runs() == ["r1"]

    def test_applies_the_plan_and_reports_only_what_it_removed(self, crds, kube, api, store):
        submit_run(make_spec("r1"), backends.get("ray"), v6e_16(1), api, store, OPTS)
        planned = plan_delete_run("r1", api, store)
        events: list[tuple[str, str]] = []
        removed = apply_delete_run(planned, api, store, lambda k, st, _: events.append((k, st)))
        assert removed == ["RayJob/r1", "ConfigMap/r1-config"]
        assert events == [
            ("RayJob/r1", "start"),
            ("RayJob/r1", "done"),
            ("ConfigMap/r1-config", "start"),
            ("ConfigMap/r1-config", "done"),
        ]
        assert apply_delete_run(planned, api, store) == []  # already gone: nothing removed
        with pytest.raises(NotFoundError, match="nothing to delete"):
            delete_run("r1", api, store)


class TestLogs:
    def test_tails_the_leading_trainer_pod(self, kube, api):
        with pytest.raises(NotFoundError, match="rlctl status r1"):
            trainer_logs(api, "r1")
        for name in ("r1-slice-1-0", "r1-slice-0-0"):
            kube.put("v1", "pods", pod(name, "Running"))
            kube.logs[("default", name)] = "\n".join(f"{name} line {i}" for i in range(50))
        name, text = trainer_logs(api, "r1", tail_lines=2)
        assert name == "r1-slice-0-0"
        assert text == "r1-slice-0-0 line 48\nr1-slice-0-0 line 49\n"
        log_req = kube.requests[-1]
        assert log_req["query"] == {"container": "trainer", "tailLines": "2"}
