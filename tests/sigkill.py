"""A run killed the hard way, for the resume tests: ``python -m rlctl ARGS`` started,
then SIGKILLed (no handler runs, nothing is flushed) as soon as ``ready()`` holds, which
is when its first checkpoint is on the store (a folder, or GCS's COMMITTED marker)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def kill_when(
    argv: list[str], ready: Callable[[], bool], env: dict[str, str], timeout: float = 300
) -> None:
    """Start rlctl with ``argv``, SIGKILL it once ``ready()``; fail if it never got there
    (it died, finished or hung first)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlctl", *argv],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + timeout
    while not ready() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    try:
        assert ready(), f"no checkpoint appeared (exit code {proc.poll()})"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
