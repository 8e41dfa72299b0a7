"""Qwen3.5's text model (``Qwen3_5ForCausalLM``, ``model_type`` ``qwen3_5_text``):
rlctl's own model (``trainer/tunix_adapter/qwen3_5``: Tunix 0.1.7 has none). A
hybrid: of every four layers three are gated DeltaNet layers (linear attention with a
recurrent state, a short causal convolution and a gated RMS norm) and one is gated
full attention (an output gate per head, per-head query/key norms, a partial rotary
embedding). Its RMS norms scale by ``1 + w``.

Every setting is read with transformers' ``Qwen3_5TextConfig`` defaults
(transformers 5.12), so a config.json that omits a key means what transformers
builds from it. Every released dense Qwen3.5 checkpoint (Base included) is
multimodal (``Qwen3_5ForConditionalGeneration``, ``model_type`` ``qwen3_5``: a vision
tower beside this text model, and multi-token-prediction layers): it is read as this
family (``Wrapper``), its text model trained, and the rest written back unchanged.
"""

from __future__ import annotations

from typing import Any

from rlctl.core.errors import ConfigError
from rlctl.core.families.decoder import PROJECTION_PATHS
from rlctl.core.families.record import Family, Layout, Wrapper

LINEAR, FULL = "linear_attention", "full_attention"
# Qwen3_5TextConfig's defaults (transformers 5.12)
DEFAULTS: dict[str, Any] = {
    "head_dim": 256,
    "rms_norm_eps": 1e-6,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "tie_word_embeddings": False,
    "partial_rotary_factor": 0.25,
    "full_attention_interval": 4,
}
# the rope types whose text positions rotate as a plain rope does: transformers'
# multimodal rope gives each of its three sections the same position for text
_PLAIN_ROPE = ("default", "mrope")


def _get(c: dict[str, Any], key: str) -> Any:
    value = c.get(key)
    return DEFAULTS[key] if value is None else value


def layer_types(c: dict[str, Any]) -> list[str]:
    """config.json's layer types as transformers reads them: ``layer_types``, else
    every ``full_attention_interval``-th layer full attention, the others linear."""
    types = c.get("layer_types")
    if types is not None:
        return list(types)
    every = int(_get(c, "full_attention_interval"))
    return [LINEAR if (i + 1) % every else FULL for i in range(int(c["num_hidden_layers"]))]


def _refuse(what: str, hint: str = "use a stock Qwen3.5 dense text model") -> ConfigError:
    return ConfigError(
        f"Qwen3.5 config: {what}: not supported by the trainer's Qwen3.5 model",
        hint=hint,
    )


def rope(c: dict[str, Any]) -> tuple[float, float]:
    """(rope_theta, partial_rotary_factor) from ``rope_parameters`` (transformers 5)
    or the older top-level ``rope_theta``/``partial_rotary_factor`` and
    ``rope_scaling``; any rope type but plain (and the multimodal one, plain for text)
    refused."""
    params = c.get("rope_parameters")
    if not isinstance(params, dict):
        params = dict(c.get("rope_scaling") or {})
    kind = params.get("rope_type", params.get("type")) or "default"
    if kind not in _PLAIN_ROPE:
        raise _refuse(
            f"rope type {kind!r}",
            "the trainer's Qwen3.5 rotates with a plain rope only; use a model without "
            "rope scaling",
        )
    theta = params.get("rope_theta", c.get("rope_theta", 10_000.0))
    factor = params.get("partial_rotary_factor", c.get("partial_rotary_factor"))
    return float(theta), float(DEFAULTS["partial_rotary_factor"] if factor is None else factor)


def config_fields(c: dict[str, Any]) -> dict[str, Any]:
    """rlctl's Qwen3.5 ``ModelConfig`` fields from a ``qwen3_5_text`` config.json.
    Refused, with the key that says so: attention biases (transformers builds them,
    the trainer's model has none), an activation other than SiLU, layer types other
    than the two, a rope other than plain, a rotary part that is not a whole even
    number of dims."""
    layers = int(c["num_hidden_layers"])
    heads = int(c["num_attention_heads"])
    if c.get("attention_bias"):
        raise _refuse(f"attention_bias={c['attention_bias']!r}")
    if c.get("hidden_act", "silu") != "silu":
        raise _refuse(f"hidden_act={c['hidden_act']!r}")
    types = layer_types(c)
    if len(types) != layers or set(types) - {LINEAR, FULL}:
        raise _refuse(f"layer_types={c.get('layer_types')}")
    head_dim = int(_get(c, "head_dim"))
    theta, factor = rope(c)
    rotary = int(head_dim * factor)
    if not 0 < factor <= 1 or rotary % 2:
        raise _refuse(f"partial_rotary_factor={factor} (head_dim {head_dim})")
    k_heads = int(_get(c, "linear_num_key_heads"))
    v_heads = int(_get(c, "linear_num_value_heads"))
    if v_heads % k_heads:
        raise _refuse(
            f"linear_num_value_heads={v_heads} not a multiple of linear_num_key_heads={k_heads}"
        )
    return {
        "num_layers": layers,
        "vocab_size": int(c["vocab_size"]),
        "embed_dim": int(c["hidden_size"]),
        "hidden_dim": int(c["intermediate_size"]),
        "num_heads": heads,
        "head_dim": head_dim,
        "num_kv_heads": int(c.get("num_key_value_heads") or heads),
        "rope_theta": theta,
        "rotary_dim": rotary,
        "norm_eps": float(_get(c, "rms_norm_eps")),
        "layer_types": tuple(types),
        "linear_num_key_heads": k_heads,
        "linear_num_value_heads": v_heads,
        "linear_key_head_dim": int(_get(c, "linear_key_head_dim")),
        "linear_value_head_dim": int(_get(c, "linear_value_head_dim")),
        "conv_kernel": int(_get(c, "linear_conv_kernel_dim")),
        "use_tied_embedding": bool(_get(c, "tie_word_embeddings")),
    }


def tiny(config: dict[str, Any]) -> dict[str, Any]:
    """A tiny Qwen3.5 with what the real ones have: linear-attention layers with more
    value heads than key heads, a gated full-attention layer with a partial rotary
    embedding and fewer key/value heads, a rope base of 1e7; untied (the test models
    learn), where the small released ones tie."""
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    return {
        "num_hidden_layers": 4,
        "layer_types": [LINEAR, LINEAR, LINEAR, FULL],
        "head_dim": head_dim,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10_000_000.0,
            "partial_rotary_factor": 0.25,
        },
    }


FAMILY = Family(
    model_type="qwen3_5_text",
    hf_architecture="Qwen3_5ForCausalLM",
    tunix_package="rlctl.core.trainer.tunix_adapter.qwen3_5",
    model_class="Qwen3_5",
    map_config=config_fields,
    refuses=(
        "attention biases",
        "an activation other than SiLU",
        "layer types other than `linear_attention` and `full_attention`",
        "a rope other than plain (the multimodal rope is plain for text)",
        "mixture-of-experts blocks (Qwen3.5-MoE is another model type)",
    ),
    reads=frozenset(
        {"rope_parameters", "rope_scaling", "partial_rotary_factor", "layer_types"}
        | {"attention_bias", "hidden_act"}
    ),
    layout=Layout(attention="hybrid", qk_norm=True),
    # q/k/v/o in the full-attention layers only (one in four); the linear-attention
    # layers' own projections by their names (not in the default targets: name them)
    lora_paths=(
        *PROJECTION_PATHS,
        ("in_proj_qkv", "linear_attn/in_proj_qkv"),
        ("in_proj_z", "linear_attn/in_proj_z"),
        ("out_proj", "linear_attn/out_proj"),
    ),
    wrapper=Wrapper(
        model_type="qwen3_5",
        architecture="Qwen3_5ForConditionalGeneration",
        prefix="model.language_model.",
    ),
    tiny=tiny,
)
