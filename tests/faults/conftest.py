"""The fault suite: each case runs the CLI as a separate process, as a user or an
operator would (``python -m rlctl``), and checks the exit code, that the error is
one line (plus its hint), and what is left on disk."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TIMING = {"step_seconds", "rollout_seconds", "tokens_per_s"}


class Cli:
    """``rlctl ARGS`` in a subprocess, isolated from the machine's gcloud and rlctl
    settings; ``PYTHONPATH`` reaches ``tests.fakes.rewards``."""

    def __init__(self, home: Path) -> None:
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("RLCTL_", "CLOUDSDK_", "GOOGLE_"))
        }
        self.env.update(
            PYTHONPATH=str(REPO),
            CLOUDSDK_CONFIG=str(home / "gcloud"),
            RLCTL_CACHE=os.environ.get("RLCTL_CACHE", str(home / "cache")),
        )
        if os.environ.get("RLCTL_CACHE") is None:
            self.env.pop("RLCTL_CACHE")  # the user's default cache: the converted model
        self.cwd = home

    def __call__(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 600
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "rlctl", *args],
            cwd=self.cwd,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "rlctl", *args],
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


def one_error(r: subprocess.CompletedProcess, code: int, *words: str) -> str:
    """The one ``error:`` line of a refused command (a ``hint:`` may follow), with the
    expected exit code and words; never a traceback."""
    out = r.stdout + r.stderr
    assert "Traceback" not in out, out
    assert r.returncode == code, out
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, r.stderr
    tail = r.stderr.strip().splitlines()
    assert tail[-1].startswith(("error:", "hint:")) and len(tail[tail.index(errors[0]) :]) <= 2, (
        r.stderr
    )
    for w in words:
        assert w in errors[0], errors[0]
    return errors[0]


def metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


@pytest.fixture
def cli(tmp_path) -> Cli:
    return Cli(tmp_path)


@pytest.fixture(scope="session")
def data_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("data") / "train.jsonl"
    p.write_text(
        "".join(
            json.dumps({"question": f"What is {a} + 1?", "answer": a + 1}) + "\n" for a in range(16)
        )
    )
    return p


@pytest.fixture(scope="session")
def tiny_args(tiny_model_dir, data_file):
    """A run of a few seconds a step: 1 prompt x 2 completions x 6 tokens."""

    def args(root: Path, name: str, *extra: str, model: Path | None = None) -> list[str]:
        return [
            "train",
            "grpo",
            "--name",
            name,
            "--runs-dir",
            str(root),
            "--model",
            str(model or tiny_model_dir),
            "--dataset",
            "jsonl",
            "--data-path",
            str(data_file),
            "--prompts-per-step",
            "1",
            "-G",
            "2",
            "--max-new-tokens",
            "6",
            "--eval-size",
            "2",
            "--lr",
            "3e-3",
            "--set",
            "eval.batch_size=2",
            "--set",
            'rewards=["tests.fakes.rewards.digit_count"]',
            *extra,
        ]

    return args


@pytest.fixture(scope="session")
def trained(tmp_path_factory, tiny_args) -> Path:
    """A completed 2-step run with checkpoints 1 and 2, to copy and damage."""
    root = tmp_path_factory.mktemp("trained")
    r = Cli(root)(*tiny_args(root, "done", "--steps", "2", "--set", "checkpoint.interval=1"))
    assert r.returncode == 0, r.stderr
    return root / "done"


@pytest.fixture
def store(tmp_path, trained) -> Path:
    """A run store holding a copy of ``trained`` as run ``ok``."""
    root = tmp_path / "runs"
    shutil.copytree(trained, root / "ok", ignore=shutil.ignore_patterns(".lock"))
    return root
