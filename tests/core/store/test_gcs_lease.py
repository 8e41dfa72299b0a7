"""The writer lease of a gs:// run (``GcsRunDir.lock``) on fake-gcs-server: one holder
across hosts, renewed while held, taken over once expired, deleted on exit.

Two ``GcsRunDir`` objects on one run stand for two processes; a lease written by
hand stands for a holder on another host (whose pid cannot be checked from here).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rlctl.core.errors import ConfigError, ConflictError, NotFoundError
from rlctl.core.store.base import METRICS, STATUS
from rlctl.core.store.gcs import LEASE, GcsRunStore, _machine

KEY = f"runs/r1/{LEASE}"


@pytest.fixture()
def gstore(gcs, tmp_path, monkeypatch):
    monkeypatch.delenv("RLCTL_LEASE_TTL_S", raising=False)
    client, bucket = gcs
    return GcsRunStore(f"gs://{bucket}/runs", client=client, staging_root=str(tmp_path / "staging"))


def other(store: GcsRunStore) -> GcsRunStore:
    """The same store as another process would open it."""
    return GcsRunStore(
        store.uri, client=store.client, staging_root=store.staging_root, lease_ttl=store.lease_ttl
    )


def lease(store: GcsRunStore) -> dict | None:
    blob = store.bucket.get_blob(KEY)
    return None if blob is None else json.loads(blob.download_as_bytes())


def write_lease(store: GcsRunStore, content: dict | str) -> None:
    """A lease as another process wrote it (unconditionally, like a takeover)."""
    data = content if isinstance(content, str) else json.dumps(content)
    store.bucket.blob(KEY).upload_from_string(data)


def renewers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("rlctl-lease-")]


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


ELSEWHERE = {
    "pid": 4242,
    "host": "trainer-pod-0",
    "since": "2020-01-01T00:00:00+00:00",
    "renewed": "2020-01-01T00:00:00+00:00",
}


def test_lock_holds_a_lease_object_and_exit_deletes_it(gstore):
    run = gstore.run("r1")
    with run.lock():
        held = lease(gstore)
        assert held is not None
        assert {"pid", "host", "since", "renewed", "ttl_s"} <= held.keys()
        assert (held["pid"], held["host"], held["ttl_s"]) == (
            os.getpid(),
            socket.gethostname(),
            120.0,
        )
        assert held["since"].endswith("+00:00") and held["renewed"].endswith("+00:00")
        assert len(renewers()) == 1
    assert lease(gstore) is None and renewers() == []
    with pytest.raises(RuntimeError), run.lock():  # an exception exits just the same
        raise RuntimeError("boom")
    assert lease(gstore) is None and renewers() == []


def test_a_second_holder_gets_a_conflict_naming_the_first(gstore):
    first, second = gstore.run("r1"), other(gstore).run("r1")
    with first.lock():
        since = lease(gstore)["since"]
        with pytest.raises(ConflictError) as e, second.lock():
            pass
        assert str(e.value.message) == (
            f"run 'r1' is in use by pid {os.getpid()} on {socket.gethostname()} since {since}"
        )
        assert e.value.exit_code == 4
        assert "stop that process" in e.value.hint and "120 s" in e.value.hint
    with second.lock():  # free again once released
        assert lease(gstore)["since"] >= since


def test_a_fresh_lease_from_another_host_blocks_whatever_its_clock_says(gstore):
    write_lease(gstore, {**ELSEWHERE, "ttl_s": 30})  # "renewed" in 2020: GCS's time counts
    with (
        pytest.raises(
            ConflictError,
            match=re.escape("in use by pid 4242 on trainer-pod-0 since 2020-01-01T00:00:00+00:00"),
        ) as e,
        gstore.run("r1").lock(),
    ):
        pass
    assert "30 s" in e.value.hint
    assert lease(gstore)["pid"] == 4242  # left alone


def test_an_expired_lease_is_taken_over(gstore):
    write_lease(gstore, {**ELSEWHERE, "ttl_s": 1})
    time.sleep(1.3)  # no renewal for longer than its ttl: its holder is gone
    with gstore.run("r1").lock():
        assert lease(gstore)["pid"] == os.getpid()
    assert lease(gstore) is None


def test_a_damaged_lease_expires_after_the_default_ttl(gstore, monkeypatch):
    monkeypatch.setenv("RLCTL_LEASE_TTL_S", "2")
    write_lease(gstore, "{not json")
    with pytest.raises(ConflictError, match="in use by another process"), gstore.run("r1").lock():
        pass
    time.sleep(2.3)
    with gstore.run("r1").lock():
        assert lease(gstore)["pid"] == os.getpid()


def test_a_dead_holder_on_this_machine_is_taken_over_at_once(gstore):
    here = {**ELSEWHERE, "host": socket.gethostname(), "ttl_s": 600}
    write_lease(gstore, {**here, "pid": dead_pid(), "machine": "another-boot/1"})
    with pytest.raises(ConflictError), gstore.run("r1").lock():  # another pid namespace
        pass
    write_lease(gstore, {**here, "pid": dead_pid(), "machine": _machine()})
    with gstore.run("r1").lock():
        assert lease(gstore)["pid"] == os.getpid()


def test_renewals_keep_a_held_lease_alive_past_its_ttl(gstore):
    store = GcsRunStore(gstore.uri, client=gstore.client, lease_ttl=1.0)
    run = store.run("r1")
    with run.lock():
        first = store.bucket.get_blob(KEY)
        assert lease(store)["ttl_s"] == 1.0
        time.sleep(2.5)
        with (
            pytest.raises(ConflictError, match=f"pid {os.getpid()} on "),
            other(store).run("r1").lock(),
        ):
            pass
        now = store.bucket.get_blob(KEY)
        assert now.generation != first.generation and now.updated > first.updated
        assert lease(store)["since"] == json.loads(first.download_as_bytes())["since"]
    assert lease(store) is None


def test_a_stalled_holder_loses_its_lease_and_leaves_the_new_one_alone(gstore, monkeypatch):
    monkeypatch.setenv("RLCTL_LEASE_TTL_S", "1")
    stalled, taker = gstore.run("r1"), other(gstore).run("r1")
    hold = stalled.lock()
    hold.__enter__()
    stalled._lease._stop.set()  # its renewer stops, as in a frozen process
    stalled._lease._thread.join()
    time.sleep(1.3)
    with taker.lock():  # expired: taken over
        taken = lease(gstore)
        hold.__exit__(None, None, None)  # the stalled one exits: the new lease stays
        assert lease(gstore) == taken
        with pytest.raises(ConflictError), other(gstore).run("r1").lock():
            pass
    assert lease(gstore) is None


def test_a_holder_whose_lease_was_taken_stops_writing(gstore, monkeypatch):
    monkeypatch.setenv("RLCTL_LEASE_TTL_S", "1")
    run = gstore.run("r1")
    with run.lock():
        run.write_json(STATUS, {"phase": "running", "step": 1})
        write_lease(gstore, {**ELSEWHERE, "ttl_s": 60})  # another process took it over
        deadline = time.monotonic() + 10
        with pytest.raises(ConflictError, match="taken over by another process"):
            while time.monotonic() < deadline:  # the renewer notices within ttl/3
                run.write_json(STATUS, {"phase": "running", "step": 2})
                time.sleep(0.05)
        Path(run.path_for(METRICS)).write_text('{"step": 2}\n')
        with pytest.raises(ConflictError, match="taken over"):
            run.push(METRICS)
    assert lease(gstore)["pid"] == 4242  # not deleted on exit: it is not ours
    run.write_json(STATUS, {"phase": "failed"})  # no lease held: plain writes again


def test_a_bad_ttl_is_a_config_error(gstore, monkeypatch):
    for bad in ("abc", "0", "-5", "nan"):
        monkeypatch.setenv("RLCTL_LEASE_TTL_S", bad)
        with (
            pytest.raises(ConfigError, match=f"lease ttl '{bad}' .*RLCTL_LEASE_TTL_S"),
            gstore.run("r1").lock(),
        ):
            pass
    monkeypatch.delenv("RLCTL_LEASE_TTL_S")
    with (
        pytest.raises(ConfigError, match="'-1'"),
        GcsRunStore(gstore.uri, client=gstore.client, lease_ttl=-1).run("r1").lock(),
    ):
        pass
    assert lease(gstore) is None


def test_cloud_errors_are_translated(gcs):
    client, _ = gcs
    run = GcsRunStore("gs://no-such-bucket-here/runs", client=client).run("r1")
    # #47: said at the first request, naming the bucket
    with (
        pytest.raises(NotFoundError, match="bucket 'no-such-bucket-here' does not exist"),
        run.lock(),
    ):
        pass
    assert renewers() == []
