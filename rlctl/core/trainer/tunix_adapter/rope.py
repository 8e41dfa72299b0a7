"""Rotary position embeddings of Tunix's Llama model, with Llama 3's frequency scaling.

Why rlctl's own: Tunix 0.1.7's ``llama3.model.apply_rope`` takes a base (``rope_theta``)
and nothing else, but Llama 3.1 and 3.2 checkpoints were trained with ``rope_type:
llama3`` (``rope_scaling`` in their config.json: ``factor`` 8 or 32, ``low_freq_factor``
1, ``high_freq_factor`` 4, ``original_max_position_embeddings`` 8192). Every frequency
whose wavelength passes 8,192 tokens is divided by ``factor``, those between the two
bounds smoothly; without it each of those rotations is 8-32x off at every position, and
the trainer trains another model than the checkpoint's. The math is transformers'
``_compute_llama3_parameters`` (``modeling_rope_utils.py``, 5.12); every call site of
the model's rope (the shim's attention, ``mlp_grad.attention``, ``decode``) comes here.

A config without scaling gets Tunix's own ``apply_rope``, bit for bit, so the models
that have none (SmolLM2, Qwen, Mistral) run and compile exactly as before.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def scaling_of(config: Any) -> tuple[float, float, float, float] | None:
    """A model config's Llama 3 rope scaling (the values of
    ``families.decoder.LLAMA3_ROPE_FIELDS``, in that order), or None:
    ``families.build_config`` gives it to the configs of checkpoints that have one."""
    value = getattr(config, "rope_scaling", None)
    if not value:
        return None
    factor, low, high, original = value  # the four, as the config holds them
    return factor, low, high, original


def timescales(head_dim: int, theta: float, scaling: tuple[float, ...]) -> np.ndarray:
    """Each rotary pair's timescale (1 / its frequency), float32, with Llama 3's
    scaling: transformers' inverse frequencies, scaled as ``_compute_llama3_parameters``
    scales them (low frequencies divided by ``factor``, the band between the two
    wavelength bounds interpolated), in float32 as it computes them."""
    factor, low, high, original = (float(x) for x in scaling)
    inv = 1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    inv = inv.astype(np.float32)
    wavelen = np.float32(2 * math.pi) / inv
    low_wavelen, high_wavelen = original / low, original / high
    scaled = np.where(wavelen > low_wavelen, inv / np.float32(factor), inv)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / np.float32(factor) + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    scaled = np.where(medium, smoothed, scaled).astype(np.float32)
    return (1.0 / scaled).astype(np.float32)


def apply_rope(inputs: Any, positions: Any, head_dim: int, config: Any) -> Any:
    """``inputs`` [B, L, N, H] rotated by ``positions`` [B, L] as ``config``'s
    checkpoint was trained: Tunix's ``apply_rope`` with the config's ``rope_theta``,
    or, where the config has Llama 3 scaling, the same rotation at the scaled
    frequencies."""
    import jax.numpy as jnp
    from tunix.models.llama3 import model as m

    scaling = scaling_of(config)
    if scaling is None:
        return m.apply_rope(inputs, positions, head_dim=head_dim, rope_theta=config.rope_theta)
    timescale = jnp.asarray(timescales(head_dim, config.rope_theta, scaling))
    sinusoid = positions[..., jnp.newaxis] / timescale[jnp.newaxis, jnp.newaxis, :]
    sinusoid = sinusoid[..., jnp.newaxis, :]
    sin, cos = jnp.sin(sinusoid), jnp.cos(sinusoid)
    first, second = jnp.split(inputs, 2, axis=-1)
    out = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
    return out.astype(inputs.dtype)
