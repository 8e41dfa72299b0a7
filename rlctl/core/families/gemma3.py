"""Gemma 3's text model (``Gemma3ForCausalLM``, ``model_type`` ``gemma3_text``):
Tunix's ``gemma3`` model; stacked attention einsums, four norms per layer, tied
embeddings. Runs through Tunix's whole-model call; LoRA is refused (qwix cannot
split its stacked einsums by projection)."""

from __future__ import annotations

from typing import Any

from rlctl.core.errors import ConfigError
from rlctl.core.families.record import Family, Layout

# Gemma 3's layer pattern: 5 sliding-window layers, then 1 global (Tunix's
# GEMMA3_ATTENTION_PATTERN, of this length; tested against it)
GEMMA3_PATTERN_LENGTH = 6


def layer_types(layers: int) -> list[str]:
    """Gemma 3's attention pattern over ``layers`` layers, in config.json's names."""
    return [
        "full_attention" if (i + 1) % GEMMA3_PATTERN_LENGTH == 0 else "sliding_attention"
        for i in range(layers)
    ]


def config_fields(c: dict[str, Any]) -> dict[str, Any]:
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
    if c.get("layer_types") not in (None, layer_types(layers)):
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


def tiny(config: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's own settings where transformers' defaults differ from what Tunix runs
    (query scaling by the head dim, no soft-capping), its pattern and tied head."""
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    return {
        "tie_word_embeddings": True,
        "rms_norm_eps": 1e-6,
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": head_dim,
        "sliding_window": 512,
        "rope_local_base_freq": 10000.0,
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "rope_scaling": None,
        "layer_types": layer_types(config["num_hidden_layers"]),
    }


FAMILY = Family(
    model_type="gemma3_text",
    hf_architecture="Gemma3ForCausalLM",
    tunix_package="gemma3",
    model_class="Gemma3",
    map_config=config_fields,
    refuses=(
        "logit soft-capping",
        "a layer pattern other than 5 sliding-window layers then 1 global",
        "an RMS-norm epsilon other than 1e-6",
        "an activation other than `gelu_pytorch_tanh`",
        "a query scaling other than 1/sqrt(head_dim) or 1/sqrt(hidden/heads)",
        "a rope scaling other than linear",
    ),
    reads=frozenset(
        {"rope_scaling", "rope_parameters", "sliding_window", "layer_types"}
        | {"attn_logit_softcapping", "final_logit_softcapping"}
    ),
    safetensors_loader="params_safetensors",
    layout=Layout(attention="stacked_einsums"),
    tied_by_default=True,
    enum_fields=(("query_pre_attn_norm", "QueryPreAttentionNormalisation"),),
    refused_aliases=("gemma3",),
    tiny=tiny,
)
