"""Qwen3.5 (issue #52 (1)): its text model as a family on rlctl's own model
(``trainer/tunix_adapter/qwen3_5``), and its multimodal checkpoints, which every
released dense Qwen3.5 is, read as that family with their vision tower set aside on
the way in and written back on the way out.

The published configs are stand-ins with the published fields (tests/data/configs/
README.md). The tiny models are transformers' own (``Qwen3_5ForCausalLM`` and
``Qwen3_5ForConditionalGeneration`` from their config classes), every vector perturbed
so a norm offset shows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlctl.core import families
from rlctl.core.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[2] / "data" / "configs"
LINEAR, FULL = "linear_attention", "full_attention"


def published(name: str) -> dict[str, Any]:
    return json.loads((CONFIGS / f"{name}.json").read_text())


@pytest.mark.parametrize(
    ("name", "hidden", "ffn"), [("qwen3.5-0.8b-base", 1024, 3584), ("qwen3.5-2b-base", 2048, 6144)]
)
def test_the_published_configs_map_as_their_text_model(name, hidden, ffn):
    c = published(name)
    fam = families.of_config(c)
    assert fam is families.family("qwen3_5_text") and fam.wraps(c)
    assert fam.tensor_prefix(c) == "model.language_model."
    # the 0.8B's mapping is its row in test_foreign_keys; the 2B differs in its widths
    from tests.core.families.test_foreign_keys import REAL

    fields = {**REAL["qwen3_5_text"][1], "embed_dim": hidden, "hidden_dim": ffn}
    assert fam.config_fields(c) == fields


def test_the_text_config_is_tied_as_the_wrapper_says():
    """transformers ties a multimodal model by its top-level tie_word_embeddings."""
    c = published("qwen3.5-0.8b-base")
    fam = families.of_config(c)
    assert fam.config_fields({**c, "tie_word_embeddings": False})["use_tied_embedding"] is False
    del c["tie_word_embeddings"]
    assert fam.config_fields(c)["use_tied_embedding"] is True  # then the text model's


def test_the_layer_pattern_defaults_as_transformers_derives_it():
    c = published("qwen3.5-0.8b-base")["text_config"]
    del c["layer_types"]
    fields = families.family("qwen3_5_text").config_fields(c)
    assert fields["layer_types"] == ((LINEAR,) * 3 + (FULL,)) * 6


@pytest.mark.parametrize(
    ("change", "word"),
    [
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e7}}, "yarn"),
        ({"attention_bias": True}, "attention_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"layer_types": [LINEAR, "sliding_attention"] * 12}, "layer_types"),
        ({"linear_num_value_heads": 24}, "linear_num_value_heads"),
        ({"num_experts": 256}, "num_experts"),  # Qwen3.5-MoE's field
    ],
)
def test_what_its_model_would_compute_otherwise_is_one_line(change, word):
    c = published("qwen3.5-0.8b-base")
    c["text_config"].update(change)
    with pytest.raises(ConfigError, match=word) as e:
        families.of_config(c).config_fields(c)
    assert "\n" not in str(e.value)


def test_a_wrapper_without_its_text_config_is_one_line():
    c = published("qwen3.5-0.8b-base")
    del c["text_config"]
    with pytest.raises(ConfigError, match="no text_config"):
        families.of_config(c).config_fields(c)


# --- transformers' own tiny models (torch: the test extra) -----------------------------
def shrunk(config: dict[str, Any], layers: int | None = None) -> dict[str, Any]:
    """A published Qwen3.5 config with its widths shrunk, its layer pattern and rope
    settings kept (a head of 256 keeps the rope's 64 rotated dims and its sections);
    the first ``layers`` layers only, when given."""
    c = json.loads(json.dumps(config))
    t = c["text_config"]
    types = t["layer_types"][:layers] if layers else t["layer_types"]
    t.update(
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=2,
        num_key_value_heads=1,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        vocab_size=384,
        num_hidden_layers=len(types),
        layer_types=types,
        eos_token_id=2,
    )
    c["vision_config"].update(depth=1, hidden_size=32, intermediate_size=64, num_heads=2)
    c["vision_config"]["out_hidden_size"] = 64
    return c


def write_multimodal(folder: Path, config: dict[str, Any], seed: int = 0) -> Path:
    """transformers' ``Qwen3_5ForConditionalGeneration`` of ``config``, random, every
    vector perturbed, with a tokenizer, and one multi-token-prediction tensor added
    as the published checkpoints carry them (transformers drops ``mtp.*`` on load)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from safetensors.numpy import load_file, save_file

    from tests.fakes.tiny_model import _train_tokenizer, _write_tokenizer_config

    folder.mkdir(parents=True, exist_ok=True)
    _train_tokenizer(384).save(str(folder / "tokenizer.json"))
    _write_tokenizer_config(folder)
    keys = ("text_config", "vision_config", "tie_word_embeddings", "image_token_id")
    hf_config = transformers.AutoConfig.for_model("qwen3_5", **{k: config[k] for k in keys})
    torch.manual_seed(seed)
    model = transformers.Qwen3_5ForConditionalGeneration(hf_config).float()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * (0.1 if p.ndim == 1 else 0.02))
    model.save_pretrained(str(folder))
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["mtp.fc.weight"] = np.random.default_rng(seed).normal(size=(64, 128)).astype(np.float32)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def multimodal(tmp_path_factory):
    """(its HF folder, a trainer folder converted from it, that converted back)."""
    from rlctl.core.checkpoints.convert import convert

    tmp = tmp_path_factory.mktemp("q35mm")
    src = write_multimodal(tmp / "src", shrunk(published("qwen3.5-0.8b-base"), layers=4))
    there = convert(str(src), str(tmp / "trainer"), to="trainer")
    back = convert(str(tmp / "trainer"), str(tmp / "back"), to="hf", verify=True)
    assert there.kept == back.kept > 0 and there.skipped == []  # said, not dropped
    return src, tmp / "trainer", tmp / "back"


def all_tensors(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    out: dict[str, np.ndarray] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


@pytest.mark.slow
def test_a_multimodal_checkpoint_round_trips_with_its_vision_tower(multimodal):
    src, trainer, back = multimodal
    before, after = all_tensors(src), all_tensors(back)
    assert set(before) == set(after)
    assert any(k.startswith("model.visual.") for k in before) and "mtp.fc.weight" in before
    for k in before:
        np.testing.assert_array_equal(before[k], after[k], err_msg=k)
    # the trainer folder holds the text model in Orbax and the rest aside, unchanged
    kept = all_tensors(trainer)  # kept.safetensors: its only safetensors file
    assert set(kept) == {k for k in before if not k.startswith("model.language_model.")}
    assert json.loads((back / "config.json").read_text()) == json.loads(
        (src / "config.json").read_text()
    )


def jax_logits(model, ids: list[int]) -> np.ndarray:
    """The model's logits of ``ids``, in one compiled program (op by op, its scans
    dispatch every step: a minute on this CPU)."""
    import jax.numpy as jnp
    from flax import nnx

    n = len(ids)
    mask = jnp.tril(jnp.ones((1, n, n), jnp.bool_))
    call = nnx.jit(lambda m, t, p, k: m(t, p, None, k)[0])
    logits = call(model, jnp.asarray([ids], jnp.int32), jnp.arange(n)[None], mask)
    return np.asarray(logits[0], np.float32)


def multimodal_logits(folder: Path, ids: list[int]) -> np.ndarray:
    import torch
    import transformers

    m = transformers.Qwen3_5ForConditionalGeneration.from_pretrained(
        str(folder), dtype=torch.float32
    ).eval()
    with torch.no_grad():
        return m(torch.tensor([ids])).logits[0].numpy()


IDS = [5, 17, 42, 9, 88, 3, 61, 27, 301, 14]


@pytest.mark.trainer
def test_the_trainer_reads_a_multimodal_checkpoint_as_transformers_runs_its_text(multimodal):
    from rlctl.core.trainer import tunix_adapter as ta

    src, trainer, back = multimodal
    theirs = multimodal_logits(src, IDS)
    for folder in (src, trainer):  # the HF folder itself, and the trainer folder
        model, info = ta.load_model(folder)
        assert info.family == "qwen3_5_text"
        np.testing.assert_allclose(jax_logits(model, IDS), theirs, atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(multimodal_logits(back, IDS), theirs)


@pytest.mark.trainer
def test_a_tiny_model_of_the_published_pattern_and_rope_is_transformers(tmp_path):
    """All 24 layers of Qwen3.5-0.8B's pattern and its rope settings (1e7, a quarter
    of each 256-wide head rotated, the multimodal rope's sections), widths shrunk."""
    from rlctl.core.trainer import tunix_adapter as ta

    src = write_multimodal(tmp_path / "src", shrunk(published("qwen3.5-0.8b-base")))
    model, _ = ta.load_model(src)
    ours, theirs = jax_logits(model, IDS), multimodal_logits(src, IDS)
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=1e-5)
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()


@pytest.mark.trainer
@pytest.mark.slow
def test_its_lora_run_trains_two_steps_and_exports(tmp_path, monkeypatch):
    """GRPO's and GSPO's full fine-tunes are the conformance test's rows; here LoRA. A full
    fine-tune's export gives the trained policy's logits in transformers; a LoRA
    run's is the base with its adapters merged (tests/core/families/test_conformance)."""
    from tests.core.families.test_conformance import converts_trains_and_exports
    from tests.fakes.tiny_model import write_transformers_model

    monkeypatch.chdir(tmp_path)
    src = write_transformers_model(tmp_path / "q", "qwen3_5_text")
    converts_trains_and_exports(tmp_path, src, "--lora-rank", "4", compare=False)


@pytest.mark.trainer
@pytest.mark.slow
def test_a_multimodal_run_exports_its_vision_tower_unchanged(tmp_path, monkeypatch):
    from tests.core.families.test_conformance import converts_trains_and_exports

    monkeypatch.chdir(tmp_path)
    src = write_multimodal(tmp_path / "src", shrunk(published("qwen3.5-0.8b-base"), layers=4))
    out = converts_trains_and_exports(tmp_path, src, compare=False)
    before, after = all_tensors(src), all_tensors(out)
    assert set(before) == set(after)
    for k in before:
        if not k.startswith("model.language_model."):
            np.testing.assert_array_equal(before[k], after[k], err_msg=k)
    ids = IDS
    trained = multimodal_logits(out, ids)
    assert np.abs(trained - multimodal_logits(src, ids)).max() > 1e-4  # it did train
