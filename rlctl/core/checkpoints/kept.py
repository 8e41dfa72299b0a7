"""The tensors of a multimodal checkpoint that are not its text model (Qwen3.5's vision
tower and multi-token-prediction layers): set aside on the way in, written back on the
way out, byte for byte.

Why: every released dense Qwen3.5 checkpoint is ``Qwen3_5ForConditionalGeneration``
(``families.Wrapper``). rlctl trains its text model only; an export without the rest
would no longer load as the architecture its config.json names. So a trainer folder
keeps them in ``kept.safetensors`` beside its Orbax checkpoint, and an export (of a
trainer folder, or of a run, from the run's model folder) lists them after the text
model's tensors. A text-only checkpoint has none.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from rlctl.core import families
from rlctl.core.checkpoints import hf
from rlctl.core.checkpoints.hf import SafetensorsReader
from rlctl.core.checkpoints.places import Output, Place
from rlctl.core.errors import ConfigError

KEPT_FILE = "kept.safetensors"


class Kept:
    """Tensors read by name from safetensors files, outside the trainer's model."""

    def __init__(self, reader: SafetensorsReader, names: Iterable[str]) -> None:
        self.reader = reader
        self.names = sorted(names)
        self.index = frozenset(self.names)

    def shape_dtype(self, name: str) -> tuple[tuple[int, ...], str]:
        t = self.reader.tensors[name]
        return t.shape, t.dtype

    def read(self, name: str) -> np.ndarray:
        return self.reader.read(name)


def wrapped(config: dict[str, Any]) -> bool:
    """Whether config.json ``config`` is a multimodal wrapper of a text family."""
    fam = families.find(config.get("model_type"))
    return fam is not None and fam.wraps(config)


def of_reader(
    reader: SafetensorsReader, config: dict[str, Any], model: Iterable[str]
) -> Kept | None:
    """A Hugging Face checkpoint's tensors that ``model`` (the text model's names) does
    not hold, when its config is a wrapper's; None for a text-only checkpoint."""
    if not wrapped(config):
        return None
    return Kept(reader, set(reader.tensors) - set(model))


def of_model_folder(place: Place, config: dict[str, Any], model: Iterable[str]) -> Kept | None:
    """What a run's model folder keeps: a trainer folder's ``kept.safetensors``, or a
    Hugging Face folder's tensors outside the text model. One clear line when neither
    is there (a hub model whose weights this machine never downloaded)."""
    if not wrapped(config):
        return None
    if place.exists(KEPT_FILE):
        reader = SafetensorsReader(place, [KEPT_FILE])
        return Kept(reader, reader.tensors)
    try:
        reader = SafetensorsReader(place, None)  # reads the headers: are the files here?
    except ConfigError as e:
        raise ConfigError(
            f"{place.uri}: the model's tensors outside its text model (its vision tower) "
            "are not on this machine, and an export needs them to load as "
            f"{config.get('architectures', ['its architecture'])[0]}",
            hint="download the whole model once (huggingface-cli download), then convert again",
        ) from e
    return Kept(reader, set(reader.tensors) - set(model))


def write(out: Output, kept: Kept, want: str | None = None) -> int:
    """``kept`` into ``out``'s ``kept.safetensors`` (cast to ``want`` where a float);
    its bytes."""
    planned = []
    for name in kept.names:
        shape, dt = kept.shape_dtype(name)
        floating = dt in ("float32", "bfloat16", "float16")
        planned.append(hf.Planned(name, shape, want if want and floating else dt))
    with out.open(KEPT_FILE) as f:
        f.write(hf.shard_header(planned))
        for t in planned:
            arr = kept.read(t.name)
            if str(arr.dtype) != t.dtype:
                arr = arr.astype(hf.np_dtype(t.dtype))
            f.write(hf.byte_view(arr))
    return sum(t.nbytes for t in planned)
