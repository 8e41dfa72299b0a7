"""Scoring a batch of completions with every reward, as TRL's GRPOTrainer does.

Each reward gives one value per completion or None ("does not apply to this one",
TRL's convention; NaN here). The training reward of a completion is the weighted sum
of the values that apply; each reward's own mean, over the completions it applies
to, is what ``metrics.jsonl`` logs as ``rewards/<name>/mean``. A reward that fails,
or returns anything but numbers and None, stops the run with its name: NaN would
silently poison the advantages. So does a value beyond ``REWARD_LIMIT``: 1e308 passed
as a number, overflowed the float32 total to inf, and every weight became NaN (#47).

A reward is a guest in the run: what it prints goes to the run's log (``say``), never
to stdout, which ``-o json`` keeps for its one document; a reward that exits
(``sys.exit``) is reported like one that raises, by its name.
"""

from __future__ import annotations

import contextlib
import io
import math
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlctl.core.errors import ConfigError
from rlctl.core.trainer.rewards.loading import Reward
from rlctl.core.trainer.runtime import stops

# what a TRL-style reward gets besides the data's columns (which cannot shadow them)
_RESERVED = ("prompts", "completions", "completion_ids")
# The range a reward's value must lie in. GRPO uses only the differences within each
# group, normalized, so a reward's scale carries nothing; a value beyond a million is
# a bug far more often than a scale, and values near float32's limit (3.4e38) make
# the total infinite.
REWARD_LIMIT = 1e6
Say = Callable[[str], None]  # where a reward's printed lines go


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


@dataclass(frozen=True)
class Sample:
    """What the rewards see of one completion: its text and its problem's prompt,
    gold answer, columns and (for a conversational row) messages."""

    completion: str
    question: str
    gold: str
    columns: Mapping[str, object]
    messages: Sequence[Mapping[str, str]] | None = None
    completion_ids: Sequence[int] | None = None


@dataclass(frozen=True)
class Scored:
    total: np.ndarray  # [N] float32: the weighted sum, what the policy is trained on
    per_reward: dict[str, np.ndarray]  # name -> [N] float64, NaN where it did not apply

    def means(self) -> dict[str, float | None]:
        """Each reward's mean over the completions it applied to (None: to none)."""
        out: dict[str, float | None] = {}
        for name, values in self.per_reward.items():
            ok = values[~np.isnan(values)]
            out[name] = float(ok.mean()) if ok.size else None
        return out


def score(rewards: Sequence[Reward], samples: Sequence[Sample], say: Say | None = None) -> Scored:
    """Every reward's values for ``samples`` and their weighted total. ``say``: where
    the lines a reward prints go (the run's log; stderr when not given)."""
    n = len(samples)
    total = np.zeros(n, np.float64)
    per: dict[str, np.ndarray] = {}
    for r in rewards:
        with _guest(r, say or _to_stderr):
            values = (
                _batched(r, samples)
                if r.batched
                else np.array([_per_sample(r, samples, i) for i in range(n)], np.float64)
            )
        per[r.name] = values
        total += np.where(np.isnan(values), 0.0, r.weight * values)
    with np.errstate(over="ignore"):  # an overflow is reported below, by name
        total32 = total.astype(np.float32)
    if not np.isfinite(total32).all():  # values in range, but weights beyond it
        worst = max(
            rewards, key=lambda r: float(np.nanmax(np.abs(r.weight * per[r.name]), initial=0.0))
        )
        raise ConfigError(
            f"reward {worst.label!r} weighted {worst.weight:g} makes the total "
            "reward of a completion overflow float32",
            hint=f"give the rewards weights such that their sum stays within ±{REWARD_LIMIT:g}",
        )
    return Scored(total32, per)


class _Lines(io.TextIOBase):
    """A text stream that hands each complete line to ``say``."""

    def __init__(self, say: Say) -> None:
        self.say = say
        self.pending = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            self.say(line)
        return len(text)

    def rest(self) -> None:
        if self.pending:
            self.say(self.pending)
            self.pending = ""


@contextlib.contextmanager
def _guest(r: Reward, say: Say) -> Iterator[None]:
    """While ``r`` runs, its ``print``s are lines for ``say``, named by the reward."""
    sink = _Lines(lambda line: say(f"reward {r.label!r} printed: {line}"))
    try:
        with contextlib.redirect_stdout(sink):
            yield
    finally:
        sink.rest()


def total_reward(rewards: Sequence[Reward], completion: str, gold: str) -> float:
    """The weighted reward of one completion (a problem without columns)."""
    return float(score(rewards, [Sample(completion, "", gold, {})]).total[0])


class RewardInterrupt(KeyboardInterrupt):
    """A KeyboardInterrupt raised by a reward itself, not by a stop signal: still a
    stop (exit 130, resumable), but its message names the reward."""


def _text(value: object, limit: int = 40) -> str:
    """``value`` as a short text for a message, whatever its ``__str__`` does: a
    number exactly (1000001, not 1e+06), text quoted, anything else by its type."""
    try:
        if value is None or isinstance(value, bool):
            return repr(value)
        if isinstance(value, int):
            if abs(value) < 10**limit:
                return str(value)
            return f"an int of {len(str(abs(value)))} digits"
        if isinstance(value, float):
            return repr(value)
        if isinstance(value, (str, bytes, np.generic, np.ndarray)):
            text = str(value)
            return repr(text if len(text) <= limit else text[: limit - 1] + "…")
    except Exception:  # a __str__ that raises, an int too long to print (Python 3.11+)
        pass
    return f"a {_type(value)}"


def _type(value: object) -> str:
    t = type(value)
    if t.__module__ == "builtins" or t.__module__.startswith("rlctl_reward_file_"):
        return t.__qualname__
    return f"{t.__module__}.{t.__qualname__}"


def _shown(value: object) -> str:
    """What a reward returned: its value and type, or its type alone."""
    text = _text(value)
    return text if text.startswith(("a ", "an ")) else f"{text} ({_type(value)})"


def _where(samples: Sequence[Sample], i: int | None) -> str:
    """The completion a value belongs to, as a user finds it: its place in the batch
    and the start of its problem."""
    if i is None:
        return f"on a batch of {len(samples)} completions"
    problem = " ".join(samples[i].question.split())
    problem = problem if len(problem) <= 40 else problem[:39] + "…"
    return f"for completion {i + 1} of {len(samples)} (problem {problem!r})"


def _failed(r: Reward, e: BaseException, where: str) -> ConfigError:
    """A reward that raised, or exited (``sys.exit``, which would end rlctl with the
    reward's exit code and no word of why), as one line naming it."""
    if isinstance(e, KeyboardInterrupt):  # a stop, as TRL's trainer takes it: named
        if stops.received() or isinstance(e, RewardInterrupt):
            raise e  # a real Ctrl-C/SIGTERM that landed in the reward: the run's stop
        raise RewardInterrupt(f"reward {r.label!r} raised KeyboardInterrupt {where}") from e
    if isinstance(e, SystemExit):
        what = f"called sys.exit({_text(e.code)})"
    else:
        try:
            first = (str(e).splitlines() or [""])[0][:160]
        except Exception:  # an exception whose str() raises
            first = "(its message could not be read)"
        what = f"raised {type(e).__name__}: {first}"
    return ConfigError(
        f"reward {r.label!r} {what} {where}",
        hint="fix the reward function, then 'rlctl resume' the run",
    )


def _number(r: Reward, value: object, allow_none: bool, where: str) -> float:
    if value is None and allow_none:
        return math.nan
    also = " or None" if allow_none else ""
    hint = f"a reward returns a float such as 0.0 or 1.0{also}"
    if isinstance(value, (str, bytes)):  # numbers of any kind (numpy's too), not "1.0"
        number = math.nan
    else:
        try:
            number = float(value)  # type: ignore[arg-type]  # a user reward's value
        except OverflowError:  # an int beyond any float: 10**400
            raise _out_of_range(r, value, where) from None
        except Exception as e:  # TypeError, ValueError, or whatever its __float__ raises
            raise ConfigError(
                f"reward {r.label!r} returned {_shown(value)} {where}, "
                f"not a number: float() of it raised {type(e).__name__}",
                hint=hint,
            ) from None
    if not math.isfinite(number):
        raise ConfigError(
            f"reward {r.label!r} returned {_shown(value)} {where}, not a finite number{also}",
            hint=hint,
        )
    if abs(number) > REWARD_LIMIT:
        raise _out_of_range(r, value, where)
    return number


def _out_of_range(r: Reward, value: object, where: str) -> ConfigError:
    return ConfigError(
        f"reward {r.label!r} returned {_shown(value)} {where}, outside "
        f"the range ±{REWARD_LIMIT:g} a reward's value must lie in",
        hint="a reward returns a float such as 0.0 or 1.0 (GRPO uses only "
        "the differences within a group)",
    )


def _per_sample(r: Reward, samples: Sequence[Sample], i: int) -> float:
    s = samples[i]
    try:
        value = r.fn(s.completion, s.gold)
    except BaseException as e:  # SystemExit too: a reward that exits is named
        raise _failed(r, e, _where(samples, i)) from e
    return _number(r, value, False, _where(samples, i))


def _batched(r: Reward, samples: Sequence[Sample]) -> np.ndarray:
    kwargs = _trl_kwargs(samples)
    if r.accepts is not None:
        kwargs = {k: v for k, v in kwargs.items() if k in r.accepts}
    try:
        values = r.fn(**kwargs)
    except BaseException as e:  # SystemExit too: a reward that exits is named
        raise _failed(r, e, _where(samples, None)) from e
    try:  # as TRL reads it: iterated, one value per completion
        items = None if isinstance(values, (str, bytes)) else list(values)  # type: ignore[call-overload]  # user code
    except Exception:  # not iterable (a float, a 0-d array), or its iteration raised
        items = None
    if items is None:
        raise ConfigError(
            f"reward {r.label!r} returned {_shown(values)} "
            f"{_where(samples, None)}, not a list with one value per completion",
            hint="a TRL-style reward returns [float or None, ...], one per completion",
        )
    if len(items) != len(samples):
        raise ConfigError(
            f"reward {r.label!r} returned {len(items)} values for {len(samples)} completions",
            hint="return one value (float or None) per completion, in order",
        )
    return np.array(
        [_number(r, v, True, _where(samples, i)) for i, v in enumerate(items)], np.float64
    )


def _trl_kwargs(samples: Sequence[Sample]) -> dict[str, Any]:
    """TRL's keywords: ``prompts`` and ``completions`` (plain text, or chat turns for
    a conversational row, as TRL passes them), ``completion_ids``, and every column
    as a list (``question`` and ``answer`` always; a row without a column gives None).
    """
    conversational = any(s.messages is not None for s in samples)
    if conversational:
        prompts: list[Any] = [
            list(s.messages)
            if s.messages is not None
            else [{"role": "user", "content": s.question}]
            for s in samples
        ]
        completions: list[Any] = [[{"role": "assistant", "content": s.completion}] for s in samples]
    else:
        prompts = [s.question for s in samples]
        completions = [s.completion for s in samples]
    rows = [{"question": s.question, "answer": s.gold, **s.columns} for s in samples]
    names = [k for k in dict.fromkeys(k for row in rows for k in row) if k not in _RESERVED]
    out: dict[str, Any] = {k: [row.get(k) for row in rows] for k in names}
    out.update(
        prompts=prompts,
        completions=completions,
        completion_ids=[
            list(s.completion_ids) if s.completion_ids is not None else None for s in samples
        ],
    )
    return out
