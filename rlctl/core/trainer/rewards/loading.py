"""Reward functions from the run config: a registry name, a dotted path or a file.

Two forms, told apart by the function's signature, not by a flag:

* per sample, rlctl's own: ``fn(completion, gold) -> float``;
* batched, TRL's: ``fn(prompts, completions, **columns) -> list[float | None]``, any
  function with a ``completions`` parameter and either ``prompts`` or ``**kwargs``.

Everything is checked here, before the model loads, rather than at the first rollout
minutes later: the name resolves, the thing is a function, and it can be called in
one of the two forms.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType

from rlctl.core.config.models import RewardEntry, is_reward_file
from rlctl.core.errors import ConfigError
from rlctl.core.trainer.rewards.verifier import correct_reward, format_reward

RewardFn = Callable[..., object]
REGISTRY: dict[str, RewardFn] = {"correct": correct_reward, "format": format_reward}
_FORMS = (
    "a reward is fn(completion, gold) -> float, or TRL's "
    "fn(prompts, completions, **columns) -> list[float | None]"
)


@dataclass(frozen=True)
class Reward:
    """One resolved reward: its metrics name, the function, its weight in the total,
    and whether it is called once per batch (TRL's form) or once per completion."""

    name: str
    fn: RewardFn
    weight: float = 1.0
    batched: bool = False
    accepts: frozenset[str] | None = None  # batched: the keywords it takes; None = all
    ref: str = ""  # as the config gave it (errors name it): 'correct', 'mod:fn', a file

    @property
    def label(self) -> str:
        return self.ref or self.name


def resolve(entries: Sequence[str | RewardEntry]) -> list[Reward]:
    """The rewards of ``entries`` (``RunSpec.rewards``; a bare string is one entry)."""
    out = []
    for entry in entries:
        e = RewardEntry.of(entry) if isinstance(entry, str) else entry
        out.append(_checked(e, _lookup(e.fn)))
    return out


def _lookup(ref: str) -> object:
    if ref in REGISTRY:
        return REGISTRY[ref]
    if is_reward_file(ref):
        path, _, attr = ref.rpartition(":")
        mod = _load_file(ref, path)
        module = path
    else:
        module, _, attr = ref.replace(":", ".").rpartition(".")
        mod = _import(ref, module)
    fn = getattr(mod, attr, None)
    if fn is None:
        raise ConfigError(
            f"unknown reward {ref!r}: {module!r} has no {attr!r}",
            hint=f"use one of {sorted(REGISTRY)}, module.function or path/to/file.py:function",
        )
    return fn


def _import(ref: str, module: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and module.startswith(e.name):  # the module itself is missing
            raise ConfigError(
                f"unknown reward {ref!r}: no module {e.name!r}",
                hint=f"use one of {sorted(REGISTRY)}, a dotted path module.function on "
                "PYTHONPATH, or a file: ./rewards.py:function",
            ) from e
        raise _import_failed(ref, module, e) from e
    except ValueError as e:  # an empty module path
        raise ConfigError(
            f"unknown reward {ref!r}",
            hint=f"use one of {sorted(REGISTRY)}, module.function or path/to/file.py:function",
        ) from e
    except Exception as e:  # its own code failed: a syntax error, an import inside it
        raise _import_failed(ref, module, e) from e


def _load_file(ref: str, path: str) -> ModuleType:
    """The module of a reward file, without PYTHONPATH; loaded once per process (two
    rewards from one file share it) under a name derived from its absolute path."""
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(full):
        raise ConfigError(
            f"reward {ref!r}: no file {full}",
            hint="give the path of a .py file (relative to where you run "
            "'rlctl train'), then ':function'",
        )
    digest = hashlib.sha1(full.encode()).hexdigest()[:10]
    stem = "".join(c if c.isalnum() else "_" for c in os.path.basename(full)[:-3])
    name = f"rlctl_reward_file_{stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, full)
    if spec is None or spec.loader is None:
        raise ConfigError(
            f"reward {ref!r}: {full} cannot be loaded as Python", hint="give the path of a .py file"
        )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses and pickling look a module up by name
    try:
        spec.loader.exec_module(mod)
    except Exception as e:
        del sys.modules[name]
        raise _import_failed(ref, path, e) from e
    return mod


def _import_failed(ref: str, module: str, e: BaseException) -> ConfigError:
    first = (str(e).splitlines() or [""])[0][:160]
    return ConfigError(
        f"reward {ref!r}: importing {module!r} failed ({type(e).__name__}: {first})",
        hint="fix that module, or drop the reward",
    )


def _checked(entry: RewardEntry, fn: object) -> Reward:
    """``fn`` as a Reward in the form its signature says, or a ConfigError."""
    label = entry.name or entry.fn
    weight = 1.0 if entry.weight is None else entry.weight  # filled by RewardEntry
    if not callable(fn):
        raise ConfigError(
            f"reward {entry.fn!r} is a {type(fn).__name__}, not a function", hint=_FORMS
        )
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature: trust them
        return Reward(label, fn, weight, ref=entry.fn)
    params = sig.parameters
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if "completions" in params and ("prompts" in params or var_kw):
        accepts = None if var_kw else frozenset(params)
        return Reward(label, fn, weight, batched=True, accepts=accepts, ref=entry.fn)
    try:
        sig.bind("completion", "gold")
    except TypeError as e:
        short = entry.fn.rpartition(":")[2].rpartition(".")[2]
        raise ConfigError(
            f"reward {entry.fn!r} cannot be called as {short}"
            f"(completion, gold) nor as {short}(prompts, completions, "
            f"**columns): {e}",
            hint=_FORMS,
        ) from e
    return Reward(label, fn, weight, ref=entry.fn)
