"""A model family for rlctl: copy to rlctl/core/families/<model_type>.py and fill in.

This one is a Llama-shaped decoder under another ``model_type`` (what Mistral is), so it
trains on Tunix's ``llama3`` model with all of rlctl's fast paths. The registry
(rlctl/core/families/registry.py) finds ``FAMILY`` in any module of that package: nothing
lists it. Then add its row to ``ROWS`` in tests/core/families/test_conformance.py and a
published config.json to tests/data/configs with its row in test_foreign_keys.py
(docs/contributing/families.md). tests/test_contributing.py maps a Llama config through
this record as it stands.
"""

from __future__ import annotations

from typing import Any

from rlctl.core.families.decoder import PROJECTION_PATHS, decoder_fields, refuse, rope_parameters
from rlctl.core.families.llama import LLAMA3_CAPABILITIES
from rlctl.core.families.record import Family

MODEL_TYPE = "my_decoder"  # config.json's model_type


def config_fields(c: dict[str, Any]) -> dict[str, Any]:
    """config.json -> Tunix's Llama ModelConfig fields; refuse (one line) whatever
    Tunix's model would compute differently from transformers."""
    rope_type = rope_parameters(c).get("rope_type", rope_parameters(c).get("type", "default"))
    if rope_type != "default":
        raise refuse("MyDecoder", f"rope type {rope_type!r}", "use a stock model")
    # transformers' defaults of this family for rope_theta and the RMS-norm epsilon
    return decoder_fields(c, 10000.0, 1e-6, "weight_tying")


FAMILY = Family(
    model_type=MODEL_TYPE,
    hf_architecture="MyDecoderForCausalLM",
    tunix_package="llama3",
    model_class="Llama3",
    map_config=config_fields,
    refuses=("a rope type other than the default",),
    # the model-changing keys (families/foreign.py) that config_fields applies or checks
    reads=frozenset({"rope_scaling", "rope_parameters"}),
    capabilities=LLAMA3_CAPABILITIES,
    lora_paths=PROJECTION_PATHS,
)
