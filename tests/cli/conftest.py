from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_local_gcloud(tmp_path, monkeypatch):
    """Isolate from the machine's gcloud config and RLCTL_* env."""
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    for v in (
        "RLCTL_PROJECT",
        "RLCTL_REGION",
        "RLCTL_ZONE",
        "GOOGLE_CLOUD_PROJECT",
        "CLOUDSDK_CORE_PROJECT",
        "CLOUDSDK_COMPUTE_REGION",
        "CLOUDSDK_COMPUTE_ZONE",
        "RLCTL_OUTPUT",
        "RLCTL_SET",
    ):
        monkeypatch.delenv(v, raising=False)


@pytest.fixture
def kube(fake):
    """The Kubernetes API of every cluster the fake GCP makes (controllers, namespace, KSA)."""
    pytest.importorskip("kubernetes")
    from tests.fakes.k8s import FakeKube

    with FakeKube() as k:
        fake.kube_endpoint = k.url
        yield k


@pytest.fixture
def cli(clients, kube):
    from typer.testing import CliRunner

    from rlctl.cli._options import AppState
    from rlctl.cli.app import app

    def invoke(*args: str):
        return CliRunner().invoke(app, list(args), obj=AppState(clients=clients))

    return invoke
