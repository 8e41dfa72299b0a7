"""Qwen3 dense models (``Qwen3ForCausalLM``): Tunix's ``qwen3`` model; per-head RMS
norms of queries and keys. Runs through Tunix's whole-model call."""

from __future__ import annotations

from typing import Any

from rlctl.core.errors import ConfigError
from rlctl.core.families.decoder import PROJECTION_PATHS, decoder_fields
from rlctl.core.families.record import Family, Layout


def config_fields(c: dict[str, Any]) -> dict[str, Any]:
    out = decoder_fields(c, 1_000_000, 1e-6, "use_tied_embedding")
    # pitfall: Tunix 0.1.7's Qwen3 attention calls apply_rope without the config's
    # rope_theta, so it always runs 1e6 (every released Qwen3 dense model's value);
    # another value would train a different model than transformers runs
    if float(out["rope_theta"]) != 1e6:
        raise ConfigError(
            f"Qwen3 config: rope_theta={out['rope_theta']} is not "
            "supported (the trainer's Qwen3 model always uses 1000000)"
        )
    return out


def tiny(config: dict[str, Any]) -> dict[str, Any]:
    return {"rope_theta": 1e6}  # every Qwen3's (and the only one Tunix runs)


FAMILY = Family(
    model_type="qwen3",
    hf_architecture="Qwen3ForCausalLM",
    tunix_package="qwen3",
    model_class="Qwen3",
    map_config=config_fields,
    refuses=("a `rope_theta` other than 1e6 (Tunix's Qwen3 ignores the field)",),
    layout=Layout(qk_norm=True),
    lora_paths=PROJECTION_PATHS,
    tiny=tiny,
)
