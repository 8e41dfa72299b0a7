"""LoRA adapters on a frozen base, as Tunix builds them: ``qwix.LoraProvider`` +
``qwix.apply_lora_to_model``.

Each targeted projection keeps its base weight ``W`` (``nnx.Param``, frozen) and
gets ``*_lora_a`` / ``*_lora_b`` (``nnx.LoRAParam``); qwix adds
``(x @ a) @ b * alpha / rank`` to its output (``b`` starts at zero, so a new
adapter leaves the model unchanged). Only ``nnx.LoRAParam`` is trained, so
gradients and Adam's moments exist for the adapters alone, and the base is held
once: the sampler runs this same model, and the reference model (``beta > 0``)
is this model with its adapters zeroed (``base_only``), not a second copy.

Pitfall: qwix intercepts the ``__call__`` of the module it is applied to, and
rlctl's log-probs and sampler call a model's decoder layers one by one (the
prefix-shared forward, per-layer remat), never the model's own ``__call__``.
Applied to the whole model, the adapters would be created and then silently
skipped by every rlctl forward. So LoRA is applied to each decoder layer, whose
``__call__`` every path goes through (tested: the adapters change rlctl's
log-probs, and zeroed they give the base's exactly).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rlctl.core import families
from rlctl.core.errors import ConfigError


def check_lora(family: str, training: Any, devices: int = 1) -> None:
    """Refuse, before a run exists, a LoRA config the trainer cannot run."""
    if training.lora_rank is None:
        return
    if not families.family(family).lora_paths:
        raise ConfigError(
            f"training.lora_rank: LoRA is not supported for {family} models "
            "yet (its attention is stacked einsums qwix cannot split by "
            "projection)",
            hint="remove training.lora_rank to train all parameters, or use a model of "
            f"type {', '.join(families.with_lora())}",
        )
    paths = dict(families.family(family).lora_paths)
    absent = [t for t in training.lora_target_modules or () if t not in paths]
    if absent:
        raise ConfigError(
            f"training.lora_target_modules: {', '.join(absent)}: not a projection of "
            f"{family} models",
            hint=f"its projections: {', '.join(paths)}",
        )


def module_regex(family: str, targets: list[str]) -> str:
    """The qwix ``module_path`` regex of ``targets`` (Hugging Face projection names),
    as paths inside a decoder layer (``attn/q_proj``)."""
    paths = dict(families.family(family).lora_paths)
    return "|".join(paths[t] for t in targets)


def apply_lora(
    model: nnx.Module, family: str, training: Any, seed: int = 0, place: bool = True
) -> nnx.Module:
    """``model`` with adapters of ``training.lora_rank`` on ``training.lora_target_modules``
    of every decoder layer; the base's arrays are shared, not copied. ``place=False``
    leaves the adapters where qwix made them (an abstract model's, in the fit check's
    trace: there is nothing to place)."""
    import qwix

    from rlctl.core.trainer.tunix_adapter.logprobs import trunk

    provider = qwix.LoraProvider(
        module_path=module_regex(family, training.lora_target_modules),
        rank=int(training.lora_rank),
        alpha=float(training.lora_alpha),
    )
    rngs = nnx.Rngs(seed)
    layers = model.layers  # type: ignore[attr-defined]  # a Tunix model's (Tunix is untyped)
    for i, layer in enumerate(layers):
        # skip qwix's own first call (its inputs differ per family): one eager forward
        # of the whole model below creates every layer's adapters
        layers[i] = qwix.apply_lora_to_model(layer, provider, skip_nnx_init=True, rngs=rngs)
    model.set_attributes(qwix_rngs=rngs)
    tokens = jnp.zeros((1, 1), jnp.int32)
    trunk(model, tokens, jnp.zeros((1, 1), jnp.int32), None, jnp.ones((1, 1, 1), jnp.bool_))
    model.set_attributes(qwix_rngs=None)
    # Pitfall: qwix's initializers leave the adapters uncommitted (the base is
    # committed), and the first update's outputs are committed: the sampler then
    # compiled once more after warm-up (80 s at step 2 of a tiny run on a busy CPU).
    # Placed where they are, explicitly, they are committed from the start.
    adapters = nnx.state(model, nnx.LoRAParam)
    if place:
        nnx.update(model, jax.tree.map(lambda x: jax.device_put(x, x.sharding), adapters))
    if not jax.tree.leaves(adapters):
        raise ConfigError(
            f"training.lora_target_modules={training.lora_target_modules}: "
            "no projection of the model matched"
        )
    return model


def trainable(training: Any) -> Any:
    """What the optimizer trains: the adapters with LoRA, else every parameter."""
    return nnx.LoRAParam if training.lora_rank is not None else nnx.Param


def frozen_params(model: nnx.Module) -> Any:
    """The base's parameters (everything ``nnx.Param`` but the adapters)."""
    return nnx.state(model, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam)))


def base_only(state: Any) -> Any:
    """``state`` (of a LoRA model) with every adapter zeroed: the base model's output
    exactly (``x @ a @ 0`` adds nothing), sharing the base's arrays."""

    def zero(v: Any) -> Any:
        return v.replace(jnp.zeros_like(v.get_value())) if isinstance(v, nnx.LoRAParam) else v

    return jax.tree.map(zero, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def base_reference(folder: Path, source: str) -> dict[str, Any]:
    """What a LoRA checkpoint records of its base: the model source and the SHA-256
    of its config.json and weights (``checkpoints.lora.base_sha256``)."""
    from rlctl.core.checkpoints.lora import base_sha256

    return {"source": source, "sha256": base_sha256(folder)}
