"""Compile-only devices for the accelerator tests: libtpu's TPU topologies and JAX's
CUDA plugin with rlctl's GPU descriptions (the compile-tpu and compile-gpu extras).

These tests run in the venv ``.ci/accelerator-compile`` makes; the main test venv has
neither extra, and tests/conftest.py leaves this folder out there. JAX sees no
accelerator here (``JAX_PLATFORMS=cpu``, set before JAX is first imported): the
plugins' real backends would look for a GPU or TPU hosts, while their compile-only
devices need neither.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> Path:
    """A tiny Llama (4 layers, untied head) in Hugging Face layout."""
    from tests.fakes.tiny_model import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "model", layers=4)


@pytest.fixture(scope="session")
def tiny_config(tiny: Path) -> dict:
    return json.loads((tiny / "config.json").read_text())


# the CLI against the fake GKE and its Kubernetes API, as tests/cli has them
from tests.cli.conftest import _no_local_gcloud, cli, kube  # noqa: E402, F401


@pytest.fixture(scope="session", autouse=True)
def _libtpu_held_here():
    """libtpu loaded in this process before any test, as a user's notebook, a second dry
    run or the command that starts the fit check would hold it: the fit check's
    compile-only children must still load theirs (libtpu's lockfile,
    ``/tmp/libtpu_lockfile``, refuses a second process unless told it may)."""
    from rlctl.core.config.catalog import lookup
    from rlctl.core.config.compile_targets import compile_target
    from rlctl.core.trainer.runtime.targets import devices

    devices(compile_target(lookup("v5litepod-4"), 1))
