"""Verifiable rewards for math answers: pure functions, registered by name.

The model is told to put its final answer in ``<answer>...</answer>``; only the
*last* such block counts, so a model cannot hedge with several answers.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Sequence
from decimal import Decimal, InvalidOperation

from rlctl.core.errors import ConfigError

RewardFn = Callable[[str, str], float]  # (completion, gold answer) -> reward

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_NUMBER = re.compile(r"^[-+]?\d+(\.\d+)?$")


def extract_answer(completion: str) -> str | None:
    """The text inside the last well-formed ``<answer>`` block, stripped."""
    blocks = _ANSWER.findall(completion)
    return blocks[-1].strip() if blocks else None


def normalize_number(text: str | None) -> str | None:
    """'$1,234.00' -> '1234'; '-0.50' -> '-0.5'; not a number -> None."""
    if text is None:
        return None
    t = text.strip().replace(",", "").replace("$", "").replace(" ", "")
    t = t.rstrip(".")
    if not _NUMBER.match(t):
        return None
    try:
        d = Decimal(t)
    except InvalidOperation:
        return None
    d = d.normalize()
    if d == d.to_integral_value():
        return str(int(d))
    return format(d, "f")


def gold_answer(answer_field: str) -> str | None:
    """The gold number of an answer field: after the last ``####`` (GSM8K) when there
    is one, else the whole field; None when that is not a number, so a data reader
    can say which row of which file is bad (gsm8k_gold's ValueError cannot)."""
    _, sep, tail = answer_field.rpartition("####")
    return normalize_number(tail if sep else answer_field)


def gsm8k_gold(answer_field: str) -> str:
    """GSM8K's gold answer is the number after ``####``."""
    value = gold_answer(answer_field)
    if value is None:
        raise ValueError(f"no number after '####' in answer {answer_field[-60:]!r}")
    return value


def correct_reward(completion: str, gold: str) -> float:
    got = normalize_number(extract_answer(completion))
    return 1.0 if got is not None and got == normalize_number(gold) else 0.0


def format_reward(completion: str, gold: str, weight: float = 0.1) -> float:
    """Small shaping reward for a numeric answer in exactly the asked-for tags."""
    return weight if normalize_number(extract_answer(completion)) is not None else 0.0


REGISTRY: dict[str, RewardFn] = {"correct": correct_reward, "format": format_reward}


def resolve(names: Sequence[str]) -> list[RewardFn]:
    """Names from the registry or dotted paths ``package.module:function``."""
    fns = []
    for name in names:
        if name in REGISTRY:
            fns.append(REGISTRY[name])
            continue
        module, _, attr = name.replace(":", ".").rpartition(".")
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and module.startswith(e.name):  # the module itself is missing
                raise ConfigError(
                    f"unknown reward {name!r}: no module {e.name!r}",
                    hint=f"use one of {sorted(REGISTRY)} or a dotted path module.function "
                    "on PYTHONPATH") from e
            raise _import_failed(name, module, e) from e
        except ValueError as e:  # an empty module path
            raise ConfigError(f"unknown reward {name!r}",
                              hint=f"use one of {sorted(REGISTRY)} or module.function") from e
        except Exception as e:  # its own code failed: a syntax error, an import inside it
            raise _import_failed(name, module, e) from e
        fn = getattr(mod, attr, None)
        if fn is None:
            raise ConfigError(f"unknown reward {name!r}: module {module!r} has no {attr!r}",
                              hint=f"use one of {sorted(REGISTRY)} or module.function")
        fns.append(_checked(name, fn))
    return fns


def _import_failed(name: str, module: str, e: BaseException) -> ConfigError:
    first = (str(e).splitlines() or [""])[0][:160]
    return ConfigError(f"reward {name!r}: importing {module!r} failed "
                       f"({type(e).__name__}: {first})", hint="fix that module, or drop the reward")


def _checked(name: str, fn: object) -> RewardFn:
    """``fn`` if it can be called as ``fn(completion, gold)``: checked here, before the
    model loads, rather than at the first rollout minutes later."""
    import inspect

    hint = "a reward is a function (completion: str, gold: str) -> float"
    if not callable(fn):
        raise ConfigError(f"reward {name!r} is a {type(fn).__name__}, not a function",
                          hint=hint)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature: trust them
        return fn  # type: ignore[return-value]
    try:
        sig.bind("completion", "gold")
    except TypeError as e:
        raise ConfigError(f"reward {name!r} cannot be called as {name.split('.')[-1]}"
                          f"(completion, gold): {e}", hint=hint) from e
    return fn  # type: ignore[return-value]


def total_reward(fns: Sequence[RewardFn], completion: str, gold: str) -> float:
    """The sum of the rewards; a reward that fails, or returns anything but a finite
    number, stops the run with its name (NaN would silently poison the advantages)."""
    total = 0.0
    for fn in fns:
        name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
        try:
            value = fn(completion, gold)
        except Exception as e:
            raise ConfigError(f"reward {name!r} raised {type(e).__name__}: "
                              f"{(str(e).splitlines() or [''])[0][:160]}",
                              hint="fix the reward function, then 'rlctl resume' the run") from e
        try:  # numbers of any kind (numpy's too), but not the text "1.0"
            number = math.nan if isinstance(value, (str, bytes)) else float(value)
        except (TypeError, ValueError):
            number = math.nan
        if not math.isfinite(number):
            raise ConfigError(f"reward {name!r} returned {str(value)[:40]!r}, not a finite "
                              "number", hint="a reward returns a float such as 0.0 or 1.0")
        total += number
    return total
