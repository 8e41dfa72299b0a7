"""Every path a run hands to a library is absolute: Orbax >= 0.12.8 refuses relative
checkpoint paths, and a stored spec must mean the same files from any directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlctl.core.config.models import DEFAULT_MODEL
from rlctl.core.runs.spec import absolute_root, local_paths_absolute, resolve_run_spec
from rlctl.core.store import open_store
from rlctl.core.store.base import CHECKPOINTS
from rlctl.core.store.local import LocalRunStore


@pytest.fixture
def cwd(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return Path(os.getcwd())


class TestRoot:
    def test_default_root_is_resolved_against_the_working_directory(self, cwd):
        assert resolve_run_spec("grpo").output.root == str(cwd / "runs")

    def test_relative_home_and_gs_roots(self, cwd, monkeypatch):
        monkeypatch.setenv("HOME", str(cwd / "home"))
        assert absolute_root("a/../b") == str(cwd / "b")
        assert absolute_root("~/runs") == str(cwd / "home" / "runs")
        assert absolute_root("gs://bucket/runs") == "gs://bucket/runs"
        spec = resolve_run_spec("grpo", overrides=["output.root=gs://bucket/runs"])
        assert spec.output.root == "gs://bucket/runs"

    def test_local_store_paths_are_absolute(self, cwd, monkeypatch):
        store = open_store("./runs")
        assert isinstance(store, LocalRunStore) and store.uri == str(cwd / "runs")
        run = store.run("r1")
        ckpt = run.path_for(CHECKPOINTS)  # what Orbax is given
        assert os.path.isabs(ckpt) and ckpt == str(cwd / "runs" / "r1" / CHECKPOINTS)
        monkeypatch.chdir(cwd.parent)  # a handle made earlier keeps naming the same folder
        assert run.path_for("metrics.jsonl") == str(cwd / "runs" / "r1" / "metrics.jsonl")


class TestLocalInputs:
    def test_data_paths_and_a_model_folder_become_absolute(self, cwd):
        (cwd / "model").mkdir()
        spec = resolve_run_spec(
            "grpo",
            overrides=[
                "model.source=./model",
                "data.name=gsm8k",
                "data.path=data/train.jsonl",
                "data.eval_path=../test.jsonl",
                "output.root=runs",
            ],
        )
        got = local_paths_absolute(spec)
        assert got.model.source == str(cwd / "model")
        assert got.data.path == str(cwd / "data" / "train.jsonl")
        assert got.data.eval_path == str(cwd.parent / "test.jsonl")
        assert got.output.root == str(cwd / "runs")
        assert got.training == spec.training and got.name == spec.name

    @pytest.mark.parametrize("source", [DEFAULT_MODEL, "HuggingFaceTB/SmolLM2-135M-Instruct"])
    def test_hub_ids_and_the_embedded_model_stay(self, cwd, source):
        spec = resolve_run_spec("grpo", overrides=[f"model.source={source}"])
        got = local_paths_absolute(spec)
        assert got.model.source == source
        assert got.data.path is None and got.data.eval_path is None
