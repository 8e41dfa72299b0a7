"""Every family rlctl trains and converts, found once: each module of this package
that holds a ``FAMILY`` record is one (a new family is one new module; nothing lists
them). The rest of rlctl resolves a family here, from config.json's ``model_type``,
and from then on asks the record, never compares a name."""

from __future__ import annotations

import importlib
import pkgutil
from types import MappingProxyType
from typing import Any

from rlctl.core.errors import ConfigError
from rlctl.core.families.record import Family


def _discover() -> dict[str, Family]:
    from rlctl.core import families as package

    found: dict[str, Family] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        fam = getattr(module, "FAMILY", None)
        if not isinstance(fam, Family):
            continue
        if fam.model_type in found:  # pragma: no cover - a packaging mistake
            raise RuntimeError(f"two families claim model_type {fam.model_type!r}")
        found[fam.model_type] = fam
    return dict(sorted(found.items()))


# model_type -> its family, in name order
FAMILIES: MappingProxyType[str, Family] = MappingProxyType(_discover())
# the model_type values in config.json that rlctl trains and converts
SUPPORTED: tuple[str, ...] = tuple(FAMILIES)
# model_type values of a family's multimodal sibling: refused with a pointer to it
_ALIASES = {alias: f.model_type for f in FAMILIES.values() for alias in f.refused_aliases}
# model_type values of multimodal checkpoints read as the text family they hold
WRAPPED: MappingProxyType[str, Family] = MappingProxyType(
    {f.wrapper.model_type: f for f in FAMILIES.values() if f.wrapper is not None}
)


def find(model_type: Any) -> Family | None:
    """The family of a config.json's ``model_type`` (a wrapper's too), or None."""
    return FAMILIES.get(model_type) or WRAPPED.get(model_type)


def family(model_type: Any) -> Family:
    """The family of a config.json's ``model_type``, or one clear line."""
    supported = ", ".join(SUPPORTED)
    if model_type in _ALIASES:
        raise ConfigError(
            f"model type {model_type!r} (multimodal) is not supported; its text model "
            f"'{_ALIASES[model_type]}' is",
            hint=f"supported model types: {supported}",
        )
    if model_type in WRAPPED:
        return WRAPPED[model_type]
    if model_type not in FAMILIES:
        raise ConfigError(
            f"model type {model_type!r} is not supported",
            hint=f"supported model types: {supported}",
        )
    return FAMILIES[model_type]


def of_config(config: dict[str, Any]) -> Family:
    """The family of a parsed config.json, or one clear line."""
    return family(config.get("model_type"))


def of_gguf(architecture: Any) -> Family:
    """The family a llama.cpp GGUF file of ``general.architecture`` converts to."""
    for fam in FAMILIES.values():
        if fam.gguf_architecture is not None and fam.gguf_architecture == architecture:
            return fam
    readable = sorted(f.gguf_architecture for f in FAMILIES.values() if f.gguf_architecture)
    raise ConfigError(
        f"GGUF architecture is {architecture!r}; only {', '.join(map(repr, readable))} "
        "converts to a Hugging Face folder",
    )


def with_lora() -> tuple[str, ...]:
    """The model types whose projections LoRA can target."""
    return tuple(t for t, f in FAMILIES.items() if f.lora_paths)
