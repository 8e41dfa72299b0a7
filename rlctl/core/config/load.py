"""Build a spec from YAML + ``key=value`` overrides, with errors that name the field.

Precedence (lowest first): model defaults < YAML file < RLCTL_SET env entries <
explicit flags. Overrides use dotted paths (``training.steps=5``) and YAML
scalars, so ``--set`` reaches every field without a flag per field.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from rlctl.core.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        raise ConfigError(
            f"config file {str(p)!r} is a directory, not a file",
            hint="pass the path of a YAML file",
        )
    if p.exists() and not p.is_file():
        raise ConfigError(
            f"config file {str(p)!r} is not a regular file", hint="pass the path of a YAML file"
        )
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist", hint="check the --config path")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {str(p)!r} is not UTF-8 text (byte {e.start})", hint="pass a YAML file"
        ) from None
    except OSError as e:  # /proc/self/mem, a FIFO, no permission ...
        raise ConfigError(
            f"config file {str(p)!r} cannot be read: {e.strerror or e}",
            hint="pass a readable YAML file",
        ) from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"config file {str(p)!r} is not valid YAML{where}") from e
    except RecursionError:  # nested deeper than the parser's stack
        raise ConfigError(
            f"config file {str(p)!r} is nested too deeply to read", hint="pass a run spec YAML file"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a mapping at the top level")
    return data


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b=3`` -> (["a", "b"], 3). Values are YAML scalars (``null``, ``1e-5``, ``true``)."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(
            f"override {item!r} is not of the form key.path=value",
            hint="e.g. --set training.steps=5",
        )
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def set_path(data: dict[str, Any], path: list[str], value: Any) -> None:
    node = data
    for part in path[:-1]:
        nxt = node.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            node[part] = nxt
        node = nxt
    node[path[-1]] = value


def env_overrides(prefix: str = "RLCTL_SET") -> list[str]:
    """``RLCTL_SET="training.steps=5;rollout.temperature=0.9"`` for scripts and pods."""
    raw = os.environ.get(prefix, "")
    return [s for s in (part.strip() for part in raw.split(";")) if s]


def format_validation_error(err: ValidationError, what: str = "config") -> str:
    """One line per problem, each with the dotted field path pydantic reports."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or what
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        got = e.get("input")
        if e["type"] in ("literal_error", "enum") and isinstance(got, (str, int, float)):
            msg += f" (got {got!r})"
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


def _section(annotation: Any) -> type[BaseModel] | bool | None:
    """The model a field holds (descend into it), True for a free-form mapping, or
    None for a value (a number, a string, a list: nothing below it to set)."""
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if annotation is Any or typing.get_origin(annotation) is dict:
        return True
    for arg in typing.get_args(annotation):  # Optional[X], X | None, Annotated[X, ...]
        found = _section(arg)
        if found is not None:
            return found
    return None


def check_override_path(model: type[BaseModel], path: list[str]) -> None:
    """``--set a.b.c=v`` must follow the spec's sections: ``training.steps.x=3`` is
    refused as "training.steps is a value", not as "should be a valid integer"."""
    node: type[BaseModel] = model
    for i, part in enumerate(path[:-1]):
        field = node.model_fields.get(part)
        if field is None:
            return  # pydantic reports the unknown field with its path
        inner = _section(field.annotation)
        if inner is True:
            return
        if inner is None:
            where = ".".join(path[: i + 1])
            raise ConfigError(
                f"--set {'.'.join(path)}: {where} is a value, not a section",
                hint=f"set it directly, e.g. --set {where}=VALUE",
            )
        assert isinstance(inner, type)  # a model: True and None returned or raised above
        node = inner


def build(model: type[M], base: dict[str, Any], overrides: list[str] | None = None) -> M:
    data = dict(base)
    for item in [*env_overrides(), *(overrides or [])]:
        path, value = parse_override(item)
        check_override_path(model, path)
        set_path(data, path, value)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"invalid {model.__name__}: {format_validation_error(e)}") from e


def dump_yaml(spec: BaseModel) -> str:
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)
