"""The numerics table: one row per backend, the CPU's tricks on the CPU only, every
choice with the measurement behind it, and the row a run uses said in its first lines."""

from __future__ import annotations

import dataclasses

import pytest

from rlctl.core.errors import ConfigError
from rlctl.core.trainer.runtime.numerics import ENV, MEASURED, TABLE, Numerics, choose


def test_every_choice_has_its_measurement():
    fields = {f.name for f in dataclasses.fields(Numerics)} - {"row"}
    assert set(MEASURED) == fields
    assert all(len(text) > 80 for text in MEASURED.values())


def test_the_cpus_tricks_are_on_for_the_cpu_only():
    tricks = (
        "pack_mlp_rows",
        "pack_head",
        "own_mlp_gradient",
        "weights_first_decode",
        "prefill_once_per_group",
        "xla_cpu_options",
        "partial_remat",
    )
    assert all(getattr(TABLE["cpu"], t) for t in tricks)
    for row in ("gpu", "tpu"):
        assert not any(getattr(TABLE[row], t) for t in tricks), row
        assert TABLE[row].scan_layers and TABLE[row].background_saves
    assert not TABLE["cpu"].scan_layers  # unrolled: the faster there (MEASURED says how)
    assert not TABLE["cpu"].background_saves  # a copy of the state in the same RAM


@pytest.mark.parametrize(
    ("platform", "row"),
    [("cpu", "cpu"), ("gpu", "gpu"), ("cuda", "gpu"), ("rocm", "gpu"), ("tpu", "tpu")],
)
def test_each_backend_gets_its_row(platform, row):
    assert choose(platform).row == row


def test_the_environment_picks_another_row_and_a_typo_is_one_line():
    assert choose("cpu", "gpu") == TABLE["gpu"]
    assert choose("gpu", " CPU ") == TABLE["cpu"]
    with pytest.raises(ConfigError) as e:
        choose("cpu", "h100")
    assert f"{ENV}='h100': one of cpu, gpu, tpu" in str(e.value)


def test_describe_names_what_is_on():
    assert TABLE["cpu"].describe() == (
        "cpu row: packed MLP rows, packed head, own MLP gradient, weights-first decode, "
        "prefill once per group, XLA:CPU options, 3/4 of the layers recomputed; layers "
        "unrolled; saves in the step"
    )
    assert TABLE["gpu"].describe() == (
        "gpu row: none of the CPU's tricks; layers scanned (one layer body compiled); "
        "saves in the background"
    )


@pytest.mark.slow
def test_the_update_takes_no_cpu_compiler_options_in_an_accelerators_row():
    pytest.importorskip("jax")
    from rlctl.core.trainer.runtime.compiles import update_options

    assert update_options("float32", TABLE["cpu"]) is not None  # this machine is a CPU
    assert update_options("float32", TABLE["gpu"]) is None
