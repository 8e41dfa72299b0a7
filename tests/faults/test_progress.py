"""What a user sees while a run starts and trains: a line within 2 s of typing
``rlctl train``, a line for each phase before step 1, an ETA on every step line,
and the same lines kept in the run's ``train.log``."""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time

import pytest

pytestmark = pytest.mark.trainer

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\x1b[()][0-9A-Za-z]")
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ  ")
STEP = re.compile(r"^step (\d+)/(\d+)  .*")


def _in_a_terminal(cli, args: list[str], limit: float = 300) -> tuple[str, float | None, int]:
    """Run ``rlctl ARGS`` with stdin, stdout and stderr on a pseudo-terminal of 160
    columns; (everything it wrote without escape codes, seconds until "preparing run"
    appeared, exit code)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    env = {**cli.env, "TERM": "xterm-256color"}
    env.pop("COLUMNS", None)
    t0 = time.monotonic()
    p = subprocess.Popen(
        [sys.executable, "-m", "rlctl", *args],
        cwd=cli.cwd,
        env=env,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        close_fds=True,
    )
    os.close(slave)
    raw, first = b"", None
    try:
        while time.monotonic() - t0 < limit:
            ready, _, _ = select.select([master], [], [], 0.05)
            if not ready:
                if p.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not chunk:
                break
            raw += chunk
            if first is None and "preparing run" in ANSI.sub("", raw.decode(errors="replace")):
                first = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
        rc = p.wait()
        os.close(master)
    return ANSI.sub("", raw.decode(errors="replace")), first, rc


def _lines(text: str) -> list[str]:
    """Each line and each redraw of the live line, stripped."""
    return [x.strip() for x in re.split(r"\r\n|\r|\n", text) if x.strip()]


def test_a_terminal_shows_a_line_at_once_and_an_eta_on_every_step(cli, tiny_args, tmp_path):
    text, first, rc = _in_a_terminal(cli, tiny_args(tmp_path / "runs", "tty", "--steps", "3"))
    assert rc == 0, text[-2000:]
    # the first line comes before JAX is imported: within 2 s even on a busy machine
    assert first is not None and first < 2.0, (first, text[:500])
    lines = _lines(text)
    steps = [x for x in lines if STEP.match(x)]
    assert [STEP.match(x).group(1) for x in steps] == ["1", "2", "3"], lines
    assert all(re.search(r"  eta \d+(s|m\d\ds|h\d\dm)$", x) for x in steps), steps
    # the live bar shows an ETA of its own, never rich's "-:--:--"
    assert "-:--:--" not in text
    assert any(re.search(r"\b[123]/3\b.*eta \d", x) for x in lines), lines
    # each phase before step 1 stays behind as a line with its duration
    for phase in ("preparing run tty", "loading model", "evaluating baseline"):
        assert any(x.startswith(phase) and re.search(r"\(\d+s\)$", x) for x in lines), phase


def test_without_a_terminal_each_phase_is_a_line_in_order_and_the_log_keeps_them(
    cli, tiny_args, tmp_path
):
    root = tmp_path / "runs"
    r = cli(*tiny_args(root, "pipe", "--steps", "2"))
    assert r.returncode == 0, r.stderr
    err = r.stderr.splitlines()
    order = [
        "preparing run pipe",
        "loading libraries",
        "loading model",
        "evaluating baseline on 2 held-out prompts (0/1 batches)",
        "evaluating baseline on 2 held-out prompts (1/1 batches)",
        "eval/baseline: ",
        "training pipe: steps 1..2",
        "step 1: compiling and running",
        "step 1/2  ",
        "step 2/2  ",
        "evaluating final on 2 held-out prompts (0/1 batches)",
        "eval/final: ",
    ]
    at = [next((i for i, x in enumerate(err) if x.startswith(w)), None) for w in order]
    assert None not in at and at == sorted(at), list(zip(order, at))
    steps = [x for x in err if STEP.match(x)]
    assert len(steps) == 2 and all(re.search(r"  eta \d", x) for x in steps), steps
    # train.log: the same lines, timestamped, between the attempt's marker and its end
    log = (root / "pipe" / "train.log").read_text().splitlines()
    assert all(STAMP.match(x) for x in log), log
    body = [STAMP.sub("", x) for x in log]
    assert body[0].startswith("==== attempt 1: rlctl train pipe (pid "), body[0]
    assert body[1:-1] == err
    assert body[-1] == "run completed: 2 steps"
