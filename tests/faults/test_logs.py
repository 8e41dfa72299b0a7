"""``rlctl logs RUN [-f]`` of a run trained on this machine: its train.log, whole or
its tail, as JSON, followed until the run ends; an older run without one, and a
run that does not exist."""

from __future__ import annotations

import json
import time

import pytest

from tests.faults.conftest import one_error

pytestmark = pytest.mark.trainer


def test_prints_the_log_its_tail_and_json(cli, store):
    log = (store / "ok" / "train.log").read_text().splitlines()
    assert "==== attempt 1: rlctl train done (pid " in log[0]
    r = cli("logs", "ok", "--runs-dir", str(store))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == log
    r = cli("logs", "ok", "--runs-dir", str(store), "--tail", "2")
    assert r.stdout.splitlines() == log[-2:] and log[-1].endswith("run completed: 2 steps")
    r = cli("logs", "ok", "--runs-dir", str(store), "-o", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {
        "run": "ok",
        "log": str(store / "ok" / "train.log"),
        "lines": log,
    }


def test_follow_of_a_finished_run_prints_it_and_returns(cli, store):
    r = cli("logs", "ok", "--runs-dir", str(store), "-f", "--tail", "3", timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == (store / "ok" / "train.log").read_text().splitlines()[-3:]
    assert "run ok is completed" in r.stderr


def test_follow_prints_lines_as_they_come_and_ends_with_the_run(cli, tiny_args, tmp_path):
    root = tmp_path / "runs"
    train = cli.start(*tiny_args(root, "live", "--steps", "3"))
    log = root / "live" / "train.log"
    deadline = time.monotonic() + 240
    while not log.exists() and train.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert log.exists(), train.communicate()[1]
    follow = cli.start("logs", "live", "--runs-dir", str(root), "-f", "--interval", "0.5")
    _, err = train.communicate(timeout=300)
    assert train.returncode == 0, err
    out, err = follow.communicate(timeout=60)  # it ends on its own once the run has
    assert follow.returncode == 0, err
    lines = out.splitlines()
    assert lines == log.read_text().splitlines()
    assert lines[-1].endswith("run completed: 3 steps") and "step 3/3" in out


def test_an_older_run_without_a_log_says_so_in_one_line(cli, store):
    (store / "ok" / "train.log").unlink()
    for extra in ([], ["-f"]):
        r = cli("logs", "ok", "--runs-dir", str(store), *extra, timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout == ""
        assert "has no train.log" in r.stderr and "Traceback" not in r.stderr
    r = cli("logs", "ok", "--runs-dir", str(store), "-o", "json")
    assert json.loads(r.stdout)["lines"] == []


def test_a_missing_run_is_one_line_exit_3(cli, store):
    one_error(cli("logs", "nope", "--runs-dir", str(store)), 3, "not found")
    one_error(cli("logs", "nope", "--runs-dir", str(store), "-f"), 3, "not found")
