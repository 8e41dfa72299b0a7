"""Qwen3, Gemma 3 and Gemma 4 in the trainer: the prefix-shared log-probs, loss and gradients
(``tunix_adapter.trunk``/``head_weight``) equal Tunix's full-sequence computation,
as ``tests/core/trainer/test_loss.py::TestParityWithTunix`` shows for Llama; and
Gemma 3 configs the trainer's model cannot run are refused, not silently changed.

(Here rather than under tests/core/trainer/ because the families arrived with
checkpoint-convert; the models come from the same tiny-model writer.)
"""

from __future__ import annotations

import json

import numpy as np
import pytest

# builds a model, compiles or trains: out of the fast loop (tests/test_marks.py)
pytestmark = pytest.mark.slow

jax = pytest.importorskip("jax")
pytest.importorskip("tunix")

from rlctl.core.errors import ConfigError  # noqa: E402
from rlctl.core.families import FAMILIES  # noqa: E402
from tests.fakes.tiny_model import write_tiny_model  # noqa: E402

NEW_FAMILIES = ["qwen3", "gemma3_text", "gemma4_text"]


@pytest.fixture(scope="module", params=NEW_FAMILIES)
def setup(request, tmp_path_factory):
    from rlctl.core.trainer import tunix_adapter as ta

    folder = write_tiny_model(tmp_path_factory.mktemp("m") / request.param, request.param)
    model, info = ta.load_model(folder)
    assert info.family == request.param
    rng = np.random.default_rng(1)
    pad, G = 0, 3
    prompts = rng.integers(3, info.vocab_size, (2, 7)).astype(np.int32)
    prompts[1, :3] = pad  # left padding
    comps = rng.integers(3, info.vocab_size, (6, 5)).astype(np.int32)
    comps[2, 3:] = pad  # right padding
    mask = (comps != pad).astype(np.int32)
    adv = rng.normal(size=6).astype(np.float32)
    return model, info, prompts, comps, mask, adv, pad, G


@pytest.mark.trainer
def test_prefix_shared_log_probs_match_full_sequence(setup):
    from rlctl.core.trainer import tunix_adapter as ta
    from tests.core.trainer import yardsticks

    model, info, prompts, comps, mask, _, pad, G = setup
    ours, _ = ta.shared_prefix_logps(
        model, prompts, comps, group=G, pad_id=pad, temperature=0.7, info=info
    )
    full = yardsticks.per_token_logps(model, np.repeat(prompts, G, 0), comps, pad, 2, 0.7)
    np.testing.assert_allclose(np.asarray(ours) * mask, np.asarray(full) * mask, atol=2e-5)


@pytest.mark.trainer
def test_chunked_log_softmax_matches_one_chunk(setup):
    from rlctl.core.trainer import tunix_adapter as ta

    model, info, prompts, comps, _, _, pad, G = setup
    one, _ = ta.shared_prefix_logps(
        model, prompts, comps, group=G, pad_id=pad, temperature=1.0, info=info
    )
    chunked, _ = ta.shared_prefix_logps(
        model, prompts, comps, group=G, pad_id=pad, temperature=1.0, info=info, chunk=7
    )
    np.testing.assert_allclose(np.asarray(one), np.asarray(chunked), atol=1e-6)


@pytest.mark.trainer
def test_loss_and_gradient_match_tunix(setup):
    from tests.core.trainer import yardsticks

    # Gemma 4's tied embedding takes the head's, the input's and the per-layer inputs'
    # gradients (largest entry 6.35 here): its entries near 0 differ from Tunix's by
    # float32 rounding, at most 6e-6 of the leaf's largest (4e-5 absolute), every
    # leaf alike; the loss agrees to 1e-7
    scaled = 1e-5 if setup[1].family == "gemma4_text" else 0.0
    yardsticks.assert_loss_and_gradients_match(*setup, scaled_atol=scaled)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
        ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
        ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
        ({"rms_norm_eps": 1e-5}, "rms_norm_eps"),
        ({"query_pre_attn_scalar": 3}, "query_pre_attn_scalar"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
    ],
)
def test_gemma3_refuses_what_tunix_cannot_run(tmp_path, change, field):
    from rlctl.core.trainer import tunix_adapter as ta

    folder = write_tiny_model(tmp_path / "g", "gemma3_text")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(ConfigError, match=field):
        ta.load_model(folder)


def test_qwen3_refuses_a_rope_theta_tunix_ignores(tmp_path):
    from rlctl.core.trainer import tunix_adapter as ta

    folder = write_tiny_model(tmp_path / "q", "qwen3", rope_theta=1e4)
    with pytest.raises(ConfigError, match="rope_theta"):
        ta.load_model(folder)


def test_gemma3_rope_and_scaling_reach_tunix(tmp_path):
    from rlctl.core.trainer import tunix_adapter as ta

    cfg = json.loads((write_tiny_model(tmp_path / "g", "gemma3_text") / "config.json").read_text())
    built = ta.build_config(
        FAMILIES["gemma3_text"],
        {
            **cfg,
            "rope_theta": 1e6,
            "rope_local_base_freq": 1e4,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        },
    )
    assert (built.global_base_frequency, built.local_base_frequency) == (1_000_000, 10_000)
    assert built.global_scale_factor == 8.0 and built.num_embed == cfg["vocab_size"]


def test_gemma3_pattern_length_is_tunix_s():
    """The pure family table hard-codes Gemma 3's layer pattern (no Tunix import in
    core/families/); it must be the one Tunix's model runs."""
    from tunix.models.gemma3 import model as m

    from rlctl.core.families.gemma3 import GEMMA3_PATTERN_LENGTH

    assert len(m.GEMMA3_ATTENTION_PATTERN) == GEMMA3_PATTERN_LENGTH


def test_every_family_builds_its_tunix_model(tmp_path):
    """Each entry of the one family table names a Tunix package (or rlctl's own, for
    Qwen3.5), model class and loader that exist, and its config mapping builds that
    package's ModelConfig."""
    from rlctl.core.trainer import tunix_adapter as ta
    from rlctl.core.trainer.tunix_adapter.families import tunix_module

    for name, fam in FAMILIES.items():
        cfg = json.loads((write_tiny_model(tmp_path / name, name) / "config.json").read_text())
        config = ta.build_config(fam, cfg)
        assert type(config).__module__ == tunix_module(fam).__name__
        assert hasattr(tunix_module(fam), fam.model_class)
        if not fam.layout.by_layer:  # those rlctl loads by its layout (weights.py)
            loader = tunix_module(fam, fam.safetensors_loader)
            assert hasattr(loader, "create_model_from_safe_tensors")


def test_gemma4_e2b_config_builds_tunix_own_e2b_preset():
    """The E2B stand-in config (tests/data/configs) builds Tunix's ``gemma4_e2b``
    preset: the same sizes, layer pattern and KV-sharing plan (the preset repeats a
    5-layer pattern and counts 20/35 shared layers; the mapping writes every layer
    and half a layer less)."""
    from pathlib import Path

    from rlctl.core.trainer import tunix_adapter as ta
    from rlctl.core.trainer.tunix_adapter.families import tunix_module

    fam = FAMILIES["gemma4_text"]
    file = Path(__file__).resolve().parents[2] / "data" / "configs" / "gemma-4-e2b-text.json"
    ours = ta.build_config(fam, json.loads(file.read_text()))
    m = tunix_module(fam)
    theirs = m.ModelConfig.gemma4_e2b()
    skip = {"attention_pattern", "frac_shared_layers", "shd_config"}
    for f in type(theirs).__dataclass_fields__:
        if f not in skip:
            assert getattr(ours, f) == getattr(theirs, f), f

    def plan(c):
        pattern = [c.attention_pattern[i % len(c.attention_pattern)] for i in range(c.num_layers)]
        sharing = m.create_kv_cache_sharing_patterns(
            c.num_layers, c.frac_shared_layers, True, True, tuple(pattern)
        )
        return pattern, sharing

    assert plan(ours) == plan(theirs)


@pytest.mark.trainer
def test_a_31b_shaped_gemma4_converts_and_is_transformers(tmp_path):
    """The family's tiny model has E2B's features; this one 31B's instead: global
    layers whose keys are their values (no v_proj) with their own KV heads, no
    per-layer inputs, no KV sharing. It round-trips bit-exact through the trainer
    layout and gives transformers' logits and greedy tokens."""
    pytest.importorskip("transformers")
    from rlctl.core.checkpoints.convert import convert
    from rlctl.core.trainer import tunix_adapter as ta
    from tests.core.checkpoints.test_transformers_parity import assert_same_model
    from tests.fakes.tiny_model import write_transformers_model

    src = write_transformers_model(
        tmp_path / "src",
        "gemma4_text",
        overrides={
            "attention_k_eq_v": True,
            "num_global_key_value_heads": 1,
            "num_key_value_heads": 2,
            "hidden_size_per_layer_input": 0,
            "num_kv_shared_layers": 0,
            "use_double_wide_mlp": False,
        },
    )
    config = json.loads((src / "config.json").read_text())
    fields = FAMILIES["gemma4_text"].config_fields(config)
    assert (fields["k_eq_v_global"], fields["num_global_kv_heads"]) == (True, 1)
    assert (fields["per_layer_input_dim"], fields["frac_shared_layers"]) == (0, 0.0)
    convert(str(src), str(tmp_path / "trainer"), to="trainer")
    convert(str(tmp_path / "trainer"), str(tmp_path / "back"), to="hf", verify=True)
    model, info = ta.load_model(tmp_path / "trainer")
    assert_same_model(model, info, tmp_path / "back", tmp_path / "trainer")


def test_a_gemma4_folder_is_checked_against_its_layout(tmp_path):
    """Its layers differ in shape (global layers' heads, KV-shared layers without k/v),
    so the folder check compares each tensor with the layout's shape for it, not with
    layer 0's: a stock folder passes (``rlctl train --model`` on it used to stop at
    ``k_norm is [32], layer 0's is [16]``), a misshapen tensor is named."""
    from safetensors.numpy import load_file, save_file

    from rlctl.core.trainer.model.models import check_model_folder

    folder = write_tiny_model(tmp_path / "g", "gemma4_text")
    check_model_folder(folder)
    tensors = load_file(str(folder / "model.safetensors"))
    name = "model.layers.1.self_attn.k_proj.weight"  # a global layer's: [32, 64]
    tensors[name] = tensors["model.layers.0.self_attn.k_proj.weight"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(ConfigError, match=f"{name}' is \\[16, 64\\], config.json makes it"):
        check_model_folder(folder)
