"""The model families rlctl trains and converts: one entry per family, read by both
the trainer (``trainer/tunix_adapter``: which Tunix model, how config.json maps to
its ``ModelConfig``) and the converter (``layout.py``: where each Hugging Face
tensor goes). A new family is one ``Family`` in ``FAMILIES``.

Pure Python, no jax and no Tunix: ``checkpoints/`` sits below ``trainer/`` in the
import layers, and the conversion command must not load a framework. The config
mappings therefore return plain keyword arguments; the trainer turns them into
Tunix's ``ModelConfig`` (and enum names into its enum values).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlctl.core.errors import ConfigError


@dataclass(frozen=True)
class Family:
    """One model family: its ``model_type``, Tunix model and tensor layout."""

    model_type: str
    tunix_package: str  # tunix.models.<package>
    model_class: str  # the Tunix model class (to restore a trainer checkpoint into)
    # config.json -> keyword arguments of the package's ModelConfig (raises ConfigError
    # for what the Tunix model cannot express)
    config_fields: Callable[[dict[str, Any]], dict[str, Any]]
    safetensors_loader: str = "params"  # tunix.models.<package>.<loader>
    layout: str = "llama"  # "llama": per-projection [D, H, hd]; "gemma": stacked einsums
    qkv_bias: bool = False  # q/k/v projections have biases (Qwen2)
    qk_norm: bool = False  # per-head RMS norms of queries and keys (Qwen3)
    tied_by_default: bool = False  # tie_word_embeddings when config.json omits it
    # the qwix module path (inside a decoder layer) of each Hugging Face projection
    # LoRA can target; empty: LoRA is refused for the family
    lora_paths: tuple[tuple[str, str], ...] = ()
    # fields whose value is the name of a member of a Tunix enum: field -> enum class
    enum_fields: tuple[tuple[str, str], ...] = ()


def _decoder_fields(
    c: dict[str, Any], rope_theta: float, norm_eps: float, tying: str
) -> dict[str, Any]:
    """The fields Llama and Qwen configs share, under Tunix's names; the defaults
    (transformers' for each family) and Tunix's name for tied embeddings differ."""
    heads = c["num_attention_heads"]
    return {
        "num_layers": c["num_hidden_layers"],
        "vocab_size": c["vocab_size"],
        "embed_dim": c["hidden_size"],
        "hidden_dim": c["intermediate_size"],
        "num_heads": heads,
        "head_dim": c.get("head_dim") or c["hidden_size"] // heads,
        "num_kv_heads": c.get("num_key_value_heads", heads),
        "rope_theta": c.get("rope_theta", rope_theta),
        "norm_eps": c.get("rms_norm_eps", norm_eps),
        tying: bool(c.get("tie_word_embeddings", False)),
    }


def _llama_fields(c: dict[str, Any]) -> dict[str, Any]:
    return _decoder_fields(c, 10000.0, 1e-5, "weight_tying")


def _qwen_fields(family: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def fields(c: dict[str, Any]) -> dict[str, Any]:
        out = _decoder_fields(c, 1_000_000, 1e-6, "use_tied_embedding")
        # pitfall: Tunix 0.1.7's Qwen3 attention calls apply_rope without the config's
        # rope_theta, so it always runs 1e6 (every released Qwen3 dense model's value);
        # another value would train a different model than transformers runs
        if family == "qwen3" and float(out["rope_theta"]) != 1e6:
            raise ConfigError(
                f"Qwen3 config: rope_theta={out['rope_theta']} is not "
                "supported (the trainer's Qwen3 model always uses 1000000)"
            )
        return out

    return fields


# Gemma 3's layer pattern: 5 sliding-window layers, then 1 global (Tunix's
# GEMMA3_ATTENTION_PATTERN, of this length; tested against it)
GEMMA3_PATTERN_LENGTH = 6


def _gemma3_fields(c: dict[str, Any]) -> dict[str, Any]:
    """Tunix's Gemma 3 from a ``gemma3_text`` config.json. What Tunix's model cannot
    express is refused here with the field that says so, rather than trained with
    different logits than transformers computes: logit soft-capping, a layer pattern
    other than Gemma 3's (5 sliding-window layers, then 1 global), another RMS norm
    epsilon (Tunix's is fixed) or an unusual query scaling."""

    def refuse(what: str) -> ConfigError:
        return ConfigError(
            f"Gemma 3 config: {what}: not supported by the trainer's Gemma 3 model (Tunix)",
            hint="use a stock Gemma 3 text model",
        )

    for cap in ("final_logit_softcapping", "attn_logit_softcapping"):
        if c.get(cap) is not None:
            raise refuse(f"{cap}={c[cap]}")
    heads, hidden = c["num_attention_heads"], c["hidden_size"]
    head_dim = c.get("head_dim") or hidden // heads
    layers = c["num_hidden_layers"]
    pattern = [
        "full_attention" if (i + 1) % GEMMA3_PATTERN_LENGTH == 0 else "sliding_attention"
        for i in range(layers)
    ]
    if c.get("layer_types") not in (None, pattern):
        raise refuse("layer_types other than 5 sliding-window layers then 1 global")
    if abs(float(c.get("rms_norm_eps", 1e-6)) - 1e-6) > 1e-12:
        raise refuse(f"rms_norm_eps={c['rms_norm_eps']} (Tunix uses 1e-6)")
    if c.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise refuse(f"hidden_activation={c['hidden_activation']}")
    scalar = c.get("query_pre_attn_scalar", head_dim)
    if scalar == head_dim:
        norm = "BY_ONE_OVER_SQRT_HEAD_DIM"
    elif scalar == hidden // heads:
        norm = "BY_ONE_OVER_SQRT_EMBED_DIM_DIV_NUM_HEADS"
    else:
        raise refuse(f"query_pre_attn_scalar={scalar}")
    # transformers 5 writes rope_parameters per layer type; older files rope_theta etc.
    rope = c.get("rope_parameters") or {}
    full = rope.get("full_attention", {}) if isinstance(rope, dict) else {}
    local = rope.get("sliding_attention", {}) if isinstance(rope, dict) else {}
    scaling = c.get("rope_scaling") or (full if full.get("rope_type") == "linear" else None)
    factor = 1.0
    if scaling:
        if scaling.get("rope_type", scaling.get("type")) != "linear":
            raise refuse(f"rope_scaling={scaling}")
        factor = float(scaling["factor"])
    return {
        "num_layers": layers,
        "num_embed": c["vocab_size"],
        "embed_dim": hidden,
        "hidden_dim": c["intermediate_size"],
        "num_heads": heads,
        "head_dim": head_dim,
        "num_kv_heads": c.get("num_key_value_heads", heads),
        "sliding_window_size": c.get("sliding_window", 4096),
        "local_base_frequency": int(local.get("rope_theta", c.get("rope_local_base_freq", 10_000))),
        "global_base_frequency": int(full.get("rope_theta", c.get("rope_theta", 1_000_000))),
        "global_scale_factor": factor,
        "query_pre_attn_norm": norm,
    }


# qwix module paths, inside a decoder layer, of the Hugging Face projections LoRA can
# target (Llama and Qwen layers name them alike)
_PROJ_PATHS = (
    ("q_proj", "attn/q_proj"),
    ("k_proj", "attn/k_proj"),
    ("v_proj", "attn/v_proj"),
    ("o_proj", "attn/o_proj"),
    ("gate_proj", "mlp/gate_proj"),
    ("up_proj", "mlp/up_proj"),
    ("down_proj", "mlp/down_proj"),
)

FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Family("llama", "llama3", "Llama3", _llama_fields, lora_paths=_PROJ_PATHS),
        Family(
            "qwen2", "qwen2", "Qwen2", _qwen_fields("qwen2"), qkv_bias=True, lora_paths=_PROJ_PATHS
        ),
        Family(
            "qwen3", "qwen3", "Qwen3", _qwen_fields("qwen3"), qk_norm=True, lora_paths=_PROJ_PATHS
        ),
        Family(
            "gemma3_text",
            "gemma3",
            "Gemma3",
            _gemma3_fields,
            safetensors_loader="params_safetensors",
            layout="gemma",
            tied_by_default=True,
            enum_fields=(("query_pre_attn_norm", "QueryPreAttentionNormalisation"),),
        ),
    )
}

# model_type values that name a family's multimodal sibling, refused with a pointer
ALIASES = {"gemma3": "gemma3_text"}


def family(model_type: Any) -> Family:
    """The family of a config.json's ``model_type``, or one clear line."""
    supported = ", ".join(FAMILIES)
    if model_type in ALIASES:
        raise ConfigError(
            f"model type {model_type!r} (multimodal) is not supported; its text model "
            f"'{ALIASES[model_type]}' is",
            hint=f"supported model types: {supported}",
        )
    if model_type not in FAMILIES:
        raise ConfigError(
            f"model type {model_type!r} is not supported",
            hint=f"supported model types: {supported}",
        )
    return FAMILIES[model_type]
