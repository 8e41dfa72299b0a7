"""#47 point 4, the store's files are the truth: the steps done come from complete
checkpoints, never status.json alone (nor, #57, a metrics row); only complete, properly
numbered checkpoint folders count; a stale run shows its damage and the command that
helps; ``resume --recover`` reads what it was given. #57: a run is running only while
its lock is held by the process it records."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from tests.faults.conftest import metrics, one_error

pytestmark = pytest.mark.trainer


def _status(run: Path, **fields) -> None:
    data = json.loads((run / "status.json").read_text())
    data.update(fields)
    (run / "status.json").write_text(json.dumps(data))


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_a_status_json_that_overstates_the_steps_is_not_believed(cli, store):
    run = store / "ok"
    _status(run, step=50, phase="interrupted")
    shown = json.loads(cli("status", "ok", "--runs-dir", str(store), "-o", "json").stdout)
    assert shown["step"] == 2  # checkpoint 2 and metrics rows 1-2, not status.json's 50
    r = cli("resume", "ok", "--runs-dir", str(store), "--steps", "2")
    one_error(r, 2, "--steps 2 must be more than the 2 steps")
    assert "pass --steps 3 or more" in r.stderr  # not 51
    r = cli("resume", "ok", "--runs-dir", str(store), "--steps", "3")
    assert r.returncode == 0, r.stderr
    assert [m["step"] for m in metrics(run)] == [1, 2, 3]


def test_only_complete_properly_numbered_checkpoints_count(cli, store, tmp_path):
    ckpts = store / "ok" / "checkpoints"
    shutil.copytree(ckpts / "2", ckpts / "07")  # no step name to Orbax: ignored
    (ckpts / "²").mkdir()  # str.isdigit() says yes, int() says no: ignored
    (ckpts / "9").mkdir()  # empty: no checkpoint, set aside when the run reopens
    shutil.copytree(ckpts / "2", ckpts / "8")
    (ckpts / "8" / "_CHECKPOINT_METADATA").unlink()  # copied without its metadata
    (ckpts / "8" / "rlctl-manifest.json").unlink()
    shown = json.loads(cli("status", "ok", "--runs-dir", str(store), "-o", "json").stdout)
    assert shown["latest_checkpoint"] == 2 and shown["step"] == 2
    plan = cli("delete", "run", "ok", "--runs-dir", str(store), "--dry-run")
    assert plan.returncode == 0, plan.stderr
    r = cli("checkpoint-convert", str(store / "ok"), str(tmp_path / "hf"))
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "hf" / "config.json").read_text())
    r = cli("resume", "ok", "--runs-dir", str(store), "--steps", "3")
    assert r.returncode == 0, r.stderr
    assert (
        "checkpoint 9 is incomplete (its folder is empty); moved to checkpoints/9.damaged"
        in r.stderr
    )
    assert "checkpoint 8 is incomplete" in r.stderr
    assert [m["step"] for m in metrics(store / "ok")] == [1, 2, 3]
    assert {"07", "²", "9.damaged", "8.damaged", "3"} <= {p.name for p in ckpts.iterdir()}


def _set_aside_all(run: Path) -> None:
    for n in ("1", "2"):
        (run / "checkpoints" / n).rename(run / "checkpoints" / f"{n}.damaged")


def test_a_stale_run_shows_its_damage_and_the_command_that_helps(cli, store):
    run = store / "ok"
    _set_aside_all(run)  # intact, but set aside (an earlier read failed)
    _status(run, phase="running", pid=_dead_pid(), step=2)
    shown = json.loads(cli("status", "ok", "--runs-dir", str(store), "-o", "json").stdout)
    assert shown["phase"] == "stale"
    error = shown["error"]
    assert error.startswith(
        "damaged: checkpoints set aside: checkpoints/2.damaged, checkpoints/1.damaged"
    ), error
    assert "ended without finishing" in error and "'rlctl resume ok --recover'" in error
    table = cli("status", "--runs-dir", str(store), env={"COLUMNS": "120"})
    assert "stale (damaged)" in table.stdout, table.stdout
    one_error(cli("resume", "ok", "--runs-dir", str(store)), 4, "no intact checkpoint")
    # the command status gave works: --recover reads the intact set-aside checkpoint
    r = cli("resume", "ok", "--runs-dir", str(store), "--recover", "--steps", "3")
    assert r.returncode == 0, r.stderr
    assert "recovering checkpoint 2 from checkpoints/2.damaged" in r.stderr
    assert [m["step"] for m in metrics(run)] == [1, 2, 3]


def test_recover_refuses_only_after_reading_and_says_what_helps(cli, store):
    run = store / "ok"
    (run / "checkpoints" / "1").rename(run / "checkpoints" / "1.damaged")
    _status(run, phase="interrupted")
    r = cli("resume", "ok", "--runs-dir", str(store), "--recover")
    line = one_error(
        r,
        4,
        "nothing to recover",
        "checkpoints/1.damaged is not newer than the intact checkpoint 2",
    )
    assert "resume without --recover: it continues from checkpoint 2" in r.stderr, line
    assert "delete run" not in r.stderr


# --- #57: progress is the newest checkpoint; "running" needs the run's lock ---------


def _spec_steps(run: Path, steps: int) -> None:
    """spec.yaml's ``training.steps`` set to ``steps`` (and status.json's record of it)."""
    text = (run / "spec.yaml").read_text()
    new = re.sub(r"(?m)^(  steps:) \d+$", rf"\g<1> {steps}", text, count=1)
    assert new != text, text
    (run / "spec.yaml").write_text(new)
    _status(run, total_steps=steps)


def _ok_row(table: str) -> str:
    """The table's row of run ``ok`` (rich draws a row as one line at 120 columns)."""
    rows = [line for line in table.splitlines() if re.search(r"\bok\b", line)]
    assert len(rows) == 1, table
    return rows[0]


def _log_ends(cli, store: Path, phase: str) -> None:
    """``logs -f`` agrees with ``status``: the run is not active, its log ends now."""
    r = cli("logs", "ok", "-f", "--runs-dir", str(store), timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"run ok is {phase}: its log ends here" in r.stderr, r.stderr


def test_a_garbage_metrics_row_is_not_the_runs_progress(cli, store):
    """#57 case 1: checkpoint 2 of a 3-step run whose metrics.jsonl ends with a row of
    step 99. Before: listed as 99/3 with no damage mark, and the hint was
    '--steps N (N > 99)' (training from checkpoint 2 to step 100)."""
    run = store / "ok"
    _spec_steps(run, 3)
    _status(run, phase="interrupted", step=2)
    with (run / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 99, "loss": 0.5, "reward_mean": 0.25}) + "\n")
    table = cli("status", "--runs-dir", str(store), env={"COLUMNS": "120"}).stdout
    assert "2/3" in _ok_row(table) and "interrupted (damaged)" in _ok_row(table), table
    shown = json.loads(cli("status", "ok", "--runs-dir", str(store), "-o", "json").stdout)
    assert (shown["step"], shown["latest_checkpoint"]) == (2, 2), shown
    assert shown["latest_metrics"]["step"] == 2  # the last row that can be trusted
    assert "metrics.jsonl line 3: step 99" in (shown["damaged"] or ""), shown
    assert "99" not in shown["error"].split("line 3: step 99")[1], shown["error"]
    assert shown["error"].endswith("continue with 'rlctl resume ok'"), shown["error"]
    view = cli("status", "ok", "--runs-dir", str(store)).stdout
    assert "  step        2/3" in view and "line 3: step 99" in view, view
    _log_ends(cli, store, "interrupted")
    r = cli("resume", "ok", "--runs-dir", str(store))
    assert r.returncode == 0, r.stderr
    assert "resuming ok from checkpoint at step 2" in r.stderr
    assert [m["step"] for m in metrics(run)] == [1, 2, 3]  # row 99 dropped
    after = json.loads(cli("status", "ok", "--runs-dir", str(store), "-o", "json").stdout)
    assert (after["phase"], after["step"], after["damaged"]) == ("completed", 3, None), after


def test_steps_after_the_last_checkpoint_are_shown_as_such(cli, store):
    """Steps 1-3 in metrics.jsonl, checkpoint 2: the run is at checkpoint 2, step 3 is
    'after the last checkpoint' (resume repeats it), not damage."""
    run = store / "ok"
    _spec_steps(run, 4)
    _status(run, phase="interrupted", step=3)
    row = metrics(run)[-1]
    with (run / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({**row, "step": 3}) + "\n")
    shown = json.loads(cli("status", "ok", "--runs-dir", str(store), "-o", "json").stdout)
    assert (shown["step"], shown["steps_after_checkpoint"], shown["damaged"]) == (2, 1, None)
    assert shown["latest_metrics"]["step"] == 3
    view = cli("status", "ok", "--runs-dir", str(store)).stdout
    assert "  step        2/4 (+1 after the last checkpoint: resume repeats it)" in view, view
    r = cli("resume", "ok", "--runs-dir", str(store), "--steps", "3")  # 3 > the 2 done
    assert r.returncode == 0, r.stderr
    assert [m["step"] for m in metrics(run)] == [1, 2, 3]


def test_a_reused_pid_without_the_runs_lock_is_not_running(cli, store):
    """#57 case 2: status.json says running with a pid that is alive (another process
    now) and the run folder has no .lock. Before: 'running', no warning, while resume
    (rightly) went ahead."""
    run = store / "ok"
    assert not (run / ".lock").exists()
    _spec_steps(run, 3)
    _status(run, phase="running", pid=os.getppid(), host=socket.gethostname(), backend="local")
    table = cli("status", "--runs-dir", str(store), env={"COLUMNS": "120"}).stdout
    assert "running" not in _ok_row(table) and "stale" in _ok_row(table), table
    shown = json.loads(cli("status", "ok", "--runs-dir", str(store), "-o", "json").stdout)
    assert shown["phase"] == "stale", shown
    assert "no process holds its lock" in shown["error"], shown["error"]
    view = cli("status", "ok", "--runs-dir", str(store)).stdout
    assert "  phase       stale" in view and "no process holds its lock" in view, view
    _log_ends(cli, store, "stale")
    r = cli("resume", "ok", "--runs-dir", str(store))
    assert r.returncode == 0, r.stderr
    assert [m["step"] for m in metrics(run)] == [1, 2, 3]


def test_a_garbage_spec_is_marked_damaged_in_the_table_as_in_json(cli, store):
    """#57 case 3: a stale run whose spec.yaml is garbage. Before: plain 'stale' in the
    table, while its -o json said 'fix its spec.yaml'."""
    run = store / "ok"
    _status(run, phase="running", pid=_dead_pid(), backend="local")
    (run / "spec.yaml").write_text(":: [unclosed\n\0\n")
    table = cli("status", "--runs-dir", str(store), env={"COLUMNS": "120"}).stdout
    assert "stale (damaged)" in _ok_row(table), table
    shown = json.loads(cli("status", "ok", "--runs-dir", str(store), "-o", "json").stdout)
    assert shown["phase"] == "stale" and "spec.yaml" in (shown["damaged"] or ""), shown
    assert shown["error"].startswith("damaged: ") and "fix its spec.yaml" in shown["error"]
    _log_ends(cli, store, "stale")
    one_error(cli("resume", "ok", "--runs-dir", str(store)), 2, "spec.yaml")
