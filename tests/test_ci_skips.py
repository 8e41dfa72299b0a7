"""Under ``CI=true`` a skip is a failure (tests/conftest.py): a missing fixture or extra
must break CI instead of passing it quietly. Checked by running pytest on a small
suite whose fixtures are missing, with and without ``CI``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

CONFTEST = """\
from tests.conftest import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401
import pytest

@pytest.fixture
def missing_model():
    pytest.skip("no model here")
"""
TESTS = {
    "test_fixture.py": "def test_needs_a_model(missing_model):\n    pass\n",
    "test_module.py": "import pytest\n"
    "pytest.importorskip('rlctl_no_such_module')\n"
    "def test_never_runs():\n    pass\n",
    "test_marks.py": "import pytest\n"
    "@pytest.mark.skipif(True, reason='no GGUF')\n"
    "def test_skipif():\n    pass\n"
    "@pytest.mark.xfail(reason='known')\n"
    "def test_xfail():\n    assert False\n"
    "def test_passes():\n    pass\n",
}


@pytest.fixture()
def suite(tmp_path: Path) -> Path:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for name, text in TESTS.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def _pytest(suite: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(REPO)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rA",
            "-p",
            "no:cacheprovider",
            "--continue-on-collection-errors",
            "--rootdir",
            str(suite),
            str(suite),
        ],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_outside_ci_missing_fixtures_skip(suite: Path) -> None:
    r = _pytest(suite, None)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed, 3 skipped, 1 xfailed" in r.stdout


def test_in_ci_every_skip_fails_and_says_why(suite: Path) -> None:
    r = _pytest(suite, "true")
    assert r.returncode == 1, r.stdout + r.stderr
    out = r.stdout
    # the fixture's skip fails in setup, the skipif'd test too; the skipped module
    # is a collection error (which alone stops a plain run); xfail stays xfail
    assert "1 passed" in out and "1 xfailed" in out and "skipped" not in out.splitlines()[-1]
    assert "no model here" in out and "no GGUF" in out and "rlctl_no_such_module" in out
    assert out.count("CI=true: this would have been skipped") >= 3
