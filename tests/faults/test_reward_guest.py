"""#47 point 6, a reward is a guest: what it prints reaches the run's log, never
``-o json``'s stdout; a reward that exits is named in one line and the run is
``failed``, resumable. And ``--install-completion`` into a read-only home is one line."""

from __future__ import annotations

import json

import pytest

from tests.faults.conftest import one_error
from tests.faults.test_disk import tmpfs

pytestmark = pytest.mark.trainer

NOISY = """
import os, subprocess

def noisy(completion, gold):
    print("scoring", repr(completion[:8]))
    os.write(1, b"raw bytes on descriptor 1\\n")
    subprocess.run(["echo", "a child's output"], check=True)
    return sum(ch.isdigit() for ch in completion) / 10.0
"""

# the shell given on the command line (typer's switch for tests), not detected from
# the parent processes: a test runner's parent is no shell
NAMED_SHELL = {"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}

EXITS = """
import os, sys

def exits(completion, gold):
    if os.path.exists(os.environ.get("BAD_AFTER", "/nonexistent")):
        sys.exit(3)
    return 0.5
"""


def test_what_a_reward_prints_goes_to_the_log_and_json_stdout_stays_one_document(
    cli, tiny_args, tmp_path
):
    (tmp_path / "r.py").write_text(NOISY)
    root = tmp_path / "runs"
    r = cli(
        *tiny_args(root, "noisy", "--steps", "1", "--set", 'rewards=["./r.py:noisy"]'), "-o", "json"
    )
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)  # the one document, nothing before or after it
    assert result["phase"] == "completed"
    log = (root / "noisy" / "train.log").read_text()
    assert f"reward '{tmp_path}/r.py:noisy' printed: scoring" in log
    assert "raw bytes on descriptor 1" in r.stderr and "a child's output" in r.stderr


def test_a_reward_that_exits_is_named_and_the_run_resumes_once_it_is_fixed(
    cli, tiny_args, tmp_path
):
    (tmp_path / "r.py").write_text(EXITS)
    root = tmp_path / "runs"
    run = root / "ex"
    args = tiny_args(
        root,
        "ex",
        "--steps",
        "2",
        "--set",
        "checkpoint.interval=1",
        "--set",
        'rewards=["./r.py:exits"]',
    )
    r = cli(*args, env={"BAD_AFTER": str(run / "checkpoints" / "1")})
    one_error(r, 2, "step 2:", f"reward '{tmp_path}/r.py:exits' called sys.exit(3)")
    status = json.loads((run / "status.json").read_text())
    assert status["phase"] == "failed" and "sys.exit(3)" in status["error"]
    assert status["latest_checkpoint"] == 1
    r = cli("resume", "ex", "--runs-dir", str(root))
    assert r.returncode == 0, r.stderr


def test_install_completion_into_a_read_only_home_is_one_line(cli, tmp_path):
    with tmpfs(tmp_path / "home", "size=1m,ro") as home:
        r = cli("--install-completion", "bash", env={"HOME": str(home), **NAMED_SHELL})
        one_error(r, 1, "cannot install shell completion", "Read-only file system")
        assert "--show-completion" in r.stderr


def test_install_completion_still_works_into_a_writable_home(cli, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    r = cli("--install-completion", "bash", env={"HOME": str(home), **NAMED_SHELL})
    assert r.returncode == 0, r.stderr
    assert "rlctl" in (home / ".bashrc").read_text()


INTERRUPTS = """
import os

def interrupts(completion, gold):
    if os.path.exists(os.environ.get("BAD_AFTER", "/nonexistent")):
        raise KeyboardInterrupt
    return 0.5
"""


def test_a_reward_that_raises_keyboard_interrupt_stops_the_run_by_its_name(
    cli, tiny_args, tmp_path
):
    """#53: a stop (exit 130, resumable) as TRL's trainer takes it, but one line that
    names the reward; it was a bare 'interrupted'."""
    (tmp_path / "r.py").write_text(INTERRUPTS)
    root = tmp_path / "runs"
    run = root / "ki"
    args = tiny_args(
        root,
        "ki",
        "--steps",
        "2",
        "--set",
        "checkpoint.interval=1",
        "--set",
        'rewards=["./r.py:interrupts"]',
    )
    r = cli(*args, env={"BAD_AFTER": str(run / "checkpoints" / "1")})
    one_error(
        r,
        130,
        "interrupted after step 1",
        f"reward '{tmp_path}/r.py:interrupts' raised KeyboardInterrupt for completion 1 of",
    )
    assert json.loads((run / "status.json").read_text())["phase"] == "interrupted"
    assert cli("resume", "ki", "--runs-dir", str(root)).returncode == 0
