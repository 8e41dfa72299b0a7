"""What the Llama-shaped families (Llama, Mistral, Qwen2, Qwen3) share: the config
mapping onto Tunix's field names and the LoRA target paths of their layers."""

from __future__ import annotations

from typing import Any

from rlctl.core.errors import ConfigError

# qwix module paths, inside a decoder layer, of the Hugging Face projections LoRA can
# target (Llama and Qwen layers name them alike)
PROJECTION_PATHS = (
    ("q_proj", "attn/q_proj"),
    ("k_proj", "attn/k_proj"),
    ("v_proj", "attn/v_proj"),
    ("o_proj", "attn/o_proj"),
    ("gate_proj", "mlp/gate_proj"),
    ("up_proj", "mlp/up_proj"),
    ("down_proj", "mlp/down_proj"),
)


def rope_parameters(c: dict[str, Any]) -> dict[str, Any]:
    """The rope settings of a config.json: transformers 5 writes them as
    ``rope_parameters`` (``rope_theta``, ``rope_type``); older files as top-level
    ``rope_theta`` and ``rope_scaling``. Empty when neither says anything."""
    rope = c.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope:
        return rope
    out: dict[str, Any] = dict(c.get("rope_scaling") or {})
    if "rope_theta" in c:
        out["rope_theta"] = c["rope_theta"]
    return out


def decoder_fields(
    c: dict[str, Any], rope_theta: float, norm_eps: float, tying: str
) -> dict[str, Any]:
    """The fields Llama-shaped configs share, under Tunix's names; the defaults
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
        "rope_theta": rope_parameters(c).get("rope_theta", rope_theta),
        "norm_eps": c.get("rms_norm_eps", norm_eps),
        tying: bool(c.get("tie_word_embeddings", False)),
    }


def refuse(family: str, what: str, hint: str) -> ConfigError:
    """One clear line for a config the trainer's model would run differently."""
    return ConfigError(f"{family} config: {what}: not supported by the trainer", hint=hint)
