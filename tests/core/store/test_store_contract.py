"""One contract for every run store: the same tests against a local path and gs:// on
fake-gcs-server (the real google-cloud-storage client over HTTP on 127.0.0.1)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from rlctl.core.errors import ConfigError, ConflictError, NotFoundError
from rlctl.core.runs.status import describe_run, list_runs
from rlctl.core.store import open_store
from rlctl.core.store.base import CHECKPOINTS, METRICS, SPEC, STATUS, latest_checkpoint_step
from rlctl.core.store.local import LocalRunStore


@pytest.fixture(params=["local", "gcs"])
def store(request, tmp_path):
    if request.param == "local":
        return LocalRunStore(tmp_path / "runs")
    client, bucket = request.getfixturevalue("gcs")
    from rlctl.core.store.gcs import GcsRunStore

    return GcsRunStore(f"gs://{bucket}/runs", client=client, staging_root=str(tmp_path / "staging"))


def reopen(store):
    """A second handle on the same store, as another process would have."""
    if isinstance(store, LocalRunStore):
        return LocalRunStore(store.root)
    from rlctl.core.store.gcs import GcsRunStore

    return GcsRunStore(store.uri, client=store.client, staging_root=store.staging_root)


def save_fake_checkpoint(run, step: int) -> dict[str, bytes]:
    """Files as Orbax lays them out, written where the trainer writes them."""
    files = {
        "_CHECKPOINT_METADATA": b'{"ok": true}',
        "default/_METADATA": json.dumps({"step": step}).encode(),
        "default/d/0.bin": bytes(range(256)) * 40,
    }
    root = Path(run.path_for(f"{CHECKPOINTS}/{step}"))
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


class TestRunStoreContract:
    def test_text_and_json_round_trip(self, store):
        run = store.run("r1")
        run.write_text(SPEC, "name: r1\nnote: 'a: b'\n")
        run.write_json(STATUS, {"phase": "pending", "step": 0})
        assert run.read_text(SPEC) == "name: r1\nnote: 'a: b'\n"
        assert run.read_json(STATUS) == {"phase": "pending", "step": 0}
        assert reopen(store).run("r1").read_json(STATUS)["phase"] == "pending"

    def test_exists_and_list(self, store):
        run = store.run("r1")
        assert not run.exists() and not run.exists(SPEC)
        run.write_text(SPEC, "x")
        run.write_json("eval/baseline.json", {"accuracy": 0.5})
        run.write_json("eval/final.json", {"accuracy": 0.7})
        assert run.exists() and run.exists(SPEC) and run.exists("eval")
        assert not run.exists("eval/step-2.json")
        assert run.list("") == ["eval", "spec.yaml"]
        assert run.list("eval") == ["baseline.json", "final.json"]
        assert run.list("nothing") == []

    def test_missing_object_is_not_found(self, store):
        with pytest.raises(NotFoundError):
            store.run("r1").read_text(STATUS)
        with pytest.raises(NotFoundError, match="rlctl status"):
            store.existing("nope")

    def test_run_names_are_validated(self, store):
        for bad in ("Bad", "a/b", "../x", "x" * 41, ""):
            with pytest.raises(ConfigError):
                store.run(bad)

    def test_list_runs_counts_runs_and_runs_that_lost_their_spec(self, store):
        for name in ("b-run", "a-run"):
            store.run(name).write_text(SPEC, f"name: {name}\n")
        # spec.yaml is written first: a status without it is a run that lost it, listed
        # so the listing shows it damaged as the single view does (issue #25)
        store.run("half").write_json(STATUS, {"phase": "pending"})
        store.run("other").write_json("notes.json", {"not": "a run"})
        assert store.list_runs() == ["a-run", "b-run", "half"]
        assert store.existing("a-run").name == "a-run"
        rows = {r.name: r for r in list_runs(store)}
        assert "no spec.yaml" in (rows["half"].error or ""), rows["half"]

    def test_status_views_read_every_store(self, store):
        run = store.run("r1")
        run.write_text(SPEC, "name: r1\n")
        run.write_json(STATUS, {"phase": "running", "step": 2, "algorithm": "grpo"})
        Path(run.path_for(METRICS)).write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "lo')
        run.push(METRICS)
        info = describe_run(reopen(store).existing("r1"))
        # the torn last line is skipped; the steps done are the checkpoints' (#47, #57):
        # none yet, and row 1 after them; never status.json's 2
        assert (info.phase, info.step, info.steps_after_checkpoint, info.latest_metrics) == (
            "running",
            0,
            1,
            {"step": 1, "loss": 0.5},
        )
        assert [r.name for r in list_runs(store)] == ["r1"]

    def test_staged_files_are_pushed_and_pulled(self, store):
        run = store.run("r1")
        Path(run.path_for(METRICS)).write_text('{"step": 1}\n')
        tb = Path(run.path_for("tensorboard/events.out.tfevents.1"))
        tb.write_bytes(b"\x00\x01events")
        run.push(METRICS)
        run.push("tensorboard")
        other = reopen(store).run("r1")
        other.pull(METRICS)
        assert Path(other.path_for(METRICS)).read_text() == '{"step": 1}\n'
        assert other.list("tensorboard") == ["events.out.tfevents.1"]

    def test_published_checkpoint_is_complete_and_fetchable(self, store):
        run = store.run("r1")
        files = save_fake_checkpoint(run, 2)
        run.publish_checkpoint(2)
        assert run.checkpoint_steps() == [2]
        fresh = reopen(store).run("r1")
        assert latest_checkpoint_step(fresh) == 2
        fresh.fetch_checkpoint(2)
        got = Path(fresh.path_for(f"{CHECKPOINTS}/2"))
        assert {
            p.relative_to(got).as_posix(): p.read_bytes() for p in got.rglob("*") if p.is_file()
        } == files

    def test_an_unfinished_checkpoint_is_never_the_latest(self, store):
        run = store.run("r1")
        save_fake_checkpoint(run, 2)
        run.publish_checkpoint(2)
        if isinstance(store, LocalRunStore):  # Orbax's temp folder of a killed save
            Path(run.path_for(f"{CHECKPOINTS}/4.orbax-checkpoint-tmp-17")).mkdir()
        else:  # a killed upload: the files of step 4 but no marker
            save_fake_checkpoint(run, 4)
            run.push(f"{CHECKPOINTS}/4")
        assert latest_checkpoint_step(reopen(store).run("r1")) == 2

    def test_a_checkpoint_set_aside_keeps_its_data_and_is_no_longer_complete(self, store):
        from rlctl.core.store.base import set_aside_checkpoints

        run = store.run("r1")
        files = save_fake_checkpoint(run, 2)
        run.publish_checkpoint(2)
        run.move(f"{CHECKPOINTS}/2", f"{CHECKPOINTS}/2.damaged")
        fresh = reopen(store).run("r1")
        assert fresh.checkpoint_steps() == [] and latest_checkpoint_step(fresh) is None
        assert set_aside_checkpoints(fresh) == ["2.damaged"]
        fresh.pull(f"{CHECKPOINTS}/2.damaged")
        got = Path(fresh.path_for(f"{CHECKPOINTS}/2.damaged"))
        assert {
            p.relative_to(got).as_posix(): p.read_bytes() for p in got.rglob("*") if p.is_file()
        } == files

    def test_delete_removes_the_run(self, store):
        run = store.run("r1")
        run.write_text(SPEC, "x")
        save_fake_checkpoint(run, 2)
        run.publish_checkpoint(2)
        assert run.delete("")
        assert not reopen(store).run("r1").exists()
        assert store.list_runs() == []

    def test_readers_never_see_a_half_written_status(self, store):
        run = store.run("r1")
        run.write_json(STATUS, {"step": 0, "pad": "x" * 200_000})
        seen, stop = [], threading.Event()
        reader = reopen(store).run("r1")

        def read_loop():
            while not stop.is_set():
                seen.append(json.loads(reader.read_text(STATUS))["step"])

        t = threading.Thread(target=read_loop)
        t.start()
        try:
            for step in range(1, 8):
                run.write_json(STATUS, {"step": step, "pad": "x" * 200_000})
        finally:
            stop.set()
            t.join()
        assert seen and all(0 <= s <= 7 for s in seen)  # each read parsed as whole JSON


class TestGcsCommits:
    @pytest.fixture()
    def gstore(self, gcs, tmp_path):
        from rlctl.core.store.gcs import GcsRunStore

        client, bucket = gcs
        return GcsRunStore(
            f"gs://{bucket}/runs", client=client, staging_root=str(tmp_path / "staging")
        )

    def test_concurrent_status_writer_gets_a_conflict_not_a_lost_update(self, gstore):
        a = gstore.run("r1")
        a.write_json(STATUS, {"phase": "running", "step": 1})
        b = reopen(gstore).run("r1")
        assert b.read_json(STATUS)["step"] == 1  # b now holds generation g1
        a.write_json(STATUS, {"phase": "running", "step": 2})  # a moves it to g2
        with pytest.raises(ConflictError, match="another writer"):
            b.write_json(STATUS, {"phase": "failed", "step": 1})  # 412 on g1
        assert reopen(gstore).run("r1").read_json(STATUS) == {"phase": "running", "step": 2}

    def test_two_creators_of_one_run_cannot_both_win(self, gstore):
        a, b = gstore.run("r1"), reopen(gstore).run("r1")
        a.write_text(SPEC, "name: r1\nseed: 1\n")
        with pytest.raises(ConflictError):
            b.write_text(SPEC, "name: r1\nseed: 2\n")
        assert gstore.run("r1").read_text(SPEC).endswith("seed: 1\n")

    def test_marker_is_written_after_the_files(self, gstore, gcs):
        client, bucket = gcs
        run = gstore.run("r1")
        save_fake_checkpoint(run, 2)
        run.publish_checkpoint(2)
        blobs = {b.name: b for b in client.list_blobs(bucket, prefix="runs/r1/checkpoints/2/")}
        marker = blobs.pop("runs/r1/checkpoints/2/COMMITTED")
        assert len(blobs) == 3
        assert all(
            b.generation < marker.generation or b.updated <= marker.updated for b in blobs.values()
        )
        assert json.loads(marker.download_as_bytes())["files"] == sorted(
            n.rsplit("/2/", 1)[1] for n in blobs
        )

    def test_pruned_checkpoints_leave_the_store(self, gstore):
        import shutil

        run = gstore.run("r1")
        save_fake_checkpoint(run, 2)
        run.publish_checkpoint(2)
        save_fake_checkpoint(run, 4)
        shutil.rmtree(run.path_for(f"{CHECKPOINTS}/2"))  # Orbax max_to_keep=1
        run.publish_checkpoint(4)
        assert run.checkpoint_steps() == [4]
        assert run.list(CHECKPOINTS) == ["4"]

    def test_open_store_picks_the_backend(self, gcs, tmp_path):
        from rlctl.core.store.gcs import GcsRunStore

        _, bucket = gcs
        assert isinstance(open_store(f"gs://{bucket}/runs"), GcsRunStore)
        assert isinstance(open_store(str(tmp_path)), LocalRunStore)
        with pytest.raises(ConfigError):
            open_store("s3://x/y")


class TestOneWriter:
    def test_spec_is_written_once_so_two_creators_cannot_both_win(self, store):
        a, b = store.run("r1"), reopen(store).run("r1")
        a.write_text(SPEC, "name: r1\nseed: 1\n")
        with pytest.raises(ConflictError):
            b.write_text(SPEC, "name: r1\nseed: 2\n")
        assert reopen(store).run("r1").read_text(SPEC).endswith("seed: 1\n")

    def test_a_run_has_one_holder_until_it_dies(self, store):
        """Local: an fcntl lock. gs://: a lease object, which a holder on this machine
        whose pid is gone loses at once (elsewhere: after its ttl, test_gcs_lease.py)."""
        import os
        import re
        import signal
        import socket
        import subprocess
        import sys

        run, second = store.run("r1"), reopen(store).run("r1")
        held = re.escape(f"in use by pid {os.getpid()} on {socket.gethostname()} since ")
        with run.lock(), pytest.raises(ConflictError, match=held) as e, second.lock():
            pass
        assert e.value.exit_code == 4 and "stop that process" in (e.value.hint or "")
        with second.lock():  # released on exit
            pass
        code = (
            "import sys, time; from rlctl.core.store import open_store;"
            "cm = open_store(sys.argv[1]).run('r1').lock(); cm.__enter__();"
            "print('held', flush=True); time.sleep(60)"
        )
        holder = subprocess.Popen(
            [sys.executable, "-c", code, store.uri], stdout=subprocess.PIPE, text=True
        )
        try:
            assert holder.stdout.readline().strip() == "held"
            with pytest.raises(ConflictError, match=f"pid {holder.pid} on "), run.lock():
                pass
        finally:
            holder.send_signal(signal.SIGKILL)
            holder.wait()
        with run.lock():  # a SIGKILLed holder's lock is gone (its pid is)
            pass
