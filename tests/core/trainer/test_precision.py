"""What ``model.compute_dtype`` resolves to on each machine (precision.choose), said the
same way in the setting's own description."""

from __future__ import annotations

import pytest

from rlctl.core.config.models import ModelSpec
from rlctl.core.trainer.model.precision import choose, cpu_flags

ZEN3 = frozenset({"avx2", "fma"})  # no native bfloat16
ZEN4 = frozenset({"avx2", "avx512f", "avx512_bf16"})
SAPPHIRE_RAPIDS = frozenset({"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})


@pytest.mark.parametrize(
    ("requested", "platform", "flags", "want"),
    [
        ("auto", "cpu", ZEN3, "float32"),
        ("auto", "cpu", ZEN4, "float32"),  # faster in bfloat16, but it learned less
        ("auto", "cpu", SAPPHIRE_RAPIDS, "float32"),
        ("auto", "gpu", ZEN3, "bfloat16"),
        ("auto", "tpu", frozenset(), "bfloat16"),
        ("float32", "cpu", ZEN4, "float32"),
        ("float32", "gpu", frozenset(), "float32"),
        ("bfloat16", "cpu", ZEN3, "bfloat16"),
        ("bfloat16", "cpu", ZEN4, "bfloat16"),
    ],
)
def test_what_each_setting_picks(requested, platform, flags, want):
    p = choose(requested, "float32", platform, flags)
    assert p.dtype == want
    assert "\n" not in p.why
    if want == "bfloat16":
        assert "float32 weights and optimizer" in p.why
    # asked for on a CPU that emulates it: said, with the way back
    assert (p.warning is not None) == (requested == "bfloat16" and flags == ZEN3)


def test_auto_on_a_cpu_says_how_to_trade():
    for flags, hw in ((ZEN4, "AVX512-BF16"), (SAPPHIRE_RAPIDS, "AMX-BF16")):
        why = choose("auto", "float32", "cpu", flags).why
        assert hw in why and "--set model.compute_dtype=bfloat16" in why, why
    assert "no AVX512-BF16 or AMX" in choose("auto", "float32", "cpu", ZEN3).why
    assert "a GPU" in choose("auto", "float32", "gpu", ZEN3).why
    slow = choose("bfloat16", "float32", "cpu", ZEN3)
    assert "emulated" in slow.warning and "model.compute_dtype=float32" in slow.warning


def test_beside_vllm_auto_reads_the_weights_as_vllm_samples_them():
    p = choose("auto", "float32", "gpu", ZEN4, engine="vllm")
    assert p.dtype == "float32" and "vLLM" in p.why
    assert choose("bfloat16", "float32", "cpu", ZEN4, engine="vllm").dtype == "bfloat16"
    assert choose("auto", "float32", "gpu", ZEN4, engine="vanilla").dtype == "bfloat16"


def test_bfloat16_weights_are_read_as_they_are():
    for requested in ("auto", "float32", "bfloat16"):
        assert choose(requested, "bfloat16", "cpu", ZEN3).dtype == "bfloat16"


def test_the_cpu_flags_come_from_proc_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\n"
        "flags\t\t: fpu avx2 avx512f avx512_bf16\n\nprocessor\t: 1\n"
    )
    assert cpu_flags(info) == {"fpu", "avx2", "avx512f", "avx512_bf16"}
    assert cpu_flags(tmp_path / "absent") == frozenset()


def test_the_setting_says_what_auto_picks():
    text = ModelSpec.model_fields["compute_dtype"].description
    assert "auto: bfloat16 on a GPU or TPU, float32 on a CPU" in text
    assert "AVX512-BF16 or AMX" in text
    assert ModelSpec().compute_dtype == "auto"
    with pytest.raises(ValueError):
        ModelSpec(compute_dtype="float16")


@pytest.mark.parametrize(
    ("model", "rollout", "platform", "flags", "want"),
    [
        # (the update's, the sampler's)
        ("auto", "auto", "cpu", ZEN4, ("float32", "bfloat16")),  # sampling learned as float32
        ("auto", "auto", "cpu", SAPPHIRE_RAPIDS, ("float32", "bfloat16")),
        ("auto", "auto", "cpu", ZEN3, ("float32", "float32")),  # emulated: never by default
        ("auto", "auto", "gpu", ZEN3, ("bfloat16", "bfloat16")),
        ("float32", "auto", "cpu", ZEN4, ("float32", "float32")),  # float32 asked for: all of it
        ("float32", "auto", "gpu", ZEN3, ("float32", "float32")),
        ("bfloat16", "auto", "cpu", ZEN3, ("bfloat16", "bfloat16")),
        ("auto", "float32", "cpu", ZEN4, ("float32", "float32")),
        ("bfloat16", "float32", "cpu", ZEN4, ("bfloat16", "float32")),
        ("float32", "bfloat16", "cpu", ZEN4, ("float32", "bfloat16")),
    ],
)
def test_the_sampler_reads_its_own_setting(model, rollout, platform, flags, want):
    p = choose(model, "float32", platform, flags, sampling=rollout)
    assert (p.dtype, p.sampling) == want
    assert "\n" not in p.why
    if want[0] != want[1]:  # a split is said, with where it comes from
        how = "auto: " if rollout == "auto" else f"rollout.compute_dtype={rollout}"
        assert f"; sampling reads {want[1]} ({how}" in p.why, p.why
    else:
        assert "sampling" not in p.why, p.why


def test_a_split_says_how_to_trade_each_half():
    why = choose("auto", "float32", "cpu", ZEN4).why
    assert why.startswith(
        "float32 matmuls in the update (auto on a CPU; this CPU's AVX512-BF16 makes bfloat16 faster"
    ), why
    assert "--set model.compute_dtype=bfloat16" in why
    slow = choose("float32", "float32", "cpu", ZEN3, sampling="bfloat16")
    assert "emulated" in slow.warning and "rollout.compute_dtype=float32" in slow.warning


def test_weights_in_bfloat16_or_vllm_leave_the_sampler_no_choice():
    for rollout in ("auto", "float32", "bfloat16"):
        p = choose("auto", "bfloat16", "cpu", ZEN4, sampling=rollout)
        assert (p.dtype, p.sampling) == ("bfloat16", "bfloat16")
        p = choose("float32", "float32", "tpu", ZEN4, engine="vllm", sampling=rollout)
        assert p.sampling == "float32" and "sampling" not in p.why


def test_the_rollout_setting_says_what_auto_picks():
    from rlctl.core.config.models import RolloutSpec

    text = RolloutSpec.model_fields["compute_dtype"].description
    assert "auto: bfloat16 where it is native" in text and "AVX512-BF16 or AMX" in text
    assert "unless model.compute_dtype=float32" in text
    assert RolloutSpec().compute_dtype == "auto"
    with pytest.raises(ValueError):
        RolloutSpec(compute_dtype="float16")
