"""Tunix's side of each model family: its ``ModelConfig`` built from config.json.

The families themselves (which Tunix package and class, the config mapping, the
tensor layout, the capabilities) are ``rlctl.core.families``, read by the converter
too: a new family is one module there.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any

from rlctl.core import families
from rlctl.core.errors import ConfigError
from rlctl.core.families import Family

_HASHABLE: dict[type, type] = {}
_WITH_OWN: dict[type, type] = {}
# fields a family's mapping may give that Tunix's ModelConfig has no field for, read
# by rlctl's own code for the model (``rope``: Llama 3's rope scaling)
OWN_FIELDS = ("rope_scaling",)


def _hashable(config: Any) -> Any:
    """``config`` as an instance of a subclass that can be hashed by value.

    Pitfall: Tunix's Qwen2/Qwen3/Gemma 3 ``ModelConfig`` are mutable dataclasses, so
    unhashable, and a model's graphdef (which holds its config) is then unhashable
    too: step.py's cache of compiled updates, keyed by graphdef, raised
    ``TypeError: unhashable type: 'ModelConfig'`` at the first step. Equal configs
    have equal reprs, so hashing the repr keeps hash and ``==`` consistent."""
    cls = type(config)
    if cls.__hash__ is not None:
        return config
    if cls not in _HASHABLE:
        _HASHABLE[cls] = type(
            cls.__name__,
            (cls,),
            {
                "__slots__": (),
                "__hash__": lambda self: hash(repr(self)),
                "__module__": cls.__module__,
            },
        )
    import dataclasses

    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
    return _HASHABLE[cls](**fields)


def tunix_module(fam: Family, name: str = "model") -> Any:
    """``tunix.models.<package>.<name>`` of the family (or of rlctl's own package
    for a model Tunix does not have: ``Family.model_package``)."""
    return importlib.import_module(f"{fam.model_package}.{name}")


def build_config(fam: Family, c: dict[str, Any]) -> Any:
    """The family's Tunix ``ModelConfig`` from config.json ``c`` (hashable)."""
    m = tunix_module(fam)
    fields = fam.config_fields(c)
    for field, enum in fam.enum_fields:
        value, members = fields[field], getattr(m, enum)
        # a tuple of names (Gemma 4's layer pattern): a tuple of members
        fields[field] = (
            tuple(getattr(members, v) for v in value)
            if isinstance(value, (tuple, list))
            else getattr(members, value)
        )
    known = {f.name for f in dataclasses.fields(m.ModelConfig)}
    config = _hashable(m.ModelConfig(**{k: v for k, v in fields.items() if k in known}))
    own = {k: fields[k] for k in OWN_FIELDS if fields.get(k) is not None and k not in known}
    return _with_own(config, own) if own else config


def _with_own(config: Any, own: dict[str, Any]) -> Any:
    """``config`` as an instance of a subclass with rlctl's ``OWN_FIELDS`` as dataclass
    fields (None by default): in its repr, ``==`` and hash, so two models whose rope
    differs never share a compiled program (step.py's cache is keyed by the graphdef,
    which holds the config). One subclass per Tunix class: equal configs are of one
    class, as dataclass equality needs."""
    cls = type(config)
    if cls not in _WITH_OWN:
        params = getattr(cls, "__dataclass_params__", None)
        _WITH_OWN[cls] = dataclasses.make_dataclass(
            cls.__name__,
            [(k, Any, dataclasses.field(default=None)) for k in OWN_FIELDS],
            bases=(cls,),
            frozen=bool(getattr(params, "frozen", False)),
            namespace={"__hash__": lambda self: hash(repr(self)), "__module__": cls.__module__},
        )
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
    return _WITH_OWN[cls](**fields, **own)


def check_family(folder: Path) -> str:
    """The folder's ``model_type``, if the trainer has a Tunix model for it."""
    from rlctl.core.trainer.model.models import read_model_config

    config = read_model_config(folder)
    fam = families.find(config.get("model_type"))
    if fam is None:
        raise ConfigError(
            f"model type {config.get('model_type')!r} is not supported by the local trainer",
            hint=f"use one of: {', '.join(sorted(families.FAMILIES))}",
        )
    family = fam.model_type
    try:
        fam.config_fields(config)  # every field Tunix's config needs
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(
            f"{folder / 'config.json'}: cannot build a {family} model from it "
            f"({type(e).__name__}: {e})",
            hint="copy or download the model again",
        ) from e
    return str(family)
