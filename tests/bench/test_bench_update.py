"""bench/bench_update.py on the tiny model: the yardstick really is compiled the other
way, and the figures are the calls' medians and their ratio."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_update as bu


@pytest.mark.parametrize("against", ["jax-mlp-grad", "ynn-reduce", "whole-grid", "whole-head",
                                     "float32", "remat-all", "no-remat"])
def test_the_two_updates_take_turns_and_the_ratio_is_their_medians(tiny_model_dir, tmp_path,
                                                                    against, monkeypatch):
    from rlctl.core.trainer import compiles, step
    from rlctl.core.trainer.tunix_adapter import logprobs

    seen = []
    real = logprobs.decoder_layer
    monkeypatch.setattr(logprobs, "decoder_layer",
                        lambda *a, **k: seen.append(1) or real(*a, **k))
    out = bu.main(["--against", against, "--repeats", "2", "--set",
                   f"model.source={tiny_model_dir}", "-o", str(tmp_path / "u.json")])
    assert [len(s) for s in out["seconds"].values()] == [3, 3]
    assert set(out["compile_seconds"]) == {"rlctl", against}
    assert set(out["temporaries_bytes"]) == {"rlctl", against}
    assert 0 < out["completion_tokens"] <= out["completion_grid"]
    med = out["median_seconds"]
    assert out["ratio"] == pytest.approx(med["rlctl"] / med[against])
    assert (tmp_path / "u.json").read_text().startswith("{")
    # what the yardstick swapped out is back for rlctl's own update
    assert logprobs.OWN_MLP_GRADIENT and compiles.update_options.__name__ == "update_options"
    assert step.SKIP_PADS and logprobs.PACK_HEAD
    if against == "jax-mlp-grad":  # traced twice: rlctl's own layers, then not
        assert seen


def test_the_yardsticks_are_compiled_without_what_they_measure(tiny_model_dir, monkeypatch):
    from rlctl.core.trainer import compiles
    from rlctl.core.trainer.tunix_adapter import logprobs

    layers, options, packs, heads = [], [], [], []
    real_layer, real_options = logprobs.decoder_layer, compiles.update_options
    real_head = logprobs.head_logps
    monkeypatch.setattr(logprobs, "head_logps", lambda *a: heads.append(1) or real_head(*a))
    monkeypatch.setattr(logprobs, "decoder_layer", lambda *a, **k: layers.append(1) or packs.append(
        len(a) >= 6 and a[5] is not None) or real_layer(*a, **k))
    monkeypatch.setattr(compiles, "update_options",
                        lambda *a: options.append(a) or real_options(*a))
    t = bu.trainer([f"model.source={tiny_model_dir}"])
    batch = bu.rollout_batch(t)
    bu.yardstick_update(t, "jax-mlp-grad", batch)
    assert not layers and options  # Tunix's layer, rlctl's compiler options
    layers.clear(), options.clear()
    bu.yardstick_update(t, "ynn-reduce", batch)
    assert layers and not options  # rlctl's layer, XLA's default options
    layers.clear(), options.clear(), packs.clear(), heads.clear()
    bu.yardstick_update(t, "whole-grid", batch)
    assert layers and options and not any(packs) and not heads  # nothing packed
    layers.clear(), options.clear(), packs.clear(), heads.clear()
    bu.yardstick_update(t, "whole-head", batch)
    assert any(packs) and not heads  # the MLPs packed, the head on the whole grid
    layers.clear(), options.clear(), packs.clear(), heads.clear()
    bu.yardstick_update(t, "float32", batch)
    assert layers and options == [("float32",)] and any(packs) and heads  # only the dtype
    for against, level in (("remat-all", True), ("no-remat", False)):
        u = bu.yardstick_update(t, against, batch)
        assert u._remat_levels() == [level] and u.micro == batch.completion_ids.shape[0]
    layers.clear(), options.clear(), packs.clear(), heads.clear()
    t.update.program(t.model, t.optimizer, batch)
    assert layers and options == [(t.info.compute_dtype,)] and any(packs) and heads
