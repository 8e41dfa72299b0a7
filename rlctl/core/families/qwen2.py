"""Qwen2 and Qwen2.5 (``Qwen2ForCausalLM``): Tunix's ``qwen2`` model; biases on the
query, key and value projections. Runs through Tunix's whole-model call."""

from __future__ import annotations

from typing import Any

from rlctl.core.families.decoder import PROJECTION_PATHS, decoder_fields
from rlctl.core.families.record import Family, Layout


def config_fields(c: dict[str, Any]) -> dict[str, Any]:
    return decoder_fields(c, 1_000_000, 1e-6, "use_tied_embedding")


FAMILY = Family(
    model_type="qwen2",
    hf_architecture="Qwen2ForCausalLM",
    tunix_package="qwen2",
    model_class="Qwen2",
    config_fields=config_fields,
    layout=Layout(qkv_bias=True),
    lora_paths=PROJECTION_PATHS,
)
