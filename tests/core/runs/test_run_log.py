"""The run's train.log (``RunLog``, ``follow_log``) and the plain lines it keeps
(``log_lines``): held until the run exists, one marker per attempt, never a reason
for a run to fail, followed until the run is no longer active; an ETA from the
first step on."""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path

import pytest

from rlctl.core.runs.log_lines import Pace, PlainLines, shown_in_log
from rlctl.core.runs.run_log import RunLog, follow_log, read_log
from rlctl.core.store.local import LocalRunDir
from rlctl.core.trainer.runtime.events import Stage, phase

STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ  ")


def body(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    assert all(STAMP.match(x) for x in lines), lines
    return [STAMP.sub("", x) for x in lines]


def step(k: int, seconds: float) -> dict:
    return {
        "event": "step",
        "step": k,
        "metrics": {"reward_mean": 0.5, "accuracy": 0.25, "loss": 0.0, "step_seconds": seconds},
    }


@pytest.fixture
def run(tmp_path) -> LocalRunDir:
    r = LocalRunDir(tmp_path, "r")
    r.path.mkdir()
    return r


class TestPlainLines:
    def test_the_eta_leaves_out_the_first_steps_compile_then_takes_the_steady_pace(self):
        """#53: step 1's time, its compile included, was extrapolated ('eta 1h52m' for a
        run of minutes)."""
        lines = PlainLines()
        lines.lines({"event": "start", "name": "r", "step": 0, "total_steps": 4})
        first = {**step(1, 30.0), "compile_seconds": 27.0}  # 3 s of work, 27 s compiling
        got = [lines.lines(e)[0] for e in (first, step(2, 2.0), step(3, 4.0))]
        # step 1: its 3 s without the compile x 3 left; then the steps after the first
        assert [x.rsplit("  ", 1)[1] for x in got] == ["eta 9s", "eta 4s", "eta 3s"]

    def test_without_its_compile_seconds_the_first_step_gives_no_eta(self):
        lines = PlainLines()
        lines.lines({"event": "start", "name": "r", "step": 0, "total_steps": 4})
        assert "eta" not in lines.lines(step(1, 30.0))[0]
        assert lines.lines(step(2, 2.0))[0].endswith("eta 4s")
        pace = Pace()
        pace.add(100.0, compile_seconds=100.0)  # all of it compiling: a tenth is its pace
        assert pace.eta(1, 3) == 20.0

    def test_pace_before_any_step_has_no_eta(self):
        assert Pace().eta(0, 10) is None

    def test_phase_lines_say_what_and_how_far(self):
        lines = PlainLines()
        assert lines.lines(phase(Stage.LOADING, "loading model m")) == ["loading model m"]
        assert lines.lines(phase(Stage.EVALUATING, "evaluating baseline", 1, 4, "batches")) == [
            "evaluating baseline (1/4 batches)"
        ]

    def test_a_long_eval_logs_about_every_tenth_batch(self):
        assert all(shown_in_log(k, 20) for k in range(21))
        shown = [k for k in range(101) if shown_in_log(k, 100)]
        assert shown == list(range(0, 101, 10))


class TestRunLog:
    def test_lines_before_the_run_exists_are_held_then_written_after_the_marker(self, run):
        seen: list[dict] = []
        log = RunLog("train", seen.append)
        log(phase(Stage.STARTING, "starting run r"))
        assert not (run.path / "train.log").exists()
        log.attach(run)
        log({"event": "message", "message": "hello\nworld"})
        log.end("run completed: 1 steps")
        assert [e.get("text") or e.get("message") for e in seen] == [
            "starting run r",
            "hello\nworld",
        ]
        lines = body(run.path / "train.log")
        assert re.fullmatch(
            rf"==== attempt 1: rlctl train r \(pid {os.getpid()} on "
            rf"{re.escape(socket.gethostname())}\) ====",
            lines[0],
        )
        assert lines[1:] == ["starting run r", "hello", "world", "run completed: 1 steps"]

    def test_each_attempt_appends_with_its_own_marker(self, run):
        for command in ("train", "resume"):
            log = RunLog(command)
            log.attach(run)
            log.end(f"{command} ended")
        lines = body(run.path / "train.log")
        assert [x.split(" (pid")[0] for x in lines] == [
            "==== attempt 1: rlctl train r",
            "train ended",
            "==== attempt 2: rlctl resume r",
            "resume ended",
        ]

    def test_a_log_that_cannot_be_written_warns_once_and_the_run_goes_on(self, run):
        (run.path / "train.log").mkdir()  # not a file: every write fails
        seen: list[dict] = []
        log = RunLog("train", seen.append)
        log.attach(run)
        log({"event": "message", "message": "a"})
        log({"event": "message", "message": "b"})
        warnings = [e["message"] for e in seen if "cannot be written" in e.get("message", "")]
        assert len(warnings) == 1 and "train.log" in warnings[0]
        assert [e["message"] for e in seen][-2:] == ["a", "b"]  # still passed on


class TestFollow:
    def _status(self, run: LocalRunDir, phase_: str) -> None:
        run.write_json(
            "status.json",
            {"phase": phase_, "backend": "local", "pid": os.getpid(), "host": socket.gethostname()},
        )

    def test_new_lines_until_the_run_ends_then_the_last_ones(self, run):
        self._status(run, "running")
        (run.path / "train.log").write_text("a\nb\nc\n")
        rounds = iter(
            [
                lambda: _append(run, "d\npart"),  # half a line: shown once it is whole
                lambda: (_append(run, "ial\ne\n"), self._status(run, "completed")),
            ]
        )
        with run.lock():  # held as the trainer holds it: 'running' needs it (#57)
            out = list(follow_log(run, tail=2, interval=1, sleep=lambda s: next(rounds)()))
        assert out == ["b", "c", "d", "partial", "e"]

    def test_a_resume_that_holds_the_lock_is_followed_before_its_status_says_so(self, run):
        """#53: 'logs -f' started as a resume started ended at once: the resume holds
        the writer lock before status.json stops saying 'interrupted'."""
        self._status(run, "interrupted")
        (run.path / "train.log").write_text("a\n")
        rounds = iter(
            [
                lambda: _append(run, "resuming\n"),
                lambda: (_append(run, "step 3/4\n"), self._status(run, "running")),
                lambda: (_append(run, "step 4/4\n"), self._status(run, "completed")),
            ]
        )
        with run.lock():  # the resume, before its first status update
            out = list(follow_log(run, tail=2, interval=1, sleep=lambda s: next(rounds)()))
        assert out == ["a", "resuming", "step 3/4", "step 4/4"]
        assert list(follow_log(run, 10, 1, sleep=pytest.fail))[-1] == "step 4/4"  # no lock

    def test_a_stale_run_ends_the_follow(self, run):
        run.write_json(
            "status.json",
            {
                "phase": "running",
                "backend": "local",
                "pid": 2**22 + 12345,
                "host": socket.gethostname(),
            },
        )
        (run.path / "train.log").write_text("x\n")
        assert list(follow_log(run, 10, 1, sleep=pytest.fail)) == ["x"]

    def test_no_log_yet(self, run):
        assert read_log(run) is None
        self._status(run, "completed")
        assert list(follow_log(run, 10, 1, sleep=pytest.fail)) == []


def _append(run: LocalRunDir, text: str) -> None:
    with (run.path / "train.log").open("a") as f:
        f.write(text)


def test_status_json_is_left_alone(run):
    """Reading a log never writes the run."""
    (run.path / "status.json").write_text(json.dumps({"phase": "completed"}))
    before = sorted(p.name for p in run.path.iterdir())
    list(follow_log(run, 5, 1, sleep=pytest.fail))
    assert sorted(p.name for p in run.path.iterdir()) == before
