"""A resume holds no more memory than a fresh run (#45 point 3): restoring the state no
longer keeps the optimizer's fresh moments beside the checkpoint's (on the default model
a resume peaked 1.2-1.7 GB above a fresh run), nor its first step over arrays that wrap
TensorStore's read buffers (they are copied into XLA's own). The tiny model's state is too
small beside the libraries to show the second; bench/bench_resume_memory.py measures the
default model (resumed / fresh: 1.264 before, 1.023 after). Each run in its own process,
its peak RSS read from the kernel (``wait4``), with the compilation cache off for both, so
neither loads programs the other compiled."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.faults.conftest import REPO

pytestmark = [pytest.mark.trainer, pytest.mark.slow]


def peak_rss(cli, *args: str) -> int:
    """Run ``rlctl ARGS`` to its end; its peak resident set, in bytes."""
    env = {**cli.env, "RLCTL_COMPILE_CACHE": "off", "PYTHONPATH": str(REPO)}
    p = subprocess.Popen(
        [sys.executable, "-m", "rlctl", *args],
        cwd=cli.cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode() if p.stderr else ""
    assert p.returncode == 0, err[-3000:]
    return usage.ru_maxrss * 1024  # KiB on Linux


def test_a_resumed_run_peaks_within_a_tenth_of_a_fresh_one(cli, tiny_args, tmp_path):
    every = ("--set", "checkpoint.interval=2")
    fresh = peak_rss(cli, *tiny_args(tmp_path, "fresh", "--steps", "4", *every))
    peak_rss(cli, *tiny_args(tmp_path, "halted", "--steps", "2", *every))
    resumed = peak_rss(cli, "resume", "halted", "--runs-dir", str(tmp_path), "--steps", "4")
    assert resumed <= 1.10 * fresh, (resumed / 2**20, fresh / 2**20)
