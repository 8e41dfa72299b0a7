"""CI compiles the accelerators' programs (issue #51): `.ci/accelerator-compile` runs in
`.ci/run`, installs both compile extras with the recorded versions into a venv of its own
(never the main test venv, where tests/accelerator is not collected) and runs
tests/accelerator there with skips failing (CI=true). What it checks is in those tests."""

from __future__ import annotations

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_it_and_it_installs_the_extras_from_the_constraints():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash .ci/accelerator-compile\n" in ci
    assert ci.index("accelerator-compile") < ci.index("bash .ci/user-path")
    script = (ROOT / ".ci" / "accelerator-compile").read_text()
    assert "-c constraints.txt" in script and "'.[all,compile-tpu,compile-gpu]'" in script
    assert "CI=true" in script and "tests/accelerator" in script


def test_the_extras_are_pinned_as_the_images_run_them():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert extras["compile-tpu"] == ["jax[tpu]>=0.10.2,<0.12"]
    assert extras["compile-gpu"] == ["jax-cuda12-plugin>=0.10.2,<0.12"]
    (everything,) = extras["all"]  # rlctl[train,gcp,...]: the compile extras stay apart
    assert not {"compile-tpu", "compile-gpu"} & set(everything[6:-1].split(","))
    pins = dict(
        ln.split("==", 1)
        for ln in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in ln and not ln.startswith("#")
    )
    assert pins["libtpu"] == "0.0.42.1"  # the TPU image's (rlctl/data/image-tpu.lock.txt)
    assert pins["jax-cuda12-plugin"] == pins["jax-cuda12-pjrt"] == pins["jax"]
    images = (ROOT / "rlctl" / "data" / "image-tpu.lock.txt").read_text()
    assert "libtpu==0.0.42.1" in images
