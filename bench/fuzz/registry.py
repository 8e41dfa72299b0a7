"""Named hooks: the Python a case in bench/fuzz_cases/*.yaml points at by name.

A case's data says *what* runs and what must come out; what cannot be said as data (a
store damaged just so, a race of two writers, a signal at a moment) is a function
registered here under a name, in the slot it fills:

* ``setup(c)`` prepares the case's folder; ``skip(c)`` says why it cannot run here;
* ``check(c, run)`` returns extra *unclear* problems, ``post(c, run)`` *lost/wrong* ones;
* ``runner(c, outcome)`` replaces the one-command case altogether (concurrency,
  signals): it runs what it likes and fills the outcome.

A *factory* hook takes the arguments the data gives it (``{json_error: {code: 3}}``)
and returns the hook; a plain one takes none (``copy_store``). The loader calls each
factory once, when it reads the data, so a bad argument is an error naming its file
and case, never a harness error mid-run. ``CONTENTS`` holds file contents too long or
too binary for YAML, by name, for the ``write`` setup.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

SLOTS = ("setup", "check", "post", "skip", "runner")

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Hook:
    name: str
    slot: str
    fn: Callable[..., Any]
    factory: bool  # fn(**args from the data) returns the hook; else fn is the hook


HOOKS: dict[str, Hook] = {}
CONTENTS: dict[str, Callable[[], str | bytes]] = {}


def hook(slot: str, *, factory: bool = False, name: str | None = None) -> Callable[[F], F]:
    """Register the decorated function as hook ``name`` (its own name without a leading
    underscore) for ``slot``."""
    if slot not in SLOTS:
        raise ValueError(f"no hook slot {slot!r} (slots: {', '.join(SLOTS)})")

    def register(fn: F) -> F:
        key = name or fn.__name__.lstrip("_")
        if key in HOOKS:
            raise ValueError(f"two hooks named {key!r}")
        HOOKS[key] = Hook(key, slot, fn, factory)
        return fn

    return register


def content(name: str) -> Callable[[F], F]:
    """Register the decorated function (no arguments: bytes or text) as file content
    ``name``."""

    def register(fn: F) -> F:
        if name in CONTENTS:
            raise ValueError(f"two contents named {name!r}")
        CONTENTS[name] = fn
        return fn

    return register
