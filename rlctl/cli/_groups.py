"""Option groups: a command's flags declared once, as a typed frozen dataclass.

SkyPilot declares the options several commands share once (``sky/client/cli/flags.py``)
and adds them with a decorator. typer builds a command from its function's signature, so
the same is done here with the standard ``__signature__`` protocol that typer reads
(``typer/utils.py`` ``get_params_from_function``: ``inspect.signature`` and
``typing.get_type_hints``): a parameter annotated with a group is replaced by the group's
fields, each an ``Annotated`` typer option, and the command receives the group built again
from the parsed values. Groups nest (a field whose type is a group is flattened too), so
``train``'s options are one object made of the groups it shares with other commands.

A group's field names are the command's parameter names: two fields of one command with
the same name are a mistake this module refuses when the command is declared.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_KEYWORD = inspect.Parameter.KEYWORD_ONLY


class OptionGroup:
    """The base of an option group: a frozen dataclass whose fields are a command's
    options (``@dataclass(frozen=True) class RunWhere(OptionGroup): ...``)."""


def is_group(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, OptionGroup) and dataclasses.is_dataclass(tp)


def _hints(obj: Any) -> dict[str, Any]:
    return typing.get_type_hints(obj, include_extras=True)


def group_parameters(cls: type) -> Iterator[inspect.Parameter]:
    """The group's fields as keyword parameters, nested groups flattened in place."""
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if is_group(tp):
            yield from group_parameters(tp)
            continue
        default = f.default if f.default is not dataclasses.MISSING else inspect.Parameter.empty
        yield inspect.Parameter(f.name, _KEYWORD, default=default, annotation=tp)


def _build(cls: Any, values: dict[str, Any]) -> Any:
    """The group again from the flat values (they are consumed)."""
    hints = _hints(cls)
    kwargs = {
        f.name: _build(hints[f.name], values) if is_group(hints[f.name]) else values.pop(f.name)
        for f in dataclasses.fields(cls)
    }
    return cls(**kwargs)


def grouped(fn: F) -> F:
    """Flatten every option-group parameter of ``fn`` into the options typer sees.

    Put it under ``guarded`` (which reads ``output`` from the flat keyword arguments).
    """
    sig = inspect.signature(fn)
    hints = _hints(fn)
    params: list[inspect.Parameter] = []
    groups: dict[str, type] = {}
    for p in sig.parameters.values():
        tp = hints.get(p.name, p.annotation)
        if is_group(tp):
            groups[p.name] = tp
            params.extend(group_parameters(tp))
        else:
            params.append(p.replace(kind=_KEYWORD, annotation=tp))
    names = [p.name for p in params]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise TypeError(f"{fn.__qualname__}: option names declared twice: {', '.join(twice)}")

    @functools.wraps(fn)
    def command(**kwargs: Any) -> Any:
        for name, cls in groups.items():
            kwargs[name] = _build(cls, kwargs)
        return fn(**kwargs)

    # typer reads both: the signature for the parameters, the annotations for their types
    command.__dict__["__signature__"] = sig.replace(parameters=params)
    command.__annotations__ = {p.name: p.annotation for p in params}
    if "return" in hints:
        command.__annotations__["return"] = hints["return"]
    del command.__wrapped__  # inspect must stop at the flat signature, not fn's
    return typing.cast(F, command)
