"""LoRA (``training.lora_rank``): qwix adapters on a frozen base, trained alone.

The adapters change rlctl's own forwards (which call decoder layers one by one,
not the model's ``__call__`` qwix wraps); zeroed, they give the base exactly (the
reference for ``beta > 0``, without a second copy); only they get gradients and
optimizer state; a LoRA checkpoint holds them and a reference to the base, and a
run killed and resumed ends exactly as one never interrupted.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("qwix")

from rlctl.core.config.models import RunSpec  # noqa: E402
from tests.fakes.tiny_model import write_tiny_model  # noqa: E402

pytestmark = pytest.mark.trainer
LORA = ("--set", "training.lora_rank=4", "--lr", "3e-2")


def lora_model(folder, family="llama", targets=None, rank=4):
    from rlctl.core.trainer import tunix_adapter as ta
    from rlctl.core.trainer.tunix_adapter.lora import apply_lora

    training = RunSpec(training={"lora_rank": rank, "lora_target_modules": targets}).training
    model, info = ta.load_model(folder)
    return apply_lora(model, family, training), info


def logps(model, info):
    from rlctl.core.trainer import tunix_adapter as ta

    prompts = jax.numpy.array([[5, 6, 7, 8]])
    completions = jax.numpy.array([[9, 10, 11], [12, 13, 0]])
    return np.asarray(
        ta.shared_prefix_logps(
            model, prompts, completions, group=2, pad_id=0, temperature=1.0, info=info
        )[0]
    )


def perturbed(model):
    """``model`` with every adapter set to small random values (a new one's b is 0)."""
    from flax import nnx

    lora = nnx.state(model, nnx.LoRAParam)
    keys = iter(jax.random.split(jax.random.key(1), len(jax.tree.leaves(lora))))
    nnx.update(
        model, jax.tree.map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape), lora)
    )
    return model


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_adapters_change_rlctls_forward_and_zeroed_give_the_base(tmp_path, family):
    from flax import nnx

    from rlctl.core.trainer import tunix_adapter as ta
    from rlctl.core.trainer.tunix_adapter.lora import base_only

    folder = write_tiny_model(tmp_path / family, family)
    base, info = ta.load_model(folder)
    model, _ = lora_model(folder, family)
    np.testing.assert_array_equal(logps(model, info), logps(base, info))  # b starts at 0
    perturbed(model)
    assert np.abs(logps(model, info) - logps(base, info)).max() > 1e-3
    graphdef, state = nnx.split(model)
    zeroed = nnx.merge(graphdef, base_only(state))
    np.testing.assert_array_equal(logps(zeroed, info), logps(base, info))
    # seven projections x 2 layers, an a and a b each; the base arrays are shared
    assert len(jax.tree.leaves(nnx.state(model, nnx.LoRAParam))) == 28
    assert (
        nnx.state(model, nnx.Param)["embedder"]["input_embedding"].get_value()
        is nnx.state(zeroed, nnx.Param)["embedder"]["input_embedding"].get_value()
    )


def test_adapters_are_committed_like_the_base(tmp_path):
    """Uncommitted adapters made the sampler compile again after the first update
    (whose outputs are committed)."""
    from flax import nnx

    model, _ = lora_model(write_tiny_model(tmp_path / "m", "llama"))
    assert {x.committed for x in jax.tree.leaves(nnx.state(model, nnx.Param))} == {True}


def test_only_the_targeted_projections_get_adapters(tmp_path):
    from flax import nnx

    model, _ = lora_model(write_tiny_model(tmp_path / "m", "llama"), targets=["q_proj", "v_proj"])
    layer = nnx.to_pure_dict(nnx.state(model, nnx.LoRAParam))["layers"][0]
    assert set(layer) == {"attn"} and set(layer["attn"]) == {"q_proj", "v_proj"}


def test_only_the_adapters_get_gradients_and_moments(tmp_path):
    from flax import nnx

    from rlctl.core.trainer.update.step import make_optimizer

    model, _ = lora_model(write_tiny_model(tmp_path / "m", "llama"))
    spec = RunSpec(training={"lora_rank": 4})
    opt = make_optimizer(model, spec.training)
    n_lora = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam)))
    moments = sum(x.size for x in jax.tree.leaves(nnx.state(opt)) if x.ndim)
    assert moments == 2 * n_lora  # mu and nu of the adapters; none of the base


def test_a_lora_run_learns_checkpoints_the_adapters_and_resumes_exactly(
    tiny_model_dir, tmp_path, monkeypatch
):
    """A LoRA run killed after checkpoint 2 and resumed ends with the metrics of one
    never interrupted; its checkpoints hold the adapters (no base weight) and name
    the base by SHA-256."""
    from typer.testing import CliRunner

    from rlctl.cli.app import app
    from rlctl.core.checkpoints.orbax import OrbaxReader
    from rlctl.core.trainer.run import loop
    from tests.core.trainer.test_train import ctrl_c_at, in_process, metrics, tiny_args

    common = (
        "--steps",
        "4",
        "--set",
        "checkpoint.interval=2",
        "--eval-size",
        "0",
        "--set",
        "training.beta=0.04",
        *LORA,
    )
    whole = in_process(tiny_model_dir, tmp_path, "whole", "grpo", *common)
    assert any(r["grad_norm"] > 0 for r in whole) and any(r["kl"] > 0 for r in whole)
    step = tmp_path / "whole" / "checkpoints" / "4"
    keys = OrbaxReader(step).keys
    assert keys and all("_lora_" in k for k in keys), keys
    record = json.loads((step / "rlctl-lora.json").read_text())
    assert record["rank"] == 4 and record["alpha"] == 8.0 and len(record["base"]["sha256"]) == 64
    real = loop.Trainer.step
    ctrl_c_at(monkeypatch, 2)
    r = CliRunner().invoke(app, tiny_args(tiny_model_dir, tmp_path, "cut", "grpo", *common))
    assert r.exit_code == 130, r.output
    monkeypatch.setattr(loop.Trainer, "step", real)
    r = CliRunner().invoke(app, ["resume", "cut", "--runs-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert metrics(tmp_path / "cut") == whole


def test_resume_refuses_adapters_of_another_base(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from rlctl.cli.app import app
    from tests.core.trainer.test_train import ctrl_c_at, tiny_args

    folder = write_tiny_model(tmp_path / "m", "llama")
    ctrl_c_at(monkeypatch, 2)
    r = CliRunner().invoke(
        app,
        tiny_args(
            folder,
            tmp_path,
            "r",
            "grpo",
            "--steps",
            "4",
            "--set",
            "checkpoint.interval=2",
            "--eval-size",
            "0",
            *LORA,
        ),
    )
    assert r.exit_code == 130, r.output
    write_tiny_model(folder, "llama", seed=7)  # the same model, other weights
    monkeypatch.undo()
    r = CliRunner().invoke(app, ["resume", "r", "--runs-dir", str(tmp_path)])
    assert r.exit_code != 0 and "trained on other weights" in r.output, r.output
    assert "Traceback" not in r.output


def test_lora_on_a_family_without_adapters_leaves_no_run(tmp_path):
    from typer.testing import CliRunner

    from rlctl.cli.app import app
    from tests.core.trainer.test_train import tiny_args

    folder = write_tiny_model(tmp_path / "models" / "g", "gemma3_text")
    r = CliRunner().invoke(app, tiny_args(folder, tmp_path, "g", "grpo", "--steps", "1", *LORA))
    assert r.exit_code == 2 and "LoRA is not supported for gemma3_text" in r.output, r.output
    assert "Traceback" not in r.output and not (tmp_path / "g").exists()


@pytest.mark.parametrize(
    ("sets", "says"),
    [
        (("training.lora_alpha=4",), "needs training.lora_rank"),
        (("training.lora_rank=4", 'training.lora_target_modules=["qq_proj"]'), "lora_target"),
        (("training.lora_rank=0",), "lora_rank"),
        # Qwen3.5's linear-attention projection: a Llama has none
        (
            ("training.lora_rank=4", 'training.lora_target_modules=["in_proj_qkv"]'),
            "in_proj_qkv: not a projection of llama models",
        ),
    ],
)
def test_a_bad_lora_config_is_one_line_and_writes_nothing(tiny_model_dir, tmp_path, sets, says):
    from typer.testing import CliRunner

    from rlctl.cli.app import app
    from tests.core.trainer.test_train import tiny_args

    extra = [x for s in sets for x in ("--set", s)]
    r = CliRunner().invoke(app, tiny_args(tiny_model_dir, tmp_path, "bad", "grpo", *extra))
    assert r.exit_code == 2 and says in r.output, r.output
    assert "Traceback" not in r.output and not (tmp_path / "bad").exists()
