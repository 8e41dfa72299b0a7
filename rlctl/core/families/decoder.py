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


# config.json's Llama 3 rope fields, in the order the trainer's rope reads them
# (trainer/tunix_adapter/rope.py: transformers' ``_compute_llama3_parameters``)
LLAMA3_ROPE_FIELDS = (
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
)


def rope_type(c: dict[str, Any]) -> str:
    """The config's ``rope_type`` (older files: ``type``), ``default`` when unsaid."""
    rope = rope_parameters(c)
    return str(rope.get("rope_type", rope.get("type")) or "default")


def llama3_rope_scaling(c: dict[str, Any], family: str) -> tuple[float, ...] | None:
    """Llama 3's rope scaling (``LLAMA3_ROPE_FIELDS``' values) of a config whose
    ``rope_type`` is ``llama3`` (Llama 3.1, 3.2, 3.3); None for plain rope. Any other
    rope type is refused with one line: the trainer's rope would rotate at other
    frequencies than the checkpoint was trained with (issue #52)."""
    kind = rope_type(c)
    if kind == "default":
        return None
    if kind != "llama3":
        raise refuse(
            family,
            f"rope type {kind!r}",
            "the trainer's rope has plain and Llama 3 ('llama3') scaling only; "
            "use a model without this rope scaling",
        )
    rope = rope_parameters(c)
    missing = [k for k in LLAMA3_ROPE_FIELDS if rope.get(k) is None]
    if missing:
        raise refuse(
            family,
            f"rope type 'llama3' without {', '.join(missing)}",
            "copy or download the model's config.json again",
        )
    factor, low, high, original = (float(rope[k]) for k in LLAMA3_ROPE_FIELDS)
    if not (factor >= 1 and 0 < low < high and original > 0):
        raise refuse(
            family,
            f"rope scaling factor={factor:g}, low_freq_factor={low:g}, "
            f"high_freq_factor={high:g}, original_max_position_embeddings={original:g}",
            "Llama 3's rope needs factor >= 1 and 0 < low_freq_factor < high_freq_factor",
        )
    return (factor, low, high, original)


def refuse(family: str, what: str, hint: str) -> ConfigError:
    """One clear line for a config the trainer's model would run differently."""
    return ConfigError(f"{family} config: {what}: not supported by the trainer", hint=hint)
