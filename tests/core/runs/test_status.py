"""Damaged run files are described, never raised: one bad run cannot break ``status``
for the others, and ``resume`` rebuilds a damaged status.json keeping ``created``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from rlctl.cli.app import app
from rlctl.core.errors import RunInUseError
from rlctl.core.runs.local import StatusFile
from rlctl.core.runs.spec import resolve_run_spec
from rlctl.core.runs.status import describe_run, list_runs, run_phase
from rlctl.core.store.base import METRICS, SPEC, STATUS, Phase
from rlctl.core.store.local import LocalRunStore
from rlctl.core.trainer.run.metrics import MetricsWriter

GOOD_STATUS = {
    "phase": "interrupted",
    "step": 2,
    "total_steps": 4,
    "algorithm": "grpo",
    "created": "2026-01-02T03:04:05+00:00",
}
ROWS = [{"step": 1, "reward": 0.5}, {"step": 2, "reward": 0.75}]

# file -> bytes that broke `status` (a traceback) before
DAMAGE = {
    "status garbage": (STATUS, b"\x00\xff{not json"),
    "status list": (STATUS, b"[1, 2, 3]"),
    "status not utf-8": (STATUS, b'{"phase": "\xff"}'),
    "status wrong types": (STATUS, b'{"phase": 42, "step": "x", "created": 7, "devices": []}'),
    "metrics bytes appended": (METRICS, None),  # good rows, then binary junk
    "metrics a list row": (METRICS, b'[1, 2]\n{"step": 1, "reward": 0.5}\n'),
    "eval cut": ("eval/baseline.json", b'{"which": "baseline", "acc'),
    "eval wrong types": ("eval/baseline.json", b'{"accuracy": "high", "n": []}'),
}


def make_run(store: LocalRunStore, name: str):
    run = store.run(name)
    run.write_text(SPEC, f"name: {name}\n")
    run.write_json(STATUS, GOOD_STATUS)
    run.write_text(METRICS, "".join(json.dumps(r) + "\n" for r in ROWS))
    return run


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_file_leaves_the_other_runs_readable(tmp_path, case):
    store = LocalRunStore(tmp_path)
    make_run(store, "good")
    bad = make_run(store, "bad")
    rel, data = DAMAGE[case]
    path = bad.path / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if data is None:
        data = path.read_bytes() + b"\xff\xfe garbage\n"
    path.write_bytes(data)

    infos = {i.name: i for i in list_runs(store)}
    good = infos["good"]
    # no checkpoint: 0 steps done, its two rows after it (#57)
    assert (good.phase, good.step, good.steps_after_checkpoint) == (Phase.INTERRUPTED, 0, 2)
    assert good.damaged is None
    info = infos["bad"]
    if rel == STATUS:
        assert info.phase is Phase.UNKNOWN
        if case != "status wrong types":
            assert info.error and info.error.startswith("damaged: status.json")
    if rel == METRICS:
        assert info.latest_metrics in (ROWS[-1], ROWS[0])  # the readable rows only
    if rel.startswith("eval/"):
        assert info.eval.baseline is None
    json.dumps(info.model_dump(mode="json"))  # -o json still works

    r = CliRunner().invoke(app, ["status", "--runs-dir", str(tmp_path), "-o", "json"])
    assert r.exit_code == 0, r.output
    assert sorted(row["name"] for row in json.loads(r.stdout)) == ["bad", "good"]


SPEC_4 = "name: r1\ntraining:\n  steps: 4\n"


# file -> bytes that are damage the table did not mark before #57 (a spec.yaml that
# cannot be read, a metrics row that cannot be the run's)
MORE_DAMAGE = {
    "spec garbage": (SPEC, b":: [unclosed\n\0\n"),
    "spec wrong types": (SPEC, b"training:\n  steps: many\n"),
    "metrics beyond the spec": (METRICS, b'{"step": 1}\n{"step": 2}\n{"step": 99}\n'),
    "metrics out of order": (METRICS, b'{"step": 2}\n{"step": 1}\n'),
}


@pytest.mark.parametrize("case", sorted({**DAMAGE, **MORE_DAMAGE}))
def test_the_table_marks_a_damaged_run_as_its_json_does(tmp_path, case):
    """#57 case 3: every run whose ``-o json`` says ``damaged`` is marked so in the
    table (wide, and folded on a narrow terminal), and no other run is."""
    store = LocalRunStore(tmp_path)
    make_run(store, "good")
    bad = make_run(store, "bad")
    rel, data = {**DAMAGE, **MORE_DAMAGE}[case]
    path = bad.path / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(path.read_bytes() + b"\xff\xfe garbage\n" if data is None else data)
    runner = CliRunner()
    r = runner.invoke(app, ["status", "--runs-dir", str(tmp_path), "-o", "json"])
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert rows["bad"].get("damaged") and not rows["good"].get("damaged"), rows
    assert rows["bad"]["error"].startswith(f"damaged: {rows['bad']['damaged']}")
    wide = runner.invoke(app, ["status", "--runs-dir", str(tmp_path)], env={"COLUMNS": "120"})
    assert wide.output.count("(damaged)") == 1, wide.output
    narrow = runner.invoke(app, ["status", "--runs-dir", str(tmp_path)], env={"COLUMNS": "40"})
    lines = narrow.output.splitlines()
    assert lines[lines.index("bad") + 1].endswith(" (damaged)"), narrow.output
    assert not lines[lines.index("good") + 1].endswith(" (damaged)"), narrow.output
    view = runner.invoke(app, ["status", "bad", "--runs-dir", str(tmp_path)]).output
    assert f"  phase       {rows['bad']['phase']} (damaged)" in view, view


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (
            '{"step": 1}\n{"step": 2}\n{"step": 99}\n',
            "metrics.jsonl line 3: step 99 is beyond the run's 4 steps",
        ),
        (
            '{"step": 2}\n{"step": 1}\n',
            "metrics.jsonl line 2: step 1 is out of order (after step 2)",
        ),
        (
            '{"step": 1}\n{"step": 1}\n',
            "metrics.jsonl line 2: step 1 is out of order (after step 1)",
        ),
        ('{"step": 1}\nnot json\n{"step": 2}\n', "metrics.jsonl line 2 is not JSON"),
        ('{"step": 1}\n[1]\n', "metrics.jsonl line 2 is not a JSON object"),
        ('{"step": "2"}\n', "metrics.jsonl line 1 has no step number"),
        ('{"step": 0}\n', "metrics.jsonl line 1: step 0 is not a step (they count from 1)"),
        ('[1]\n{"step": 9}\n', "metrics.jsonl line 1 is not a JSON object (and 1 more line)"),
    ],
)
def test_a_metrics_row_that_cannot_be_trusted_is_damage_named_by_line(tmp_path, text, why):
    """#57: a row beyond the spec, out of order or unreadable is damage, its file and
    line named; the steps come from the checkpoints, never from such a row."""
    run = make_run(LocalRunStore(tmp_path), "r1")
    (run.path / SPEC).write_text(SPEC_4)
    (run.path / METRICS).write_text(text)
    info = describe_run(run)
    assert info.damaged and info.damaged.startswith(why), info.damaged
    assert info.step == 0  # no checkpoint: no row makes progress
    last = info.latest_metrics or {}
    assert last.get("step") in (1, 2) or not last, last  # a trusted row, or none


@pytest.mark.parametrize("rel", [SPEC, METRICS])
def test_a_folder_where_a_file_should_be_is_damage_not_a_traceback(tmp_path, rel):
    """Every run's spec.yaml and metrics.jsonl are read for its listing (#57): one
    that cannot be read is named, and the other runs stay readable."""
    store = LocalRunStore(tmp_path)
    make_run(store, "good")
    bad = make_run(store, "bad")
    (bad.path / rel).unlink()
    (bad.path / rel).mkdir()
    infos = {i.name: i for i in list_runs(store)}
    assert f"{rel} cannot be read (Is a directory)" in (infos["bad"].damaged or "")
    assert infos["good"].damaged is None


def test_the_steps_done_are_the_newest_checkpoint_that_verifies(tmp_path):
    """#57: checkpoint 2 lost bytes (a cut copy, a full disk): the run is at
    checkpoint 1, the one resume restores, and checkpoint 2 is named damaged; its
    files are checked by size, not read (store/manifest.py ``verify``)."""
    from rlctl.core.store.manifest import write_manifest

    run = make_run(LocalRunStore(tmp_path), "r1")
    (run.path / SPEC).write_text(SPEC_4)
    for step in (1, 2):
        folder = run.path / "checkpoints" / str(step)
        folder.mkdir(parents=True)
        (folder / "_CHECKPOINT_METADATA").write_text("{}")
        (folder / "d").write_bytes(b"weights")
        write_manifest(folder)
    assert describe_run(run).step == 2
    (run.path / "checkpoints" / "2" / "d").write_bytes(b"wei")
    info = describe_run(run)
    assert (info.step, info.latest_checkpoint, info.steps_after_checkpoint) == (1, 1, 1)
    assert info.damaged == "checkpoint 2 is damaged (d has 3 bytes, not 7): resume sets it aside"


def test_a_torn_last_row_is_a_write_in_progress_not_damage(tmp_path):
    run = make_run(LocalRunStore(tmp_path), "r1")
    (run.path / SPEC).write_text(SPEC_4)
    (run.path / METRICS).write_text('{"step": 1}\n{"step": 2, "re')
    info = describe_run(run)
    assert info.damaged is None and info.latest_metrics == {"step": 1}
    assert (info.step, info.steps_after_checkpoint) == (0, 1)


def test_resume_truncation_skips_lines_that_are_not_rows(tmp_path):
    run = make_run(LocalRunStore(tmp_path), "r1")
    with open(run.path / METRICS, "ab") as f:
        f.write(b'[3]\n\xff\xfe\n{"step": "3"}\n{"step": 3, "reward": 1.0}\n')
    MetricsWriter(run, tensorboard=False).truncate_after(2)
    assert describe_run(run).latest_metrics == ROWS[-1]
    assert [json.loads(x) for x in (run.path / METRICS).read_text().splitlines()] == ROWS


def test_a_row_with_bytes_that_are_not_utf8_is_damage_even_if_it_parses(tmp_path):
    """Two bad bytes inside a key ('"\xff\xfeward"') decode to U+FFFD and the row
    still parses as JSON: it is counted as an unreadable line, not taken as a row
    (bench/fuzz_cli.py store-damage/metrics-non-utf8)."""
    run = make_run(LocalRunStore(tmp_path), "r1")
    raw = bytearray((run.path / METRICS).read_bytes())
    i = raw.index(b'"reward"')
    raw[i + 1 : i + 3] = b"\xff\xfe"
    (run.path / METRICS).write_bytes(bytes(raw))
    info = describe_run(run)
    assert "metrics.jsonl line 1 is not UTF-8 text" in (info.error or ""), info.error


def test_a_rebuilt_status_keeps_when_the_run_was_created(tmp_path):
    run = make_run(LocalRunStore(tmp_path), "r1")
    created = 1_700_000_000  # 2023-11-14T22:13:20Z
    os.utime(run.path / SPEC, (created, created))
    (run.path / STATUS).write_bytes(b"\x00garbage")
    spec = resolve_run_spec("grpo", flags={"name": "r1", "output.root": str(tmp_path)})
    status = StatusFile(run, spec)
    status.update(phase=Phase.STARTING)
    saved = json.loads((run.path / STATUS).read_text())
    assert saved["created"] == "2023-11-14T22:13:20+00:00"
    assert "damaged" not in saved and saved["phase"] == "starting"


def test_an_intact_status_keeps_its_created(tmp_path):
    run = make_run(LocalRunStore(tmp_path), "r1")
    spec = resolve_run_spec("grpo", flags={"name": "r1", "output.root": str(tmp_path)})
    StatusFile(run, spec).update(phase=Phase.STARTING)
    assert json.loads((run.path / STATUS).read_text())["created"] == GOOD_STATUS["created"]


def test_an_attempt_on_another_host_count_is_recorded_and_shown(tmp_path):
    """An elastic Ray job that grew from one host to two, then lost one: each attempt
    that starts on another count is kept in status.json and shown by ``status``."""
    store = LocalRunStore(tmp_path)
    run = make_run(store, "elastic")
    spec = resolve_run_spec("grpo", flags={"name": "elastic", "output.root": str(tmp_path)})
    status = StatusFile(run, spec)
    first = status.update(phase=Phase.RUNNING, step=0, processes=1, devices=8)  # first attempt
    same = status.update(phase=Phase.RUNNING, step=1, processes=1, devices=8)
    grew = status.update(phase=Phase.RUNNING, step=2, processes=2, devices=16)
    status.update(phase=Phase.STARTING)  # a new attempt names no count yet
    shrank = StatusFile(run, spec).update(phase=Phase.RUNNING, step=4, processes=1, devices=8)
    assert first is None and same is None
    assert (grew.step, grew.hosts, grew.devices) == (2, (1, 2), (8, 16))
    assert (shrank.step, shrank.hosts) == (4, (2, 1))
    saved = json.loads((run.path / STATUS).read_text())
    assert [r["hosts"] for r in saved["resizes"]] == [[1, 2], [2, 1]]

    info = describe_run(run)
    assert [r.text for r in info.resizes] == [
        "1 -> 2 hosts (8 -> 16 devices) at step 2",
        "2 -> 1 hosts (16 -> 8 devices) at step 4",
    ]
    shown = CliRunner().invoke(app, ["status", "elastic", "--runs-dir", str(tmp_path)])
    assert "resized     1 -> 2 hosts (8 -> 16 devices) at step 2; 2 -> 1 hosts" in shown.stdout
    as_json = CliRunner().invoke(
        app, ["status", "elastic", "--runs-dir", str(tmp_path), "-o", "json"]
    )
    assert json.loads(as_json.stdout)["resizes"][1]["hosts"] == [2, 1]


def test_a_damaged_resize_entry_is_left_out(tmp_path):
    run = make_run(LocalRunStore(tmp_path), "r1")
    good = {"step": 2, "hosts": [1, 2], "devices": [1, 2], "at": "t"}
    run.write_json(STATUS, {**GOOD_STATUS, "resizes": ["x", {"step": -1}, good, 7]})
    assert [r.hosts for r in describe_run(run).resizes] == [(1, 2)]


class TestLiveness:
    """A SIGKILLed run's status.json still says ``running``: ``status`` must not."""

    def dead_pid(self) -> int:
        proc = subprocess.Popen([sys.executable, "-c", "pass"])
        proc.wait()
        return proc.pid

    def test_a_run_whose_process_is_gone_is_stale(self, tmp_path):
        run = make_run(LocalRunStore(tmp_path), "r1")
        run.write_json(
            STATUS,
            {
                **GOOD_STATUS,
                "phase": "running",
                "backend": "local",
                "pid": self.dead_pid(),
                "host": socket.gethostname(),
            },
        )
        info = describe_run(run)
        assert info.phase is Phase.STALE and info.finished
        assert "rlctl resume r1" in info.error
        r = CliRunner().invoke(app, ["status", "r1", "--runs-dir", str(tmp_path)])
        assert r.exit_code == 0 and "stale" in r.stdout, r.output

    def test_without_its_lock_a_live_pid_is_not_running(self, tmp_path):
        """#57 case 2: a pid alive here (another process now) or on another host, with
        no .lock in the folder: nothing holds the run, whatever the pid (before: running)."""
        run = make_run(LocalRunStore(tmp_path), "r1")
        for pid, host in [(os.getppid(), socket.gethostname()), (self.dead_pid(), "elsewhere")]:
            run.write_json(
                STATUS,
                {**GOOD_STATUS, "phase": "running", "backend": "local", "pid": pid, "host": host},
            )
            info = describe_run(run)
            assert info.phase is Phase.STALE, (pid, host)
            assert "no process holds its lock" in (info.error or ""), info.error
            assert run_phase(run) is Phase.STALE  # what 'logs -f' ends on

    def hold(self, run, record: str | None = None) -> subprocess.Popen:
        """Another process holding the run's lock: rlctl's own ``lock()`` (``record``
        None), or a bare flock over the file with ``record`` written in it ("PID": the
        holder's pid), as a child that inherited the lock's descriptor holds it."""
        if record is None:
            code = (
                "import sys, time; from rlctl.core.store.local import LocalRunStore; "
                "cm = LocalRunStore(sys.argv[1]).run('r1').lock(); cm.__enter__(); "
                "print('held', flush=True); time.sleep(60)"
            )
            args = [str(run.path.parent)]
        else:
            code = (
                "import fcntl, os, sys, time; "
                "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
                "fcntl.flock(fd, fcntl.LOCK_EX); os.ftruncate(fd, 0); "
                "os.pwrite(fd, sys.argv[2].replace('PID', str(os.getpid())).encode(), 0); "
                "print('held', flush=True); time.sleep(60)"
            )
            args = [str(run.path / ".lock"), record]
        holder = subprocess.Popen(
            [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True
        )
        assert holder.stdout.readline().strip() == "held"
        return holder

    def running(self, run, pid: int) -> None:
        run.write_json(
            STATUS,
            {
                **GOOD_STATUS,
                "phase": "running",
                "backend": "local",
                "pid": pid,
                "host": socket.gethostname(),
            },
        )

    def test_the_lock_not_the_pid_decides(self, tmp_path):
        """A pid recorded by a killed run is reused by an unrelated live process:
        with the run's lock free the run is stale, and with it held (by the process
        the lock records) it is running whatever status.json's pid (issue #25)."""
        run = make_run(LocalRunStore(tmp_path), "r1")
        self.running(run, os.getppid())
        with run.lock():
            pass  # the file a real run leaves behind, its lock released
        assert run.lock_state().held is False
        assert describe_run(run).phase is Phase.STALE
        holder = self.hold(run)
        try:
            self.running(run, self.dead_pid())
            assert run.lock_state().held is True
            assert describe_run(run).phase is Phase.RUNNING
        finally:
            holder.kill()
            holder.wait()
        info = describe_run(run)
        assert info.phase is Phase.STALE and "no process holds its lock" in info.error

    def test_the_lock_records_its_holders_start_time(self, tmp_path):
        """pid and the kernel's start time of the process (/proc/PID/stat field 22),
        checked against psutil's reading of the same clock."""
        psutil = pytest.importorskip("psutil")
        run = make_run(LocalRunStore(tmp_path), "r1")
        with run.lock():
            record = json.loads((run.path / ".lock").read_text())
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
        ticks = os.sysconf("SC_CLK_TCK")
        started = psutil.boot_time() + record["start"] / ticks
        assert abs(started - psutil.Process().create_time()) < 2 / ticks

    def test_a_lock_held_by_another_process_than_it_records_is_not_running(self, tmp_path):
        """#57: the lock is held, but not by the process it names (that one ended, or
        its pid is another process now): a child of a killed trainer holding the
        inherited descriptor, say. Before: 'running' on the kernel's word alone."""
        run = make_run(LocalRunStore(tmp_path), "r1")
        host = socket.gethostname()
        with run.lock():
            mine = json.loads((run.path / ".lock").read_text())
        for pid, start, why in [
            (self.dead_pid(), mine["start"], "has ended"),
            (os.getpid(), mine["start"] + 1, "is another process now"),
        ]:
            record = json.dumps({**mine, "pid": pid, "start": start, "host": host})
            self.running(run, pid)
            holder = self.hold(run, record)
            try:
                assert run.lock_state().held is False
                info = describe_run(run)
                assert info.phase is Phase.STALE, info
                assert f"pid {pid} {why}" in info.error and "holds its lock" in info.error
                # resume says the same: the lock is held, not by the process it names
                refused = pytest.raises(
                    RunInUseError, match=f"its lock records holds it .pid {pid}"
                )
                with refused, run.lock():
                    pass
            finally:
                holder.kill()
                holder.wait()

    def test_an_older_rlctls_lock_record_is_read(self, tmp_path):
        """A lock written before #57 (pid, host, since; no start time), held by a live
        process it names: running, as then."""
        run = make_run(LocalRunStore(tmp_path), "r1")
        old = json.dumps({"pid": "PID", "host": socket.gethostname(), "since": "2026-01-01"})
        holder = self.hold(run, old.replace('"PID"', "PID"))
        try:
            self.running(run, holder.pid)
            assert describe_run(run).phase is Phase.RUNNING
        finally:
            holder.kill()
            holder.wait()
        assert describe_run(run).phase is Phase.STALE

    def test_a_cluster_run_is_left_to_its_workload(self, tmp_path):
        run = make_run(LocalRunStore(tmp_path), "r1")
        run.write_json(STATUS, {**GOOD_STATUS, "phase": "running", "backend": "jobset"})
        assert describe_run(run).phase is Phase.RUNNING
