"""Llama 3.1 and 3.2 are trained as the models they are: their ``rope_type: llama3``
scaling (issue #52 (2)) read from config.json and applied in every program that
rotates queries and keys (the model's own call, the update's layer, the sampler's
decode), and every other rope type refused with one line.

The published configs (tests/data/configs, transcribed from the Hub) map without a
refusal; a tiny model with Llama 3.2's rope settings gives transformers' logits and
greedy tokens, and the same weights without the scaling do not (so the test can fail).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlctl.core import families
from rlctl.core.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[2] / "data" / "configs"
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def published(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


@pytest.mark.parametrize(
    ("name", "factor", "tied", "head_dim"),
    [("llama-3.2-1b", 32.0, True, 64), ("llama-3.1-8b", 8.0, False, 128)],
)
def test_the_published_configs_map_with_their_rope_scaling(name, factor, tied, head_dim):
    c = published(name)
    fields = families.of_config(c).config_fields(c)
    assert fields["rope_scaling"] == (factor, 1.0, 4.0, 8192.0)
    assert fields["rope_theta"] == 500000.0 and fields["weight_tying"] is tied
    assert fields["head_dim"] == head_dim and fields["num_kv_heads"] == 8


def test_transformers_5_spelling_maps_too():
    c = published("llama-3.2-1b")
    rope = {**c.pop("rope_scaling"), "rope_theta": c.pop("rope_theta")}
    fields = families.family("llama").config_fields({**c, "rope_parameters": rope})
    assert fields["rope_scaling"] == (32.0, 1.0, 4.0, 8192.0)
    assert fields["rope_theta"] == 500000.0


def test_plain_rope_has_no_scaling():
    c = published("llama-3.2-1b")
    del c["rope_scaling"]
    assert families.family("llama").config_fields(c)["rope_scaling"] is None


@pytest.mark.parametrize(
    ("scaling", "word"),
    [
        ({"rope_type": "yarn", "factor": 4.0}, "rope type 'yarn'"),
        ({"type": "linear", "factor": 2.0}, "rope type 'linear'"),
        ({"rope_type": "dynamic", "factor": 2.0}, "rope type 'dynamic'"),
        ({"rope_type": "llama3", "factor": 8.0}, "without low_freq_factor"),
        ({**LLAMA3_ROPE, "low_freq_factor": 4.0}, "low_freq_factor=4"),
    ],
)
def test_other_rope_types_are_one_clear_line(scaling, word):
    c = {**published("llama-3.1-8b"), "rope_scaling": scaling}
    with pytest.raises(ConfigError, match=word) as e:
        families.family("llama").config_fields(c)
    assert str(e.value).startswith("Llama config: ") and "\n" not in str(e.value)


@pytest.mark.slow
def test_the_frequencies_are_transformers():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from rlctl.core.trainer.tunix_adapter.rope import timescales

    c = published("llama-3.2-1b")
    config = transformers.LlamaConfig(**{k: v for k, v in c.items() if k != "architectures"})
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](config, torch.device("cpu"))
    ours = 1.0 / timescales(64, 500000.0, (32.0, 1.0, 4.0, 8192.0))
    np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-6)
    plain = 1.0 / (500000.0 ** (np.arange(0, 64, 2) / 64))
    changed = ~np.isclose(ours, plain, rtol=1e-4)
    assert 0 < changed.sum() < 32  # the high frequencies kept, the low ones scaled


# --- a tiny model with Llama 3.2's rope (torch and Tunix: the test extra) -------------
def tiny_with(tmp: Path, rope: dict | None) -> Path:
    """A tiny Llama as transformers writes it, with ``rope`` as its rope_scaling and
    Llama 3.2's base. ``original_max_position_embeddings`` 32 instead of 8192: a tiny
    head (16 wide) then has frequencies in all three bands at a prompt's positions,
    as a real one does over its context."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.fakes.tiny_model import write_transformers_model

    overrides: dict = {"rope_theta": 500000.0}
    if rope is not None:
        overrides["rope_scaling"] = rope
    return write_transformers_model(tmp, "llama", overrides=overrides)


@pytest.fixture(scope="module")
def scaled(tmp_path_factory):
    """(HF folder, trainer folder, trainer model, info) of the tiny scaled Llama."""
    pytest.importorskip("tunix")
    from rlctl.core.checkpoints.convert import convert
    from rlctl.core.trainer import tunix_adapter as ta

    tmp = tmp_path_factory.mktemp("llama3-rope")
    rope = {**LLAMA3_ROPE, "factor": 8.0, "original_max_position_embeddings": 32}
    src = tiny_with(tmp / "hf", rope)
    convert(str(src), str(tmp / "trainer"), to="trainer")
    model, info = ta.load_model(tmp / "trainer")
    return src, tmp / "trainer", model, info


@pytest.mark.trainer
def test_the_trainers_logits_and_greedy_tokens_are_transformers(scaled):
    from tests.core.checkpoints.test_transformers_parity import assert_same_model

    src, trainer, model, info = scaled
    assert model.config.rope_scaling == (8.0, 1.0, 4.0, 32.0)
    assert_same_model(model, info, src, trainer)


@pytest.mark.trainer
def test_without_the_scaling_the_logits_differ(scaled):
    """The same weights with their config's scaling dropped (what rlctl trained before)
    are another model: their logits leave transformers' tolerance."""
    import dataclasses

    from tests.core.checkpoints.test_transformers_parity import (
        hf_logits,
        hf_model,
        jax_logits,
        prompt_ids,
    )

    src, _, model, _ = scaled
    ids = prompt_ids(src)
    theirs = hf_logits(hf_model(src), ids)
    np.testing.assert_allclose(jax_logits(model, ids), theirs, atol=2e-4, rtol=1e-3)
    plain = dataclasses.replace(model.config, rope_scaling=None)
    for layer in model.layers:
        layer.attn.config = plain
    try:
        # 4e-3 on this tiny model's 18-token prompt: 20x the parity tolerance above
        assert np.abs(jax_logits(model, ids) - theirs).max() > 1e-3
    finally:
        for layer in model.layers:
            layer.attn.config = model.config


@pytest.mark.trainer
def test_the_updates_log_probs_are_transformers(scaled):
    """The update's own layer (``mlp_grad.attention``, scanned or not) rotates as the
    checkpoint does: its log-probs of a completion are transformers' log-softmax."""
    import jax.numpy as jnp
    import torch

    from rlctl.core.trainer import tunix_adapter as ta
    from tests.core.checkpoints.test_transformers_parity import hf_model, prompt_ids

    src, _, model, info = scaled
    ids = prompt_ids(src)
    prompt, completion = ids[:-6], ids[-6:]
    logps, _ = ta.shared_prefix_logps(
        model,
        jnp.asarray([prompt], jnp.int32),
        jnp.asarray([completion], jnp.int32),
        group=1,
        pad_id=-1,
        temperature=1.0,
        info=info,
    )
    with torch.no_grad():
        logits = hf_model(src)(torch.tensor([ids])).logits[0].double()
    want = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1]
    want = want[torch.arange(6), torch.tensor(completion)].numpy()
    np.testing.assert_allclose(np.asarray(logps[0]), want, atol=2e-4)


@pytest.mark.trainer
@pytest.mark.slow
@pytest.mark.parametrize("extra", [(), ("--lora-rank", "4")], ids=["full", "lora"])
def test_it_trains_two_steps_and_exports_transformers_logits(scaled, tmp_path, monkeypatch, extra):
    """Through ``rlctl train`` (the update's scanned layers, the sampler's decode, LoRA's
    wrapped projections) and back out with the checkpoint's rope_scaling; for the full
    fine-tune, transformers then computes the trained policy's logits (a LoRA run's
    checkpoint holds its adapters only: its merged export is test_lora_export's)."""
    from tests.core.families.test_conformance import config_of, converts_trains_and_exports

    monkeypatch.chdir(tmp_path)
    out = converts_trains_and_exports(tmp_path, scaled[0], *extra, compare=not extra)
    assert config_of(out).get("rope_scaling", config_of(out).get("rope_parameters")) == (
        config_of(scaled[0]).get("rope_scaling", config_of(scaled[0]).get("rope_parameters"))
    )


@pytest.mark.slow
def test_the_config_carries_the_scaling_into_the_programs_cache_key():
    pytest.importorskip("tunix")
    from rlctl.core.trainer.tunix_adapter.families import build_config

    c = published("llama-3.2-1b")
    fam = families.family("llama")
    scaled, again = build_config(fam, c), build_config(fam, dict(c))
    plain = build_config(fam, {k: v for k, v in c.items() if k != "rope_scaling"})
    assert scaled == again and hash(scaled) == hash(again)
    assert scaled != plain and "rope_scaling" in repr(scaled)
    assert not hasattr(plain, "rope_scaling") or plain.rope_scaling is None
