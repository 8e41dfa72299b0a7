"""The CLI's edges (issue #25, point 8): errors a script can parse with ``-o json``,
usage errors as one line, ``status`` and plans readable in a pipe and at 80 columns,
and hints that name only what exists."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rlctl.cli.app import app
from rlctl.core.store.local import LocalRunStore

REPO = Path(__file__).resolve().parents[2]


def rlctl(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    """``python -m rlctl`` with stdout and stderr pipes: what a script or CI sees."""
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("RLCTL_") and k not in ("COLUMNS", "LINES")
    }
    return subprocess.run(
        [sys.executable, "-m", "rlctl", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**base, **(env or {})},
    )


def write_run(
    root: Path, name: str, phase: str = "completed", step: int = 5, **status: object
) -> Path:
    run = root / name
    run.mkdir(parents=True, exist_ok=True)
    (run / "spec.yaml").write_text(f"name: {name}\n")
    (run / "status.json").write_text(
        json.dumps({"phase": phase, "step": step, "total_steps": 5, "algorithm": "grpo", **status})
    )
    (run / "metrics.jsonl").write_text(
        json.dumps({"step": step, "reward_mean": 0.5, "grad_norm": 1.25}) + "\n"
    )
    # the step's checkpoint, as the trainer saves it: the steps done are its (#57)
    (run / "checkpoints" / str(step)).mkdir(parents=True, exist_ok=True)
    (run / "checkpoints" / str(step) / "_CHECKPOINT_METADATA").write_text("{}")
    return run


def one_error_line(stderr: str) -> str:
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert not any(x.startswith("Usage:") or "─ Error" in x for x in lines), stderr
    assert len(lines) <= 2 and lines[0].startswith("error: "), stderr
    assert len(lines) == 1 or lines[1].startswith("hint: "), stderr
    return lines[0]


class TestJsonErrors:
    """With -o json a failure is one JSON object on stdout; the line stays on stderr."""

    @pytest.mark.parametrize(
        ("args", "code", "words"),
        [
            (["status", "nope", "-o", "json"], 3, "not found"),  # rlctl's own error
            (["train", "grpo", "--steps", "0", "-o", "json"], 2, "training.steps"),
            (["status", "--interval", "0.1", "-o", "json"], 2, "--interval"),  # click's check
            (["status", "nope", "--output=json", "--bogus"], 2, "--bogus"),
        ],
        ids=["not-found", "bad-value", "out-of-range", "unknown-flag"],
    )
    def test_error_object_on_stdout(self, tmp_path, args, code, words):
        r = rlctl(*args, "--runs-dir", str(tmp_path), cwd=tmp_path)
        assert r.returncode == code, r.stderr
        doc = json.loads(r.stdout)
        assert set(doc) == {"error", "hint", "exit_code"} and doc["exit_code"] == code
        assert words in doc["error"]
        assert one_error_line(r.stderr) == f"error: {doc['error']}"

    def test_table_output_keeps_stdout_empty(self, tmp_path):
        r = rlctl("status", "nope", "--runs-dir", str(tmp_path), cwd=tmp_path)
        assert r.returncode == 3 and r.stdout == ""


class TestUsageErrors:
    @pytest.mark.parametrize(
        "args",
        [
            ["train", "grpo", "--print-config", "true"],
            ["delete", "run", "x", "--dry-run", "true"],
            ["status", "--no-such-flag"],
        ],
    )
    def test_one_line_with_a_hint_and_exit_2(self, tmp_path, args):
        r = rlctl(*args, cwd=tmp_path)
        assert r.returncode == 2 and r.stdout == ""
        one_error_line(r.stderr)
        assert "--help" in r.stderr.splitlines()[-1]

    @pytest.mark.parametrize(
        "args", [["train", "grpo", "--steps", "1.5"], ["train", "grpo", "--steps=1.5"]]
    )
    def test_a_bad_value_is_named(self, tmp_path, args):
        """click names the option, not always the value ("Input should be a valid
        integer"): the line says what was typed (fuzz hyperparams/steps-frac)."""
        r = rlctl(*args, cwd=tmp_path)
        assert r.returncode == 2
        assert "--steps" in one_error_line(r.stderr) and "'1.5'" in r.stderr, r.stderr

    def test_no_arguments_still_shows_the_help(self, tmp_path):
        r = rlctl(cwd=tmp_path)
        assert "Commands:" in r.stdout + r.stderr and "error:" not in r.stderr


class TestStatusInAPipe:
    NAME = "grpo-20260101-120000-a-long-run-name-x"  # 38 characters

    @pytest.mark.parametrize("columns", [None, "80"])
    def test_listing_keeps_a_long_name_whole(self, tmp_path, columns):
        write_run(tmp_path, self.NAME)
        r = rlctl(
            "status",
            "--runs-dir",
            str(tmp_path),
            cwd=tmp_path,
            env={"COLUMNS": columns} if columns else None,
        )
        assert r.returncode == 0, r.stderr
        assert self.NAME in r.stdout and "…" not in r.stdout

    def test_watch_of_an_ended_run_prints_one_line_and_exits(self, tmp_path):
        write_run(tmp_path, self.NAME)
        r = rlctl(
            "status", self.NAME, "--watch", "--runs-dir", str(tmp_path), cwd=tmp_path, timeout=30
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout.endswith("\n") and len(r.stdout.splitlines()) == 1
        line = r.stdout.splitlines()[0]
        assert f"{self.NAME} phase=completed step=5/5 reward=0.500" in line
        assert "\x1b" not in r.stdout + r.stderr  # no live display, no escape codes

    def test_watch_prints_a_line_per_change_until_the_run_ends(self, tmp_path, runner):
        run = write_run(
            tmp_path,
            "r1",
            phase="running",
            step=1,
            backend="local",
            pid=os.getpid(),
            host=socket.gethostname(),
        )

        def train() -> None:
            for step, phase in ((2, "running"), (5, "completed")):
                time.sleep(0.8)
                write_run(
                    tmp_path,
                    "r1",
                    phase=phase,
                    step=step,
                    backend="local",
                    pid=os.getpid(),
                    host=socket.gethostname(),
                )

        writer = threading.Thread(target=train)
        writer.start()
        try:
            # held as the trainer holds it for its whole life: 'running' needs it (#57)
            with LocalRunStore(tmp_path).run("r1").lock():
                r = runner.invoke(
                    app,
                    ["status", "r1", "--watch", "--interval", "0.5", "--runs-dir", str(tmp_path)],
                )
        finally:
            writer.join()
        assert r.exit_code == 0, r.output
        lines = [x.split("  ", 1)[1] for x in r.stdout.splitlines()]
        assert r.stdout.endswith("\n") and len(lines) >= 2
        assert "phase=running step=1/5" in lines[0]
        assert "phase=completed step=5/5" in lines[-1]
        assert len(set(lines)) == len(lines)  # a line only when something changed
        assert run.is_dir()


class TestPlans:
    def test_cost_line_names_the_plans_region(self):
        from rlctl.core.config import prices

        home = prices.table()["region"]
        assert f"({home}," in prices.caveat(home)
        other = prices.caveat("us-east5")
        assert other.startswith("estimate for us-east5 from ") and "us-east5 may differ" in other

    def test_plan_at_80_columns_keeps_names_and_costs_whole(self, cli):
        r = cli(
            "cluster",
            "create",
            "rl",
            "--project",
            "p",
            "--region",
            "us-east5",
            "--zone",
            "us-east5-b",
            "-a",
            "v6e-16 x2",
            "--dcn-networks",
            "2",
            "--bucket",
            "rl-runs",
            "--dry-run",
        )
        assert r.exit_code == 0, r.stderr
        for name in (
            "rl-dcn-0-internal",
            "rl-dcn-1-sub",
            "v6e-16-0",
            "v6e-16-1",
            "roles/container.defaultNodeServiceAccount",
            "($43.20/h)",
            "machine_type=ct6e-standard-4t",
        ):
            assert name in r.stdout
        assert "…" not in r.stdout
        cost = next(x for x in r.stdout.splitlines() if x.startswith("Estimated node cost"))
        assert "us-east5" in cost and "estimate for us-east5" in cost

    def test_wide_terminal_keeps_the_table(self):
        from rich.console import Console

        from rlctl.cli._infra import plan_table, plan_text
        from rlctl.cli._output import Output
        from rlctl.core.plan import Change, Plan

        plan = Plan(
            operation="create",
            target="rl",
            project="p",
            location="us-east5",
            changes=[
                Change(kind="network", name="rl-dcn-0", action="create", fields={"mtu": 8896})
            ],
        )
        out = Output()
        out.out = Console(width=200, force_terminal=True)
        assert out.fits(plan_table(plan))
        out.out = Console(width=30, force_terminal=True)
        assert not out.fits(plan_table(plan))
        assert "  create    network rl-dcn-0\n" in plan_text(plan, 30) + "\n"


class TestHints:
    @pytest.mark.trainer
    def test_a_reward_failing_before_the_run_exists_does_not_say_resume(
        self, tmp_path, runner, tiny_model_dir
    ):
        data = tmp_path / "d.jsonl"
        data.write_text(
            "".join(json.dumps({"question": f"{a}+1?", "answer": a + 1}) + "\n" for a in range(8))
        )
        r = runner.invoke(
            app,
            [
                "train",
                "grpo",
                "--name",
                "r1",
                "--runs-dir",
                str(tmp_path / "runs"),
                "--model",
                str(tiny_model_dir),
                "--dataset",
                "jsonl",
                "--data-path",
                str(data),
                "--eval-size",
                "2",
                "--set",
                'rewards=["operator.truediv"]',
            ],
        )
        assert r.exit_code == 2, r.output
        assert "operator.truediv" in r.stderr and "resume" not in r.stderr
        assert "run the same 'rlctl train' again" in r.stderr
        assert not (tmp_path / "runs" / "r1").exists()
