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


@pytest.fixture()
def runner():
    from typer.testing import CliRunner

    return CliRunner()
