"""The device-memory check as the plan uses it, where nothing can be compiled: what it did
not check and why (the extra to install, a model it cannot read, an accelerator without
a description, switched off), the line each report prints, and the setting that makes a
run fit. Compiling for real is tests/accelerator's (the compile extras' venv)."""

from __future__ import annotations

import importlib.util

import pytest

from rlctl.core.config.catalog import lookup
from rlctl.core.config.models import RunSpec
from rlctl.core.errors import OutOfMemoryError
from rlctl.core.runs import device_fit
from rlctl.core.trainer import api
from rlctl.core.trainer.api import DeviceFit, ProgramFit

GIB = 2**30
NO_EXTRAS = not importlib.util.find_spec("libtpu") and not importlib.util.find_spec("jax_plugins")


@pytest.mark.skipif(not NO_EXTRAS, reason="the compile extras are installed here")
@pytest.mark.parametrize(
    ("accelerator", "needs"), [("v6e-16", "libtpu"), ("a3-highgpu-8g", "JAX's CUDA plugin")]
)
def test_without_the_extra_it_says_what_to_install(accelerator, needs):
    report = device_fit.check(RunSpec(), accelerator, 2)
    assert not report.checked and report.fits
    extra = "compile-tpu" if accelerator.startswith("v6e") else "compile-gpu"
    assert needs in report.line and f"[{extra}]" in report.line
    assert "-c " in report.line and "constraints.txt" in report.line
    device_fit.refuse(report)  # nothing checked: nothing refused


def test_what_it_cannot_check_it_says(monkeypatch):
    l4 = device_fit.check(RunSpec(), "g2-standard-8", 1)
    assert l4.line == "not checked: rlctl has no device description of nvidia-l4 to compile for"
    monkeypatch.setenv(device_fit.FIT_ENV, "off")
    assert device_fit.check(RunSpec(), "v6e-8", 1).line == "not checked: RLCTL_FIT_CHECK=off"


def test_a_bucket_model_without_credentials_is_not_read():
    config, why = device_fit._bucket_config("gs://inputs/m", None)
    assert config is None and why == (
        "cannot read gs://inputs/m/config.json without Google Cloud credentials"
    )


def _report(**kw) -> DeviceFit:
    base = dict(target="v6e-16 x2", device="TPU v6e", devices=32, device_memory=32 * GIB)
    return DeviceFit(usable=int(27.2 * GIB), **{**base, **kw})


def test_the_line_a_plan_prints():
    update = ProgramFit(
        name="update",
        arguments=GIB,
        temporaries=3 * GIB,
        outputs=0,
        peak=int(4.6 * GIB),
        compile_seconds=174.2,
        micro_batch=16,
    )
    fits = _report(peak=update.peak, programs=[update], compile_seconds=206.4)
    assert fits.line == "fits: 4.60 GiB of 27.20 GiB per chip, v6e-16 x2, compiled in 206 s"
    assert fits.detail()[0] == (
        "update: 4.60 GiB at its peak (temporaries 3.00 GiB, micro-batches of 16; "
        "compiled in 174 s)"
    )
    state = _report(fits=False, reason="state", peak=81 * GIB, state=81 * GIB)
    assert state.line == (
        "does not fit: 81.00 GiB of 27.20 GiB per chip in its weights and optimizer state "
        "alone, "
        "v6e-16 x2"
    )


@pytest.mark.parametrize(
    ("reason", "words"),
    [
        ("state", ["take 81.00 GiB per chip", "--lora-rank 16", "-a 'v6e-32 x2'"]),
        ("update", ["--set training.remat=true", "--max-new-tokens 24", "-a 'v6e-32 x2'"]),
        ("rollout", ["decodes 16 sequences at once", "--prompts-per-step 1"]),
        ("eval", ["--set eval.batch_size=8"]),
    ],
)
def test_the_fix_names_the_setting(reason, words):
    spec = RunSpec()  # 2 prompts x 8 completions x 48 tokens, eval batches of 16
    report = _report(fits=False, reason=reason, peak=81 * GIB, state=81 * GIB)
    fix = api.fit_fix(report, spec, lookup("v6e-16"), 2)
    for w in words:
        assert w in fix, (w, fix)
    with pytest.raises(OutOfMemoryError) as e:
        device_fit.refuse(report.model_copy(update={"fix": fix}))
    assert e.value.message.startswith("the run does not fit v6e-16 x2: 81.00 GiB of 27.20 GiB")
    assert e.value.hint == fix


def test_a_lora_run_is_not_told_to_use_lora():
    spec = RunSpec(training={"lora_rank": 8})
    report = _report(fits=False, reason="state", peak=81 * GIB, state=81 * GIB)
    fix = api.fit_fix(report, spec, lookup("v6e-16"), 2)
    assert "--lora-rank" not in fix and "-a 'v6e-32 x2'" in fix
