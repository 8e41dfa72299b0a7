"""bench/bench_update.py on the tiny model: the yardstick really is compiled the other
way, and the figures are the calls' medians and their ratio."""

from __future__ import annotations

import pytest

from bench import bench_update as bu

# builds a model, compiles or trains: out of the fast loop (tests/test_marks.py)
pytestmark = pytest.mark.slow


# The timing pipeline (turns, medians, ratio, JSON) is the same for every yardstick; how
# each yardstick is compiled is test_the_yardsticks_are_compiled_without_what_they_measure's.
# Two run here: one of the numerics table, and float32's own model info. All nine ran in
# CI until 2026-11-30, 4-6 minutes of two cores for the same assertions.
@pytest.mark.parametrize("against", ["jax-mlp-grad", "float32"])
def test_the_two_updates_take_turns_and_the_ratio_is_their_medians(
    tiny_model_dir, tmp_path, against
):
    out = bu.main(
        [
            "--against",
            against,
            "--repeats",
            "2",
            "--set",
            f"model.source={tiny_model_dir}",
            "-o",
            str(tmp_path / "u.json"),
        ]
    )
    assert [len(s) for s in out["seconds"].values()] == [3, 3]
    assert set(out["compile_seconds"]) == {"rlctl", against}
    assert set(out["temporaries_bytes"]) == {"rlctl", against}
    assert 0 < out["completion_tokens"] <= out["completion_grid"]
    med = out["median_seconds"]
    assert out["ratio"] == pytest.approx(med["rlctl"] / med[against])
    assert (tmp_path / "u.json").read_text().startswith("{")


def test_the_yardsticks_are_compiled_without_what_they_measure(tiny_model_dir, monkeypatch):
    """Each yardstick's update is traced with its own row of the numerics table (the
    run's, the CPU's, with one choice changed); rlctl's own keeps the run's row."""
    from rlctl.core.trainer.runtime import compiles
    from rlctl.core.trainer.runtime.numerics import TABLE
    from rlctl.core.trainer.tunix_adapter import logprobs
    from rlctl.core.trainer.tunix_adapter.llama import layers as layers_lib
    from rlctl.core.trainer.tunix_adapter.llama import mlp_grad

    own, options, packs, heads, scans = [], [], [], [], []
    real_layer, real_options = logprobs.decoder_layer, compiles.update_options
    real_head, real_mlp, real_scan = logprobs.head_logps, mlp_grad.gated_mlp, layers_lib.scan
    monkeypatch.setattr(logprobs, "head_logps", lambda *a: heads.append(1) or real_head(*a))
    monkeypatch.setattr(
        logprobs,
        "decoder_layer",
        lambda *a, **k: packs.append(len(a) >= 6 and a[5] is not None) or real_layer(*a, **k),
    )
    monkeypatch.setattr(mlp_grad, "gated_mlp", lambda *a: own.append(1) or real_mlp(*a))
    monkeypatch.setattr(
        compiles, "update_options", lambda *a: options.append(a) or real_options(*a)
    )
    monkeypatch.setattr(layers_lib, "scan", lambda *a: scans.append(1) or real_scan(*a))
    t = bu.trainer([f"model.source={tiny_model_dir}"])
    batch = bu.rollout_batch(t)
    assert t.update.numerics == TABLE["cpu"]

    def traced(against: str) -> dict[str, bool]:
        for seen in (own, options, packs, heads, scans):
            seen.clear()
        u = bu.yardstick_update(t, against, batch)
        options_on = bool(real_options(*options[0])) if options else False
        return {
            "own": bool(own),
            "options": options_on,
            "packs": any(packs),
            "head": bool(heads),
            "scan": bool(scans),
            "row": u.numerics.row,
        }

    cpu = {"own": True, "options": True, "packs": True, "head": True, "scan": False, "row": "cpu"}
    assert traced("jax-mlp-grad") == {**cpu, "own": False}
    assert traced("ynn-reduce") == {**cpu, "options": False}
    assert traced("whole-grid") == {**cpu, "packs": False, "head": False}
    assert traced("whole-head") == {**cpu, "head": False}
    assert traced("scan-layers") == {**cpu, "scan": True}
    assert traced("accelerator") == {
        "own": False,
        "options": False,
        "packs": False,
        "head": False,
        "scan": True,
        "row": "gpu",
    }
    assert traced("float32") == cpu  # only the dtype
    for against, level in (("remat-all", True), ("no-remat", False)):
        u = bu.yardstick_update(t, against, batch)
        assert u._remat_levels() == [level] and u.micro == batch.completion_ids.shape[0]
    assert t.update.numerics == TABLE["cpu"]  # rlctl's own update: the run's row
