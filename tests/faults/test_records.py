"""#47 point 2: ``resume --steps`` is bounded as ``train --steps`` is, refused with one
line before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.faults.conftest import one_error


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


@pytest.mark.slow
def test_resume_steps_beyond_the_bound_is_one_line_and_changes_nothing(cli, store):
    before = _files(store)
    r = cli("resume", "ok", "--runs-dir", str(store), "--steps", "99999999999999999999")
    one_error(
        r, 2, "--steps 99999999999999999999", "training.steps", "less than or equal to 10000000"
    )
    assert "nothing was changed" in r.stderr
    assert _files(store) == before
    spec = yaml.safe_load((store / "ok" / "spec.yaml").read_text())
    assert spec["training"]["steps"] == 2
    # and the run still resumes: what is on disk is a spec its reader takes
    r = cli("resume", "ok", "--runs-dir", str(store), "--steps", "3")
    assert r.returncode == 0, r.stderr
