"""What one model family declares: the ``Family`` record each module of this package
holds as ``FAMILY``, and the ``Capabilities`` the trainer asks of it.

Why one record: a family used to be spread over the converter, the trainer and the
test fakes, keyed three ways (``model_type``, Tunix package, Tunix config
attributes); a family missing from one of them silently lost the fast decode and
recomputation paths. Here every fact about a family is in its module, and the rest
of rlctl asks the record (``family.capabilities.weights_first_decode``), never
compares a name.

Pure Python, no jax and no Tunix: the conversion command must not load a framework,
so the config mapping returns plain keyword arguments (enum values by name) and the
trainer turns them into Tunix's ``ModelConfig`` (``trainer/tunix_adapter/families``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _nothing_more(config: dict[str, Any]) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Capabilities:
    """What the trainer may do with the family's model beyond Tunix's whole-model
    call. Each is rlctl's own code for one Tunix model (``tunix.models.llama3``
    today), so a family declares it only if its model is that one and runs as the
    code assumes (tested per family by tests/core/families/test_conformance.py)."""

    # sampler: decode steps with the weights laid out for a few rows
    # (trainer/tunix_adapter/llama/decode.py)
    weights_first_decode: bool = False
    # update: rlctl's decoder layer with the SiLU-gated MLP's gradient spelled out and
    # the MLP rows packed (tunix_adapter/llama/mlp_grad.py, logprobs.py)
    own_mlp_gradient: bool = False
    # update: per-layer recomputation (``training.remat``, logprobs.recomputed)
    recomputation: bool = False
    # every program: the layers as one scanned body (tunix_adapter/llama/layers.py)
    scanned_layers: bool = False


@dataclass(frozen=True)
class Layout:
    """How the family's Hugging Face tensors map onto the trainer's (Tunix's) tree:
    the rules themselves are ``checkpoints/layout.py``, chosen by these facts."""

    # "per_projection": q/k/v/o as [D, H, hd] / [H, hd, D] (Llama, Qwen);
    # "stacked_einsums": Gemma's q/kv (or qkv) einsums and ``scale`` norms;
    # "per_layer": Gemma 4's, whose layers differ (head sizes, KV-shared layers,
    # per-layer inputs; layout._gemma4), read by rlctl (Tunix's loader cannot)
    # "hybrid": Qwen3.5's linear-attention (gated DeltaNet) and gated full-attention
    # layers (layout._qwen3_5), read by rlctl as "per_layer" is
    attention: str = "per_projection"
    qkv_bias: bool = False  # q/k/v projections have biases (Qwen2)
    qk_norm: bool = False  # per-head RMS norms of queries and keys (Qwen3)

    @property
    def by_layer(self) -> bool:
        """Each tensor's rule and shape come from its own layer (``layout.rules``
        lists them with their shapes), and rlctl loads the folder itself: the
        layers differ, so layer 0 is no pattern for the others."""
        return self.attention in ("per_layer", "hybrid")


@dataclass(frozen=True)
class Wrapper:
    """A multimodal checkpoint that holds the family's text model (Qwen3.5's dense
    checkpoints are all ``Qwen3_5ForConditionalGeneration``): its config.json nests the
    text model's settings under ``text_config`` and its tensors under ``prefix``. Its
    other tensors (a vision tower, multi-token-prediction layers) are not the trainer's:
    set aside on the way in and written back on the way out (``checkpoints/kept.py``),
    so an export loads as the original architecture."""

    model_type: str  # the multimodal config.json's model_type
    architecture: str  # its architectures[0]
    prefix: str  # where its text model's tensors are ("model." in a text checkpoint)


@dataclass(frozen=True)
class Family:
    """One model family: the config.json ``model_type`` it accepts, its Tunix model,
    the config mapping, the tensor layout, what the trainer may do with it, and a
    tiny configuration for tests."""

    model_type: str  # config.json's model_type (the family's name everywhere in rlctl)
    hf_architecture: str  # config.json's architectures[0] (what transformers builds)
    # tunix.models.<package>; or, for a model Tunix does not have and rlctl implements
    # in Tunix's module layout (Qwen3.5), that package's full dotted path
    tunix_package: str
    model_class: str  # the model class (to restore a trainer checkpoint into)
    # config.json -> keyword arguments of the package's ModelConfig (raises ConfigError
    # for what the Tunix model cannot express, rather than train another model); called
    # through ``config_fields``, which first refuses the keys it does not read
    map_config: Callable[[dict[str, Any]], dict[str, Any]]
    safetensors_loader: str = "params"  # tunix.models.<package>.<loader>
    layout: Layout = Layout()
    capabilities: Capabilities = Capabilities()
    tied_by_default: bool = False  # tie_word_embeddings when config.json omits it
    # the qwix module path (inside a decoder layer) of each Hugging Face projection
    # LoRA can target; empty: LoRA is refused for the family
    lora_paths: tuple[tuple[str, str], ...] = ()
    # fields whose value is the name of a member of a Tunix enum (or a tuple of
    # names: a tuple of members): field -> enum class
    enum_fields: tuple[tuple[str, str], ...] = ()
    # other model_type values that name this family's multimodal sibling: refused with
    # a pointer to this one
    refused_aliases: tuple[str, ...] = ()
    # a multimodal checkpoint type that holds this text model, read as this family
    wrapper: Wrapper | None = None
    # the GGUF ``general.architecture`` llama.cpp writes for it, if rlctl reads such files
    gguf_architecture: str | None = None
    # a tiny random model's config.json (transformers' names) from the dims every
    # test model has (tests/fakes/tiny_model.py): the keys that make a tiny one behave
    # as the real ones do (Gemma 3's layer pattern, Qwen3's rope base), dims included
    tiny: Callable[[dict[str, Any]], dict[str, Any]] = _nothing_more
    # the keys of ``foreign.NEUTRAL`` (what changes a model's computation) that
    # ``map_config`` reads and checks itself; any other of them is refused unless it is
    # neutral
    reads: frozenset[str] = frozenset()
    # what ``map_config`` refuses, in words (the docs' families table, generated from
    # the records: ``families.table``)
    refuses: tuple[str, ...] = ()

    @property
    def model_package(self) -> str:
        """The dotted path of the package holding the family's ``model`` module."""
        if "." in self.tunix_package:
            return self.tunix_package
        return f"tunix.models.{self.tunix_package}"

    def config_fields(self, c: dict[str, Any]) -> dict[str, Any]:
        """config.json ``c`` as the keyword arguments of the family's Tunix
        ``ModelConfig`` (``map_config``), after refusing with one line any key that
        changes the model and that the family does not apply (``foreign``)."""
        from rlctl.core.families.foreign import refuse_foreign

        c = self.text_config(c)
        refuse_foreign(self.model_type, self.reads, c)
        return self.map_config(c)

    def wraps(self, c: dict[str, Any]) -> bool:
        """Whether config.json ``c`` is the family's multimodal wrapper's."""
        return self.wrapper is not None and c.get("model_type") == self.wrapper.model_type

    def text_config(self, c: dict[str, Any]) -> dict[str, Any]:
        """The text model's config.json: ``c`` itself, or a wrapper's ``text_config``
        under the family's own model_type. Its head is tied as the wrapper says, when
        it says: transformers ties a multimodal model by its top-level
        ``tie_word_embeddings`` (``PreTrainedModel.get_expanded_tied_weights_keys``)."""
        if not self.wraps(c):
            return c
        inner = c.get("text_config")
        if not isinstance(inner, dict):
            from rlctl.core.errors import ConfigError

            raise ConfigError(
                f"{c.get('model_type')} config: no text_config object",
                hint="copy or download the model's config.json again",
            )
        out = {**inner, "model_type": self.model_type}
        if "tie_word_embeddings" in c:
            out["tie_word_embeddings"] = c["tie_word_embeddings"]
        return out

    def tensor_prefix(self, c: dict[str, Any]) -> str:
        """Where config.json ``c``'s text-model tensors are named from."""
        return self.wrapper.prefix if self.wrapper is not None and self.wraps(c) else "model."
