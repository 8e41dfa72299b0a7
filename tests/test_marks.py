"""The contributor's fast loop, ``pytest -m "not slow"``, holds only what is fast.

A test that builds a real model, compiles or trains carries ``@pytest.mark.slow`` (or
``trainer``, which the conftest makes slow). This runs the fast loop under the guard
(``RLCTL_FAST_GUARD=1``, tests/guard/sitecustomize.py): there, importing JAX, torch,
transformers, vLLM or Ray fails, in the test process and in its Python children, so an
unmarked test that needs them fails, and so does this test, naming it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GUARD = REPO / "tests" / "guard"


def guarded_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    path = [str(GUARD), str(REPO), *filter(None, [env.get("PYTHONPATH", "")])]
    env.update(RLCTL_FAST_GUARD="1", PYTHONPATH=os.pathsep.join(path), **extra)
    return env


@pytest.mark.parametrize("module", ["jax", "torch", "transformers", "ray"])
def test_the_guard_refuses_a_heavy_import_in_a_child(module):
    r = subprocess.run(
        [sys.executable, "-c", f"import json, typer; import {module}"],
        env=guarded_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0
    assert f"import of {module} halted; None in sys.modules" in r.stderr, r.stderr


def test_the_guard_lets_the_light_modules_be():
    r = subprocess.run(
        [sys.executable, "-c", "import rlctl.cli.app, pydantic, yaml, typer"],
        env=guarded_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr


@pytest.mark.slow
def test_every_test_the_fast_loop_runs_needs_no_model_compile_or_training():
    """The fast loop under the guard: a failure is a test that should be marked slow, or
    a fast test that fails (in the whole suite they run here only: the conftest
    deselects them around it). Run serially (the suite around it may be parallel): it
    measures what one contributor's ``pytest -m "not slow"`` runs."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-m",
            "not slow",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "--durations=15",
        ],
        cwd=REPO,
        env=guarded_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    tail = r.stdout[-24000:] + r.stderr[-2000:]
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", r.stdout, re.M)
    assert r.returncode == 0 and not failed, (
        f"fast tests that failed under the guard (each a failure, or a test that needs "
        f"the slow mark): {failed}\n{tail}"
    )
    assert re.search(r"\d+ passed", r.stdout), tail
