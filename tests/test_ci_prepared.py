"""CI installs the later steps' venvs beside the tests (`.ci/_prepared.sh`): each step's
`--prepare` installs every requirement but rlctl (`.ci/deps-of` lists them from
pyproject.toml), started before the tests and waited for where the step stands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("accelerator-compile", "vllm-cpu", "ray-image")


def deps_of(*extras: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "deps-of"), *extras],
        capture_output=True,
        text=True,
    )


def test_deps_of_lists_every_requirement_of_the_extras_and_never_rlctl():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    out = deps_of("all", "compile-tpu").stdout.splitlines()
    assert not [r for r in out if r.startswith(f"{project['name']}[")]
    (everything,) = extras["all"]  # rlctl[train,gcp,...]
    want = list(project["dependencies"])
    for extra in [*everything.split("[", 1)[1].rstrip("]").split(","), "compile-tpu"]:
        want += [r for r in extras[extra] if r not in want]
    assert out == want
    assert "jax-cuda12-plugin>=0.10.2,<0.12" not in out  # compile-gpu was not asked for


def test_deps_of_refuses_an_extra_pyproject_does_not_have():
    got = deps_of("train", "no-such-extra")
    assert got.returncode != 0 and "no-such-extra" in got.stderr and not got.stdout


def test_each_step_is_prepared_before_the_tests_and_waited_for_where_it_stands():
    ci = (ROOT / ".ci" / "run").read_text()
    tests = ci.index(".venv/bin/python -m pytest -q")
    for step in STEPS:
        started = ci.index(f"prepare {step} &")
        waited = ci.index(f'"$beside/{step}-prepare.log"')
        assert started < tests < waited < ci.index(f"bash .ci/{step}\n")
        script = (ROOT / ".ci" / step).read_text()
        assert '. "$repo/.ci/_prepared.sh"' in script and "$prepare && exit 0" in script
    assert 'export RLCTL_CI_PREPARED="$beside"' in ci
