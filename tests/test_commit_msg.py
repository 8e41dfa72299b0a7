"""The repository's commit-msg hook (.githooks/commit-msg): a subject of at most 72
characters, then a blank line before the body."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

HOOK = Path(__file__).resolve().parents[1] / ".githooks" / "commit-msg"


def check(tmp_path: Path, message: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message)
    return subprocess.run(["bash", str(HOOK), str(path)], capture_output=True, text=True)


@pytest.mark.parametrize(
    "message",
    [
        "kinds: one thread per core on v6e pools only\n",
        "kinds: one thread per core on v6e pools only\n\nWhy, at any length " + "x" * 200,
        "x" * 72 + "\n# a comment git strips\n",
    ],
)
def test_a_short_subject_passes(tmp_path, message):
    assert check(tmp_path, message).returncode == 0


def test_a_long_subject_is_refused_saying_where_the_why_goes(tmp_path):
    r = check(tmp_path, "x" * 73 + "\n")
    assert r.returncode == 1 and "73 characters, at most 72" in r.stderr


def test_a_body_glued_to_the_subject_is_refused(tmp_path):
    r = check(tmp_path, "subject\nbody right under it\n")
    assert r.returncode == 1 and "must be blank" in r.stderr
