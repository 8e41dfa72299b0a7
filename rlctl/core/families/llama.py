"""Llama (``LlamaForCausalLM``): Tunix's ``llama3`` model, and the one model rlctl
has its own trainer code for (weights-first decode, the MLP's own gradient,
recomputation, scanned layers: ``trainer/tunix_adapter``)."""

from __future__ import annotations

from typing import Any

from rlctl.core.families.decoder import PROJECTION_PATHS, decoder_fields, llama3_rope_scaling
from rlctl.core.families.record import Capabilities, Family

# what rlctl's own code for Tunix's llama3 model does (trainer/tunix_adapter:
# decode.py, mlp_grad.py, layers.py, logprobs.recomputed); a family on that model
# whose attention is Llama's takes all of it
LLAMA3_CAPABILITIES = Capabilities(
    weights_first_decode=True,
    own_mlp_gradient=True,
    recomputation=True,
    scanned_layers=True,
)


def config_fields(c: dict[str, Any]) -> dict[str, Any]:
    """Tunix's llama3 fields, and ``rope_scaling`` (Llama 3.1/3.2's ``llama3`` rope,
    which Tunix's model has no field for: ``tunix_adapter.families.build_config``
    carries it, ``tunix_adapter.rope`` applies it); other rope types are refused."""
    fields = decoder_fields(c, 10000.0, 1e-5, "weight_tying")
    fields["rope_scaling"] = llama3_rope_scaling(c, "Llama")
    return fields


FAMILY = Family(
    model_type="llama",
    hf_architecture="LlamaForCausalLM",
    tunix_package="llama3",
    model_class="Llama3",
    map_config=config_fields,
    refuses=("a rope type other than the default and Llama 3's `llama3`",),
    reads=frozenset({"rope_scaling", "rope_parameters"}),
    capabilities=LLAMA3_CAPABILITIES,
    lora_paths=PROJECTION_PATHS,
    gguf_architecture="llama",
)
