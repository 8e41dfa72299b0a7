"""Mistral (``MistralForCausalLM``): Llama's architecture (RMS norms, grouped-query
attention with rope, a SiLU-gated MLP, the same tensor names), so Tunix's ``llama3``
model, with all of rlctl's code for it (Tunix has no Mistral of its own).

The one difference is the sliding attention window. Tunix's Llama attends to every
earlier position, which is Mistral's attention exactly while no sequence is longer
than the window. rlctl never runs a sequence longer than the model's context
(``max_position_embeddings``), so a config whose window is unset (Mistral v0.2 and
later) or at least that context is taken; a shorter window (Mistral 7B v0.1: 4096 of
32768) is refused, since a long rollout would attend where Mistral does not.
"""

from __future__ import annotations

from typing import Any

from rlctl.core.families.decoder import PROJECTION_PATHS, decoder_fields, refuse, rope_parameters
from rlctl.core.families.llama import LLAMA3_CAPABILITIES
from rlctl.core.families.record import Family

# transformers' MistralConfig defaults, for keys a config.json leaves out
_DEFAULT_WINDOW = 4096
_DEFAULT_CONTEXT = 4096 * 32
_HINT = "use a Mistral without a sliding window (v0.2 or later)"


def config_fields(c: dict[str, Any]) -> dict[str, Any]:
    window = c.get("sliding_window", _DEFAULT_WINDOW)
    context = int(c.get("max_position_embeddings") or _DEFAULT_CONTEXT)
    if window is not None and int(window) < context:
        raise refuse(
            "Mistral",
            f"sliding_window={window} is shorter than max_position_embeddings={context} "
            "(the trainer's attention has no window)",
            _HINT,
        )
    rope_type = rope_parameters(c).get("rope_type", rope_parameters(c).get("type", "default"))
    if rope_type != "default":
        raise refuse("Mistral", f"rope type {rope_type!r}", "use a stock Mistral model")
    return decoder_fields(c, 10000.0, 1e-6, "weight_tying")


def tiny(config: dict[str, Any]) -> dict[str, Any]:
    """A window as long as the context: transformers applies it, Tunix has none, and
    the two agree (what ``config_fields`` relies on)."""
    return {"sliding_window": config["max_position_embeddings"]}


FAMILY = Family(
    model_type="mistral",
    hf_architecture="MistralForCausalLM",
    tunix_package="llama3",
    model_class="Llama3",
    map_config=config_fields,
    refuses=("a sliding window shorter than the context", "a rope type other than the default"),
    reads=frozenset({"rope_scaling", "rope_parameters", "sliding_window"}),
    capabilities=LLAMA3_CAPABILITIES,
    lora_paths=PROJECTION_PATHS,
    tiny=tiny,
)
