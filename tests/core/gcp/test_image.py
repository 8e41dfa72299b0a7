"""``rlctl image build`` against the wire-level fake with the real Cloud Build, Artifact
Registry and Cloud Storage clients: the repository, the uploaded context, the build
request, a failing build, and an unchanged context that is not built again."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from rlctl.core.errors import CloudError
from rlctl.core.gcp import image

BUCKET = "rl-runs"


@pytest.fixture
def bucket(cluster_bucket):
    return cluster_bucket


def build(clients, **kw):
    target, ctx, plan = image.prepare(clients, "p", "us-central1", bucket=BUCKET, **kw)
    return target, ctx, plan, image.apply_build(clients, plan, target, ctx)


class TestBuild:
    def test_first_build_creates_repository_uploads_context_and_builds(self, fake, clients, bucket):
        _, ctx, plan, res = build(clients, accelerator="tpu")
        assert [(c.kind, c.action) for c in plan.changes] == [
            ("repository", "create"),
            ("context", "create"),
            ("image", "create"),
        ]
        uri = f"us-central1-docker.pkg.dev/p/rlctl/rlctl-tpu:{ctx.tag}"
        assert res.image == uri and res.built and res.build_id
        # the repository: Docker, labelled, made once
        from google.cloud import artifactregistry_v1

        (repo,) = fake.repositories.values()
        assert artifactregistry_v1.Repository.Format(repo["format"]).name == "DOCKER"
        assert repo["labels"] == {"managed-by": "rlctl"}
        assert len(fake.find("POST", r"/repositories$")) == 1
        # the context in the bucket holds exactly the expected files
        (blob,) = [
            b
            for b in clients.storage.list_blobs(BUCKET)
            if b.name.startswith("rlctl/build-contexts/")
        ]
        assert blob.name == f"rlctl/build-contexts/tpu-{ctx.sha256}.tar.gz"
        with tarfile.open(fileobj=io.BytesIO(blob.download_as_bytes()), mode="r:gz") as tar:
            assert tar.getnames() == [
                "Dockerfile",
                "requirements.txt",
                "rlctl-0.1.0-py3-none-any.whl",
            ]
        # the build request: one docker step, the image under its hash tag, build tags
        (req,) = fake.find("POST", r"/locations/us-central1/builds$")
        b = req.body
        assert b["source"]["storageSource"] == {"bucket": BUCKET, "object": blob.name}
        (step,) = b["steps"]
        assert step["name"] == "gcr.io/cloud-builders/docker"
        assert step["args"][:3] == ["build", "--platform", "linux/amd64"]
        assert step["args"][-3:] == ["-t", uri, "."]
        assert b["images"] == [uri]
        assert b["tags"] == ["rlctl", "rlctl-tpu", f"ctx-{ctx.sha256[:12]}"]
        assert image.image_exists(clients, uri) is True

    def test_an_unchanged_context_is_not_rebuilt(self, fake, clients, bucket):
        build(clients, accelerator="gpu")
        n = len(fake.builds)
        _, _, plan, res = build(clients, accelerator="gpu")
        assert plan.noop and [c.action for c in plan.changes] == ["unchanged"] * 3
        assert any("already exists and is reused" in x for x in plan.notes)
        assert not res.built and len(fake.builds) == n

    def test_an_extra_tag_builds_again_under_both(self, fake, clients, bucket):
        build(clients, accelerator="tpu")
        _, ctx, _, res = build(clients, accelerator="tpu", tags=["latest"])
        assert res.built and res.tags == [ctx.tag, "latest"]
        assert image.image_exists(clients, "us-central1-docker.pkg.dev/p/rlctl/rlctl-tpu:latest")

    def test_a_failed_build_is_one_line_with_its_step_and_log_url(self, fake, clients, bucket):
        fake.fail_build(
            0,
            'Build step failure: build step 0 "gcr.io/cloud-builders/docker" '
            "failed: step exited with non-zero status: 1",
        )
        with pytest.raises(CloudError) as e:
            build(clients, accelerator="tpu")
        msg = e.value.message
        assert "\n" not in msg
        assert msg.startswith("Cloud Build b")
        assert "failure at step 0 (build build)" in msg
        assert "step exited with non-zero status: 1" in msg
        assert (
            "logs: https://console.cloud.google.com/cloud-build/builds;region=us-central1/" in msg
        )
        assert e.value.exit_code == 7


class TestChecks:
    def test_image_exists(self, fake, clients):
        assert image.image_exists(clients, "docker.io/library/python:3.11") is None
        assert image.image_exists(clients, "us-docker.pkg.dev/p/r/x@sha256:abc") is None
        fake.repositories[("us", "r")] = {"name": "projects/p/locations/us/repositories/r"}
        assert image.image_exists(clients, "us-docker.pkg.dev/p/r/rlctl-tpu:1") is False
        fake.docker_images[("us", "r", "rlctl-tpu")] = {"1": "sha256:" + "0" * 64}
        assert image.image_exists(clients, "us-docker.pkg.dev/p/r/rlctl-tpu:1") is True

    def test_list(self, fake, clients, bucket):
        build(clients, accelerator="tpu")
        rows = image.list_images(clients, "p", "us-central1")
        (row,) = rows
        assert row["uri"].startswith("us-central1-docker.pkg.dev/p/rlctl/rlctl-tpu@sha256:")
        assert len(row["tags"]) == 1 and json.dumps(rows)
