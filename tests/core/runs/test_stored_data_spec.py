"""spec.yaml files written before #26 (``data.name``, ``question_field``,
``answer_field``) still load, as what their runs trained on."""

from __future__ import annotations

import pytest
import yaml

from rlctl.core.runs.local import load_run_spec
from rlctl.core.store.local import LocalRunDir


def old_run(tmp_path, **data) -> LocalRunDir:
    """A run folder whose spec.yaml has the data section rlctl wrote before #26."""
    (tmp_path / "old").mkdir()
    spec = {
        "name": "old",
        "algorithm": "grpo",
        "data": {
            "name": "arithmetic",
            "path": None,
            "eval_path": None,
            "question_field": "question",
            "answer_field": "answer",
            "max_operand": 20,
            "seed": 0,
            **data,
        },
    }
    (tmp_path / "old" / "spec.yaml").write_text(yaml.safe_dump(spec))
    return LocalRunDir(tmp_path, "old")


def test_arithmetic_with_a_path_the_old_trainer_ignored(tmp_path):
    """The bug of #26: the file was recorded but the generator ran; resuming goes on
    with the generator, not with a file the run never saw."""
    data = load_run_spec(old_run(tmp_path, path="/data/train.jsonl")).data
    assert (data.dataset, data.path, data.prompt_column) == ("arithmetic", None, None)


@pytest.mark.parametrize(("name", "dataset"), [("gsm8k", "gsm8k"), ("jsonl", None)])
def test_a_file_with_its_old_field_names(tmp_path, name, dataset):
    data = load_run_spec(
        old_run(tmp_path, name=name, path="/d/t.jsonl", eval_path="/d/e.jsonl", question_field="q")
    ).data
    assert (data.dataset, data.path, data.eval_path) == (dataset, "/d/t.jsonl", "/d/e.jsonl")
    assert (data.prompt_column, data.answer_column, data.eval_split) == ("q", "answer", None)


def test_gsm8k_from_the_hub(tmp_path):
    data = load_run_spec(old_run(tmp_path, name="gsm8k")).data
    assert (data.hub_id, data.config, data.split, data.eval_split) == (
        "openai/gsm8k",
        "main",
        "train",
        "test",
    )
