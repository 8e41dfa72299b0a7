"""Qwen2 and Qwen2.5 (``Qwen2ForCausalLM``): Tunix's ``qwen2`` model; biases on the
query, key and value projections. Runs through Tunix's whole-model call.

Tunix's Qwen2 attends to every earlier position. A config with ``use_sliding_window``
(off in every released Qwen2 and Qwen2.5) has the layers from ``max_window_layers`` on
attend only within ``sliding_window``: refused where that window is shorter than the
context, as for Mistral (#53: it was taken, and would train another attention)."""

from __future__ import annotations

from typing import Any

from rlctl.core.families.decoder import PROJECTION_PATHS, decoder_fields, refuse
from rlctl.core.families.record import Family, Layout


def config_fields(c: dict[str, Any]) -> dict[str, Any]:
    layers = int(c.get("num_hidden_layers") or 0)
    types = c.get("layer_types")
    if isinstance(types, list):
        windowed = "sliding_attention" in types
    else:  # transformers' rule: from max_window_layers on, when use_sliding_window
        windowed = bool(c.get("use_sliding_window")) and int(
            c.get("max_window_layers", layers) or 0
        ) < max(layers, 1)
    window = c.get("sliding_window")
    context = int(c.get("max_position_embeddings") or 32768)
    if windowed and window is not None and int(window) < context:
        raise refuse(
            "Qwen2",
            f"a sliding window of {window} (use_sliding_window) shorter than "
            f"max_position_embeddings={context} (the trainer's attention has no window)",
            "use a Qwen2 config without use_sliding_window (every released Qwen2 and "
            "Qwen2.5 has it off)",
        )
    return decoder_fields(c, 1_000_000, 1e-6, "use_tied_embedding")


FAMILY = Family(
    model_type="qwen2",
    hf_architecture="Qwen2ForCausalLM",
    tunix_package="qwen2",
    model_class="Qwen2",
    map_config=config_fields,
    refuses=("a sliding window (`use_sliding_window`, sliding layers) shorter than the context",),
    reads=frozenset({"sliding_window", "use_sliding_window", "layer_types"}),
    layout=Layout(qkv_bias=True),
    lora_paths=PROJECTION_PATHS,
)
