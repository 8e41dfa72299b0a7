"""Gemma 4's text model (``Gemma4ForCausalLM``, ``model_type`` ``gemma4_text``):
Tunix's ``gemma4`` model. Sliding-window and global layers with their own head size
(and, for the larger models, their own key/value heads with keys equal to values),
per-head query/key norms and an unscaled value norm, partial ("proportional") rotary
embedding on the global layers, per-layer input embeddings (PLE: E2B, E4B), the last
layers reusing earlier layers' keys and values (KV sharing), a per-layer scalar and
logit soft-capping. Runs through Tunix's layers (its call returns soft-capped logits,
so rlctl runs the same layers up to the final norm: ``tunix_adapter/logprobs``); LoRA
is refused: Tunix stacks keys and values into one ``kv_einsum`` (or, where keys are
values, one ``k_einsum``), which qwix cannot split by projection. (Its q/o einsums and
MLP projections are separate modules; adapters on those alone are not built here.)

Every setting is read with transformers' ``Gemma4TextConfig`` defaults (transformers
5.12), so a config.json that omits a key means what transformers builds from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlctl.core.errors import ConfigError
from rlctl.core.families.record import Family, Layout

# transformers' Gemma4TextConfig: a layer pattern of 5 sliding-window layers, then 1
# global, the last layer always global
PATTERN_LENGTH = 6
EPS = 1e-6  # Tunix's RMS norm epsilon (fixed in its RMSNorm)
DEFAULT_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    "full_attention": {
        "rope_type": "proportional",
        "partial_rotary_factor": 0.25,
        "rope_theta": 1_000_000.0,
    },
}


def layer_types(layers: int) -> list[str]:
    """transformers' default pattern over ``layers`` layers (the last one global)."""
    types = [
        "sliding_attention" if (i + 1) % PATTERN_LENGTH else "full_attention" for i in range(layers)
    ]
    types[-1] = "full_attention"
    return types


def types_of(c: dict[str, Any]) -> list[str]:
    """config.json's layer types as transformers reads them (its default pattern when
    absent; the last layer forced global, as Gemma4TextConfig does)."""
    types = list(c.get("layer_types") or layer_types(int(c["num_hidden_layers"])))
    if types:
        types[-1] = "full_attention"
    return types


@dataclass(frozen=True)
class LayerShape:
    """One decoder layer's attention and MLP sizes, as transformers builds it."""

    glob: bool  # a global (full-attention) layer
    head_dim: int
    kv_heads: int
    k_eq_v: bool  # keys are values (no v_proj): the larger models' global layers
    shared: bool  # reuses an earlier layer's keys and values (no k/v projections)
    ffn: int  # its MLP's hidden size


def layer_shapes(c: dict[str, Any]) -> list[LayerShape]:
    """Every layer's sizes from config.json, with transformers' defaults
    (``Gemma4TextAttention``, ``Gemma4TextMLP``)."""
    layers = int(c["num_hidden_layers"])
    heads = int(c["num_attention_heads"])
    head_dim = int(c.get("head_dim") or 256)
    global_dim = int(c.get("global_head_dim", 512) or head_dim)
    kv = int(c.get("num_key_value_heads") or heads)
    k_eq_v = bool(c.get("attention_k_eq_v", False))
    shared_n = int(c.get("num_kv_shared_layers") or 0)
    first_shared = layers - shared_n
    double = bool(c.get("use_double_wide_mlp", False))
    ffn = int(c["intermediate_size"])
    out = []
    for i, t in enumerate(types_of(c)):
        glob = t == "full_attention"
        alt = k_eq_v and glob
        shared = i >= first_shared >= 0 and shared_n > 0
        out.append(
            LayerShape(
                glob=glob,
                head_dim=global_dim if glob else head_dim,
                kv_heads=int(c.get("num_global_key_value_heads") or kv) if alt else kv,
                k_eq_v=alt,
                shared=shared,
                ffn=ffn * 2 if double and i >= first_shared > 0 else ffn,
            )
        )
    return out


def ple_dim(c: dict[str, Any]) -> int:
    """The per-layer input embedding's size per layer (0: none)."""
    return int(c.get("hidden_size_per_layer_input", 256) or 0)


def _refuse(what: str) -> ConfigError:
    return ConfigError(
        f"Gemma 4 config: {what}: not supported by the trainer's Gemma 4 model (Tunix)",
        hint="use a stock Gemma 4 text model (E2B, E4B or 31B)",
    )


def _theta(params: dict[str, Any], kind: str) -> int:
    theta = float(params.get("rope_theta", 0))
    if theta <= 0 or theta != int(theta):
        raise _refuse(f"rope_parameters.{kind}.rope_theta={params.get('rope_theta')}")
    return int(theta)


def _rope(c: dict[str, Any], shapes: list[LayerShape]) -> dict[str, Any]:
    """Tunix's per-type rope fields from transformers' ``rope_parameters``: sliding
    layers a plain rope; global layers a plain or a proportional one (its rotated
    fraction and position scale)."""
    rope = c.get("rope_parameters") or DEFAULT_ROPE
    if not isinstance(rope, dict) or not all(isinstance(v, dict) for v in rope.values()):
        raise _refuse(f"rope_parameters={rope!r} (one per layer type expected)")
    local: dict[str, Any] = rope.get("sliding_attention") or {}
    full: dict[str, Any] = rope.get("full_attention") or {}
    out: dict[str, Any] = {}
    if any(not s.glob for s in shapes):
        if local.get("rope_type", "default") != "default":
            raise _refuse(f"rope_parameters.sliding_attention={local}")
        out["local_base_frequency"] = _theta(local, "sliding_attention")
    out["local_rope_proportion"] = 1.0
    out["local_scale_factor"] = 1.0
    kind = full.get("rope_type", "default")
    if kind == "proportional":
        proportion = float(full.get("partial_rotary_factor", 1.0))
        factor = float(full.get("factor", 1.0))
        if not 0.0 <= proportion <= 1.0 or factor < 1.0:
            raise _refuse(f"rope_parameters.full_attention={full}")
        if not c.get("global_head_dim", 512):
            # transformers then sizes the rope by hidden/heads, not the head
            raise _refuse("proportional rope without global_head_dim")
    elif kind == "default":
        # transformers sizes a plain rope by head_dim, whatever the global head size
        if any(s.glob and s.head_dim != int(c.get("head_dim") or 256) for s in shapes):
            raise _refuse("a plain rope on global layers whose head size is not head_dim")
        proportion, factor = 1.0, 1.0
    else:
        raise _refuse(f"rope_parameters.full_attention={full}")
    out["global_base_frequency"] = _theta(full, "full_attention")
    out["global_rope_proportion"] = proportion
    out["global_scale_factor"] = factor
    return out


def config_fields(c: dict[str, Any]) -> dict[str, Any]:
    """Tunix's Gemma 4 from a ``gemma4_text`` config.json. What Tunix's model computes
    otherwise than transformers is refused here with the field that says so, rather
    than trained as another model: mixture-of-experts blocks (26B-A4B), bidirectional
    attention, another RMS-norm epsilon or activation, untied embeddings, a per-layer
    embedding vocabulary other than the model's, KV sharing that does not reuse the
    last two unshared layers (Tunix's rule), rope other than transformers' Gemma 4
    ones."""
    layers = int(c["num_hidden_layers"])
    heads = int(c["num_attention_heads"])
    if c.get("enable_moe_block") or (c.get("num_experts") or 0) > 1:
        # Tunix (0.1.7) routes tokens on the MoE input after pre_feedforward_layernorm_2
        # (gemma4/model.py DecoderLayer.block, moe.py MoERagged.__call__), transformers
        # (5.12) on the residual before it (Gemma4TextDecoderLayer.forward): other
        # experts are chosen. A tiny MoE model (4 experts, top 2): logits 0.39 apart
        # (of logits up to 0.69, greedy tokens equal at 7 of 12 positions); with
        # Tunix's router fed the residual instead, 2.1e-6
        raise _refuse(
            f"enable_moe_block={c.get('enable_moe_block')} (mixture of experts: Tunix's "
            "router reads the normed input, transformers' the residual)"
        )
    if c.get("moe_intermediate_size"):
        raise _refuse(f"moe_intermediate_size={c['moe_intermediate_size']}")
    if c.get("use_bidirectional_attention") is not None:
        raise _refuse(f"use_bidirectional_attention={c['use_bidirectional_attention']!r}")
    if abs(float(c.get("rms_norm_eps", EPS)) - EPS) > 1e-12:
        raise _refuse(f"rms_norm_eps={c['rms_norm_eps']} (Tunix uses 1e-6)")
    if c.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise _refuse(f"hidden_activation={c['hidden_activation']}")
    if not c.get("tie_word_embeddings", True):
        raise _refuse("tie_word_embeddings=false (Tunix's Gemma 4 decodes with the embedding)")
    types = types_of(c)
    if len(types) != layers or set(types) - {"sliding_attention", "full_attention"}:
        raise _refuse(f"layer_types={c.get('layer_types')}")
    shapes = layer_shapes(c)
    vocab = int(c["vocab_size"])
    per_layer = ple_dim(c)
    if per_layer and int(c.get("vocab_size_per_layer_input", 262_144)) != vocab:
        raise _refuse(
            f"vocab_size_per_layer_input={c.get('vocab_size_per_layer_input', 262_144)} "
            f"(Tunix's per-layer embedding has vocab_size={vocab} rows)"
        )
    shared_n = int(c.get("num_kv_shared_layers") or 0)
    first = layers - shared_n
    frac = 0.0
    if shared_n:
        # transformers: a shared layer reuses the last unshared layer of its type;
        # Tunix: the last unshared layer (global layers) or the one before (sliding)
        if (
            first < 2
            or types[first - 1] != "full_attention"
            or types[first - 2] != "sliding_attention"
        ):
            raise _refuse(
                f"num_kv_shared_layers={shared_n} with layer {first - 1} not global or "
                f"layer {first - 2} not sliding (Tunix shares those two)"
            )
        # Tunix counts unshared layers as int(L - frac * L): half a layer of margin
        frac = (shared_n - 0.5) / layers
    double = bool(c.get("use_double_wide_mlp", False)) and shared_n > 0
    k_eq_v = bool(c.get("attention_k_eq_v", False))
    window = c.get("sliding_window", 512)
    if any(not s.glob for s in shapes) and (not isinstance(window, int) or window < 1):
        raise _refuse(f"sliding_window={window}")
    return {
        "num_layers": layers,
        "num_embed": vocab,
        "embed_dim": int(c["hidden_size"]),
        "hidden_dim": int(c["intermediate_size"]),
        "num_heads": heads,
        "head_dim": int(c.get("head_dim") or 256),
        "num_kv_heads": int(c.get("num_key_value_heads") or heads),
        "final_logit_softcap": c.get("final_logit_softcapping"),
        "sliding_window_size": window,
        "per_layer_input_dim": per_layer,
        # Tunix gives global layers these heads whenever set; transformers only when
        # keys are values
        "num_global_kv_heads": shapes[-1].kv_heads if k_eq_v else None,
        "global_key_size": int(c.get("global_head_dim", 512) or c.get("head_dim") or 256),
        "attention_pattern": tuple(
            "GLOBAL" if t == "full_attention" else "LOCAL_SLIDING" for t in types
        ),
        "frac_shared_layers": frac,
        "k_eq_v_global": k_eq_v,
        "override_kv_shared_ffw_hidden": int(c["intermediate_size"]) * 2 if double else None,
        **_rope(c, shapes),
    }


def tiny(config: dict[str, Any]) -> dict[str, Any]:
    """A tiny Gemma 4 with every feature of the small ones: sliding and global layers
    with their own head sizes and a partial rotary embedding, per-layer inputs, the
    last layers sharing keys and values (their MLP double-wide), soft-capping, a
    window shorter than the test prompts; tied, as every Gemma 4."""
    heads = config["num_attention_heads"]
    head_dim = config["hidden_size"] // heads
    return {
        "num_hidden_layers": 6,
        "layer_types": ["sliding_attention", "full_attention"] * 3,
        "head_dim": head_dim,
        "global_head_dim": head_dim * 2,
        "num_key_value_heads": 1,
        "tie_word_embeddings": True,
        "rms_norm_eps": 1e-6,
        "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": 4,
        "final_logit_softcapping": 30.0,
        "hidden_size_per_layer_input": 8,
        "vocab_size_per_layer_input": config["vocab_size"],
        "num_kv_shared_layers": 2,
        "use_double_wide_mlp": True,
        "attention_k_eq_v": False,
        "enable_moe_block": False,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {
                "rope_type": "proportional",
                "partial_rotary_factor": 0.25,
                "rope_theta": 1_000_000.0,
            },
        },
    }


FAMILY = Family(
    model_type="gemma4_text",
    hf_architecture="Gemma4ForCausalLM",
    tunix_package="gemma4",
    model_class="Gemma4",
    map_config=config_fields,
    refuses=(
        "mixture-of-experts blocks (26B-A4B: Tunix routes on another input)",
        "bidirectional attention",
        "an RMS-norm epsilon other than 1e-6",
        "an activation other than `gelu_pytorch_tanh`",
        "untied embeddings",
        "a per-layer-input vocabulary other than the model's",
        "KV sharing from other layers than the last unshared global and sliding ones",
        "a rope other than plain (sliding layers) and plain or proportional (global)",
    ),
    reads=frozenset(
        {"rope_parameters", "sliding_window", "layer_types", "final_logit_softcapping"}
        | {"num_experts", "moe_intermediate_size"}
    ),
    safetensors_loader="params_safetensors",
    layout=Layout(attention="per_layer"),
    tied_by_default=True,
    enum_fields=(("attention_pattern", "AttentionType"),),
    refused_aliases=("gemma4",),
    tiny=tiny,
)
