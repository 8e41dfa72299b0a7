"""A family refuses any config.json key that changes the model and that it does not
apply (issue #52 (4), ``rlctl/core/families/foreign.py``), checked on real configs:

- every family has a published config.json here (tests/data/configs) that maps exactly
  to the Tunix fields written down below, a second time on purpose;
- the same config with one foreign field changed is refused with one line naming it;
- a Granite-3-like config (Llama's layers plus four multipliers), on a family a
  contributor registers with Llama's mapping, is refused naming a multiplier: it used
  to pass every conformance test and train as a plain Llama.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from rlctl.core import families
from rlctl.core.errors import ConfigError
from rlctl.core.families import foreign

CONFIGS = Path(__file__).resolve().parents[2] / "data" / "configs"


def published(name: str) -> dict[str, Any]:
    return json.loads((CONFIGS / f"{name}.json").read_text())


# family -> (its published config, what it maps to, one foreign change and its key)
REAL: dict[str, tuple[str, dict[str, Any], dict[str, Any], str]] = {
    "llama": (
        "llama-3.2-1b",
        {
            "num_layers": 16,
            "vocab_size": 128256,
            "embed_dim": 2048,
            "hidden_dim": 8192,
            "num_heads": 32,
            "head_dim": 64,
            "num_kv_heads": 8,
            "rope_theta": 500000.0,
            "norm_eps": 1e-5,
            "weight_tying": True,
            "rope_scaling": (32.0, 1.0, 4.0, 8192.0),
        },
        {"embedding_multiplier": 12.0},
        "embedding_multiplier",
    ),
    "mistral": (
        "mistral-7b-v0.3",
        {
            "num_layers": 32,
            "vocab_size": 32768,
            "embed_dim": 4096,
            "hidden_dim": 14336,
            "num_heads": 32,
            "head_dim": 128,
            "num_kv_heads": 8,
            "rope_theta": 1e6,
            "norm_eps": 1e-5,
            "weight_tying": False,
        },
        {"attention_bias": True},
        "attention_bias",
    ),
    "qwen2": (
        "qwen2.5-0.5b",
        {
            "num_layers": 24,
            "vocab_size": 151936,
            "embed_dim": 896,
            "hidden_dim": 4864,
            "num_heads": 14,
            "head_dim": 64,
            "num_kv_heads": 2,
            "rope_theta": 1e6,
            "norm_eps": 1e-6,
            "use_tied_embedding": True,
        },
        {"rope_scaling": {"type": "yarn", "factor": 4.0}},
        "rope_scaling",
    ),
    "qwen3": (
        "qwen3-0.6b",
        {
            "num_layers": 28,
            "vocab_size": 151936,
            "embed_dim": 1024,
            "hidden_dim": 3072,
            "num_heads": 16,
            "head_dim": 128,
            "num_kv_heads": 8,
            "rope_theta": 1e6,
            "norm_eps": 1e-6,
            "use_tied_embedding": True,
        },
        # Qwen3's own documented long-context setting: Tunix's Qwen3 has no YaRN
        {
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 32768,
            }
        },
        "rope_scaling",
    ),
    "gemma3_text": (
        "gemma-3-1b-pt",
        {
            "num_layers": 26,
            "num_embed": 262144,
            "embed_dim": 1152,
            "hidden_dim": 6912,
            "num_heads": 4,
            "head_dim": 256,
            "num_kv_heads": 1,
            "sliding_window_size": 512,
            "local_base_frequency": 10000,
            "global_base_frequency": 1000000,
            "global_scale_factor": 1.0,
            "query_pre_attn_norm": "BY_ONE_OVER_SQRT_HEAD_DIM",
        },
        {"partial_rotary_factor": 0.5},
        "partial_rotary_factor",
    ),
    "gemma4_text": (
        "gemma-4-e2b-text",
        {
            "num_layers": 35,
            "num_embed": 262144,
            "embed_dim": 1536,
            "hidden_dim": 6144,
            "num_heads": 8,
            "head_dim": 256,
            "num_kv_heads": 1,
            "final_logit_softcap": 30.0,
            "sliding_window_size": 512,
            "per_layer_input_dim": 256,
            "num_global_kv_heads": None,
            "global_key_size": 512,
            "attention_pattern": (("LOCAL_SLIDING",) * 4 + ("GLOBAL",)) * 7,
            # 20 shared layers of 35, less half a layer (Tunix counts int(35 - f * 35))
            "frac_shared_layers": 19.5 / 35,
            "k_eq_v_global": False,
            "override_kv_shared_ffw_hidden": 12288,
            "local_base_frequency": 10000,
            "local_rope_proportion": 1.0,
            "local_scale_factor": 1.0,
            "global_base_frequency": 1000000,
            "global_rope_proportion": 0.25,
            "global_scale_factor": 1.0,
        },
        {"attention_bias": True},
        "attention_bias",
    ),
    "qwen3_5_text": (
        # multimodal (every dense Qwen3.5 is): its text_config is the family's
        "qwen3.5-0.8b-base",
        {
            "num_layers": 24,
            "vocab_size": 248320,
            "embed_dim": 1024,
            "hidden_dim": 3584,
            "num_heads": 8,
            "head_dim": 256,
            "num_kv_heads": 2,
            "rope_theta": 1e7,
            "rotary_dim": 64,
            "norm_eps": 1e-6,
            "layer_types": (("linear_attention",) * 3 + ("full_attention",)) * 6,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 16,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "conv_kernel": 4,
            "use_tied_embedding": True,
        },
        {"num_experts": 256},  # Qwen3.5-MoE's experts
        "num_experts",
    ),
}


def changed(c: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    """``c`` with ``change``: in its ``text_config`` where it is a multimodal wrapper's
    (the text model's keys are there)."""
    if "text_config" in c and families.of_config(c).wraps(c):
        return {**c, "text_config": {**c["text_config"], **change}}
    return {**c, **change}


def test_every_family_has_a_real_config():
    assert sorted(REAL) == sorted(families.FAMILIES)


@pytest.mark.parametrize("name", sorted(REAL))
def test_the_published_config_maps_exactly(name):
    file, fields, _, _ = REAL[name]
    c = published(file)
    assert families.of_config(c) is families.family(name)
    assert families.family(name).config_fields(c) == fields


@pytest.mark.parametrize("name", sorted(REAL))
def test_one_foreign_field_is_one_line_naming_it(name):
    file, _, change, key = REAL[name]
    with pytest.raises(ConfigError) as e:
        families.family(name).config_fields(changed(published(file), change))
    message = str(e.value)
    assert message.startswith(f"{name} config: {key}=") and "\n" not in message
    assert e.value.hint and "model-families" in e.value.hint


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"num_local_experts": 8, "num_experts_per_tok": 2}, "num_local_experts"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"attention_multiplier": 0.5}, "attention_multiplier"),
        ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
        ({"layer_types": ["sliding_attention"] * 16}, "layer_types"),
        ({"sliding_window": 4096}, "sliding_window"),
    ],
)
def test_llama_refuses_what_its_layers_do_not_compute(change, key):
    with pytest.raises(ConfigError, match=f"llama config: {key}="):
        families.family("llama").config_fields({**published("llama-3.2-1b"), **change})


@pytest.mark.parametrize(
    "change",
    [
        {"attention_multiplier": 128**-0.5},  # Granite's key at Llama's own 1/sqrt(128)
        {"embedding_multiplier": 1.0, "logits_scaling": 1},
        {"num_local_experts": 1, "attention_bias": False, "mlp_bias": None},
        {"sliding_window": 131072},  # as long as the context
        {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}},
    ],
)
def test_neutral_values_are_taken(change):
    c = {**published("llama-3.1-8b"), **change}
    if "rope_parameters" in change:
        c.pop("rope_scaling")
    families.family("llama").config_fields(c)


def test_a_granite_like_family_on_llamas_mapping_is_refused_naming_a_multiplier():
    """As a contributor would register it: Llama's record under Granite's name; its own
    tiny config (multipliers left at 1.0) passes, the real one does not."""
    llama = families.family("llama")
    granite = dataclasses.replace(llama, model_type="granite", hf_architecture="GraniteForCausalLM")
    c = published("granite-3-2b-like")
    neutral = {**c, "embedding_multiplier": 1.0, "residual_multiplier": 1.0}
    neutral.update(logits_scaling=1.0, attention_multiplier=64**-0.5)
    granite.config_fields(neutral)
    with pytest.raises(ConfigError) as e:
        granite.config_fields(c)
    assert foreign.foreign_key(granite.reads, c) in (
        "embedding_multiplier",
        "residual_multiplier",
        "logits_scaling",
        "attention_multiplier",
    )
    assert str(e.value).startswith("granite config: ") and "multiplier" in str(e.value)


def test_a_family_that_reads_a_key_checks_it_itself():
    """Mistral reads its window (refusing a short one in its own words), Llama does not
    (the foreign check refuses it)."""
    c = {**published("mistral-7b-v0.3"), "sliding_window": 4096}
    with pytest.raises(ConfigError, match="Mistral config: sliding_window=4096 is shorter"):
        families.family("mistral").config_fields(c)
    assert "sliding_window" in families.family("mistral").reads
    assert "sliding_window" not in families.family("llama").reads


def test_every_key_a_family_reads_is_a_known_one():
    """``reads`` names keys of ``foreign.NEUTRAL`` only: a misspelt key there would let
    the real one through unchecked."""
    for fam in families.FAMILIES.values():
        assert fam.reads <= set(foreign.NEUTRAL), fam.model_type
