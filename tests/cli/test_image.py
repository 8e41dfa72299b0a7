"""``rlctl image build|list`` through typer's CliRunner, against the wire-level fake (real
Cloud Build, Artifact Registry and Cloud Storage clients) and a stub local engine."""

from __future__ import annotations

import json
import os
import stat

import pytest

LOC = ["--project", "p", "--region", "us-central1"]
BUCKET = "rl-runs"


@pytest.fixture
def bucket(cluster_bucket):
    return cluster_bucket


def _seed_cluster(fake) -> None:
    fake.clusters[("us-central1", "rl")] = {
        "name": "rl",
        "location": "us-central1",
        "status": "RUNNING",
        "resourceLabels": {"managed-by": "rlctl", "rlctl-cluster": "rl"},
        "selfLink": "projects/p/locations/us-central1/clusters/rl",
        "nodePools": [
            {
                "name": "a3-highgpu-8g-0",
                "status": "RUNNING",
                "initialNodeCount": 2,
                "config": {"machineType": "a3-highgpu-8g"},
            }
        ],
    }


class TestBuild:
    def test_dry_run_json_is_the_plan_only(self, cli, fake, bucket):
        _seed_cluster(fake)
        n = len(fake.mutations())  # the bucket fixture's
        r = cli("image", "build", "--cluster", "rl", *LOC, "--dry-run", "-o", "json")
        assert r.exit_code == 0, r.stderr
        plan = json.loads(r.stdout)
        kinds = [(c["kind"], c["action"]) for c in plan["changes"]]
        assert kinds == [("repository", "create"), ("context", "create"), ("image", "create")]
        # the cluster's accelerator (GPU here) and its bucket were used
        assert "/rlctl-gpu:" in plan["target"]
        assert plan["changes"][1]["name"].startswith(f"gs://{BUCKET}/rlctl/build-contexts/gpu-")
        assert len(fake.mutations()) == n
        assert not fake.repositories and not fake.builds

    def test_build_prints_the_uri_then_a_rerun_reuses_it(self, cli, fake, bucket):
        r = cli("image", "build", "--bucket", BUCKET, "-a", "tpu", *LOC, "--yes", "-o", "json")
        assert r.exit_code == 0, r.stderr
        doc = json.loads(r.stdout)
        uri = doc["result"]["image"]
        assert uri.startswith("us-central1-docker.pkg.dev/p/rlctl/rlctl-tpu:0.1.0-")
        assert doc["result"]["built"] is True
        r = cli("image", "build", "--bucket", BUCKET, "-a", "tpu", *LOC, "--yes")
        assert r.exit_code == 0, r.stderr
        assert "nothing to do" in r.stderr and len(fake.builds) == 1
        r = cli("image", "list", *LOC, "-o", "json")
        assert r.exit_code == 0, r.stderr
        (row,) = json.loads(r.stdout)
        assert row["tags"] == [uri.rsplit(":", 1)[1]]

    def test_a_failed_build_is_one_line_and_exits_7(self, cli, fake, bucket):
        fake.fail_build(0, "step exited with non-zero status: 1")
        r = cli("image", "build", "--bucket", BUCKET, *LOC, "--yes")
        assert r.exit_code == 7
        err = [x for x in r.stderr.splitlines() if x.startswith("error:")]
        assert len(err) == 1 and "at step 0" in err[0] and "logs: https://" in err[0]
        assert "Traceback" not in r.stderr

    def test_the_vllm_flavour_is_its_own_image_on_its_own_lock(self, cli, fake, bucket):
        """--with vllm: rlctl-gpu-vllm, whose context carries image-gpu-vllm.lock.txt."""
        _seed_cluster(fake)
        r = cli(
            "image", "build", "--cluster", "rl", "--with", "vllm", *LOC, "--dry-run", "-o", "json"
        )
        assert r.exit_code == 0, r.stderr
        plan = json.loads(r.stdout)
        assert "/rlctl-gpu-vllm:" in plan["target"]
        assert plan["changes"][1]["name"].startswith(
            f"gs://{BUCKET}/rlctl/build-contexts/gpu-vllm-"
        )
        # vLLM on TPU (tpu-inference) cannot sit beside Tunix: one line, before any call
        r = cli("image", "build", "--bucket", BUCKET, "-a", "tpu", "--with", "vllm", *LOC)
        assert r.exit_code == 2 and "rlctl makes no tpu image with vllm" in r.stderr
        assert "qwix 0.1.2" in r.stderr and "Traceback" not in r.stderr
        r = cli("image", "build", "--bucket", BUCKET, "-a", "gpu", "--with", "cuda", *LOC)
        assert r.exit_code == 2 and "rlctl makes no gpu image with cuda" in r.stderr
        assert "its gpu images: gpu, gpu-vllm" in r.stderr

    def test_cloud_build_needs_a_bucket(self, cli):
        r = cli("image", "build", *LOC, "--dry-run")
        assert r.exit_code == 2 and "--cluster NAME (its run bucket) or --bucket" in r.stderr

    def test_list_without_a_repository_is_not_found(self, cli):
        r = cli("image", "list", *LOC)
        assert r.exit_code == 3 and "rlctl image build" in r.stderr


class TestLocal:
    def test_no_engine_says_so(self, cli, monkeypatch, tmp_path):
        monkeypatch.setenv("PATH", str(tmp_path))
        monkeypatch.delenv("RLCTL_CONTAINER_ENGINE", raising=False)
        r = cli("image", "build", "--local", *LOC, "--dry-run")
        assert r.exit_code == 2
        assert "--local needs Docker or Podman, and neither is on PATH" in r.stderr

    def test_a_local_engine_builds_and_pushes_every_tag(self, cli, fake, monkeypatch, tmp_path):
        bin_ = tmp_path / "bin"
        bin_.mkdir()
        log = tmp_path / "calls.txt"
        podman = bin_ / "podman"
        podman.write_text(f'#!/bin/sh\necho "$@" >> {log}\nls >> {log}\necho done\n')
        podman.chmod(podman.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("RLCTL_CONTAINER_ENGINE", "podman")  # even if docker is there
        r = cli(
            "image", "build", "--local", "-a", "gpu", "--tag", "latest", *LOC, "--yes", "-o", "json"
        )
        assert r.exit_code == 0, r.stderr
        uri = json.loads(r.stdout)["result"]["image"]
        lines = log.read_text().splitlines()
        assert lines[0].startswith("build --platform linux/amd64 -t " + uri)
        assert lines[0].endswith("-t us-central1-docker.pkg.dev/p/rlctl/rlctl-gpu:latest .")
        assert lines[1:4] == ["Dockerfile", "requirements.txt", "rlctl-0.1.0-py3-none-any.whl"]
        assert [x for x in lines if x.startswith("push")] == [
            f"push {uri}",
            "push us-central1-docker.pkg.dev/p/rlctl/rlctl-gpu:latest",
        ]
        assert not fake.builds  # no Cloud Build

    def test_a_failing_engine_is_one_line_naming_the_command(self, cli, monkeypatch, tmp_path):
        bin_ = tmp_path / "bin"
        bin_.mkdir()
        docker = bin_ / "docker"
        docker.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon'\nexit 1\n")
        docker.chmod(docker.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", str(bin_))
        monkeypatch.setenv("RLCTL_CONTAINER_ENGINE", "docker")
        r = cli("image", "build", "--local", *LOC, "--yes")
        assert r.exit_code == 7
        err = [x for x in r.stderr.splitlines() if x.startswith("error:")]
        assert err == [
            f"error: '{docker} build' failed with exit code 1: Cannot connect to the Docker daemon"
        ]
        assert f"'{docker} info'" in r.stderr


@pytest.mark.parametrize("args", [["image"], ["image", "build"], ["image", "list"]])
def test_help(args):
    from typer.testing import CliRunner

    from rlctl.cli.app import app

    r = CliRunner().invoke(app, [*args, "--help"])
    assert r.exit_code == 0, r.output
    if len(args) == 2:
        assert "Example:" in r.stdout
