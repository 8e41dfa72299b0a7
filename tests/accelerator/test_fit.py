"""The fit check compiles a run's programs for an accelerator that is not here and holds
their device memory per chip against the chip's: a tiny model fits an H200 and a v5e
2x2 with none of the CPU's numerics in its programs; a model too big for a v5e chip is
refused, for its state or for its update, with the setting that makes it fit
(test_cluster_fit.py: the same through ``rlctl train --cluster`` against the fake GKE)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rlctl.core.config.catalog import lookup
from rlctl.core.config.compile_targets import compile_target
from rlctl.core.config.models import RunSpec
from rlctl.core.runs import device_fit
from rlctl.core.trainer import api
from rlctl.core.trainer.device_fit.check import check
from rlctl.core.trainer.runtime import numerics

REPO = Path(__file__).resolve().parents[2]
SPEC = {
    "rollout": {"num_generations": 4, "max_new_tokens": 16},
    "training": {"prompts_per_step": 2},
}


def _one_h200():
    eight = compile_target(lookup("a3-ultragpu-8g"), 1)
    return eight.model_copy(update={"devices": 1, "per_host": 1, "label": "one H200"})


def _llama(hidden: int, layers: int, ffn: int, vocab: int = 32000) -> dict:
    """A Llama config.json of these sizes (no weights: the fit check needs none)."""
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "num_attention_heads": hidden // 128,
        "num_key_value_heads": hidden // 128,
        "head_dim": 128,
        "vocab_size": vocab,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }


@pytest.mark.parametrize("target", ["one H200", "v5litepod-4"])
def test_a_tiny_model_fits_with_the_accelerators_numerics(target, tiny_config):
    t = _one_h200() if target == "one H200" else compile_target(lookup(target), 1)
    report = check(RunSpec(**SPEC), tiny_config, t)
    assert report.checked and report.fits, report
    assert [p.name for p in report.programs] == ["update", "rollout", "eval"]
    assert all(p.cpu_only == [] for p in report.programs), report.programs
    assert report.device_memory == t.device_memory
    line = report.line
    assert line.startswith("fits: ") and f"per {report.unit}, {t.label}, compiled in" in line
    if t.kind == "gpu":
        assert any("no autotuning" in n for n in report.notes)


def test_a_cpu_only_scope_in_an_accelerators_program_is_found(tiny_config, monkeypatch):
    """The yardstick of the test above: the CPU's row compiled for a TPU holds its
    packed MLP rows and head, its own MLP gradient and its weights-first decode."""
    cpu = dataclasses.replace(numerics.TABLE["cpu"], row="tpu")
    monkeypatch.setitem(numerics.TABLE, "tpu", cpu)
    report = check(RunSpec(**SPEC), tiny_config, compile_target(lookup("v5litepod-4"), 1))
    found = {p.name: set(p.cpu_only) for p in report.programs}
    assert {"pack_mlp_rows", "pack_head", "own_mlp_gradient"} <= found["update"]
    assert found["rollout"] == found["eval"] == {"weights_first_decode"}
    assert any("a bug in rlctl's numerics table" in ln for ln in report.detail())


def test_a_state_too_big_for_the_chips_is_refused_with_a_larger_slice():
    """Llama 3.1 8B's shape in float32 with Adam's moments: 96 GB over 4 chips of 16 GiB
    (refused before anything compiles)."""
    config = _llama(hidden=4096, layers=32, ffn=14336, vocab=128256)
    acc = lookup("v5litepod-4")
    spec = RunSpec(**SPEC)
    report = check(spec, config, compile_target(acc, 1))
    assert not report.fits and report.reason == "state" and not report.programs
    fix = api.fit_fix(report, spec, acc, 1)
    assert "--lora-rank 16" in fix and "-a 'v5litepod-8'" in fix
    with pytest.raises(Exception) as e:
        device_fit.refuse(report.model_copy(update={"fix": fix}))
    assert "does not fit v5litepod-4" in e.value.message and e.value.hint == fix


def test_an_update_too_big_for_what_is_left_is_refused_with_recomputation():
    """2 wide layers (0.9B parameters): the state fits a 16 GiB chip, the update's
    gradients do not fit beside it even one sequence at a time."""
    config = _llama(hidden=4096, layers=2, ffn=14336, vocab=64000)
    acc = lookup("v5litepod-1")
    spec = RunSpec(**SPEC)
    report = check(spec, config, compile_target(acc, 1))
    assert report.checked and not report.fits and report.reason == "update", report
    fix = api.fit_fix(report, spec, acc, 1)
    assert "--set training.remat=true" in fix and "--lora-rank 16" in fix


def _two_h200():
    eight = compile_target(lookup("a3-ultragpu-8g"), 1)
    return eight.model_copy(update={"devices": 2, "per_host": 2, "label": "two H200s"})


@pytest.mark.parametrize("target", ["v6e-8", "two H200s"])
def test_a_split_run_compiles_its_update_and_rollout_on_meshes_of_their_own(target, tiny_config):
    """rollout.placement=split (issue 54): the update on the learner's half, FSDP over it
    alone (twice the state per chip of the whole slice's), the rollout on the generator's
    half with a whole copy of the weights per device and a second version beside it
    (max_staleness=1); the eval stays on the learner."""
    t = _two_h200() if target == "two H200s" else compile_target(lookup(target), 1)
    rollout = {**SPEC["rollout"], "placement": "split", "max_staleness": 1}
    split = check(RunSpec(**{**SPEC, "rollout": rollout}), tiny_config, t)
    whole = check(RunSpec(**SPEC), tiny_config, t)
    assert split.checked and split.fits, split
    assert [p.name for p in split.programs] == ["update", "rollout", "eval"]
    assert all(p.cpu_only == [] for p in split.programs), split.programs
    half = t.devices // 2
    assert any(
        n.startswith(f"split: the update and the eval on {half} ") and f"the other {half}" in n
        for n in split.notes
    ), split.notes
    # the learner's shards: twice the whole slice's on half the chips (up to padding)
    assert 1.6 < split.state / whole.state <= 2.05, (split.state, whole.state)
    # the rollout's device holds whole weights (its argument) and one more version
    rollout_p, update_p = split.program("rollout"), split.program("update")
    assert rollout_p is not None and update_p is not None
    assert rollout_p.arguments > update_p.arguments / 4
    assert rollout_p.peak >= rollout_p.arguments * 2 - 1024
