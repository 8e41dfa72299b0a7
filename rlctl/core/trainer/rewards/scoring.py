"""Scoring a batch of completions with every reward, as TRL's GRPOTrainer does.

Each reward gives one value per completion or None ("does not apply to this one",
TRL's convention; NaN here). The training reward of a completion is the weighted sum
of the values that apply; each reward's own mean, over the completions it applies
to, is what ``metrics.jsonl`` logs as ``rewards/<name>/mean``. A reward that fails,
or returns anything but numbers and None, stops the run with its name: NaN would
silently poison the advantages.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlctl.core.errors import ConfigError
from rlctl.core.trainer.rewards.loading import Reward

# what a TRL-style reward gets besides the data's columns (which cannot shadow them)
_RESERVED = ("prompts", "completions", "completion_ids")


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


def score(rewards: Sequence[Reward], samples: Sequence[Sample]) -> Scored:
    n = len(samples)
    total = np.zeros(n, np.float64)
    per: dict[str, np.ndarray] = {}
    for r in rewards:
        values = _batched(r, samples) if r.batched else np.array(
            [_per_sample(r, s) for s in samples], np.float64)
        per[r.name] = values
        total += np.where(np.isnan(values), 0.0, r.weight * values)
    return Scored(total.astype(np.float32), per)


def total_reward(rewards: Sequence[Reward], completion: str, gold: str) -> float:
    """The weighted reward of one completion (a problem without columns)."""
    return float(score(rewards, [Sample(completion, "", gold, {})]).total[0])


def _failed(r: Reward, e: Exception) -> ConfigError:
    return ConfigError(f"reward {r.label!r} raised {type(e).__name__}: "
                       f"{(str(e).splitlines() or [''])[0][:160]}",
                       hint="fix the reward function, then 'rlctl resume' the run")


def _number(r: Reward, value: object, allow_none: bool) -> float:
    if value is None and allow_none:
        return math.nan
    try:  # numbers of any kind (numpy's too), but not the text "1.0"
        number = math.nan if isinstance(value, (str, bytes)) else float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number):
        also = " or None" if allow_none else ""
        raise ConfigError(f"reward {r.label!r} returned {str(value)[:40]!r}, not a finite "
                          f"number{also}", hint=f"a reward returns a float such as 0.0 or "
                          f"1.0{also}")
    return number


def _per_sample(r: Reward, s: Sample) -> float:
    try:
        value = r.fn(s.completion, s.gold)
    except Exception as e:
        raise _failed(r, e) from e
    return _number(r, value, allow_none=False)


def _batched(r: Reward, samples: Sequence[Sample]) -> np.ndarray:
    kwargs = _trl_kwargs(samples)
    if r.accepts is not None:
        kwargs = {k: v for k, v in kwargs.items() if k in r.accepts}
    try:
        values = r.fn(**kwargs)
    except Exception as e:
        raise _failed(r, e) from e
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise ConfigError(f"reward {r.label!r} returned a {type(values).__name__}, not a "
                          "list with one value per completion",
                          hint="a TRL-style reward returns [float or None, ...], one per "
                          "completion")
    if len(values) != len(samples):
        raise ConfigError(f"reward {r.label!r} returned {len(values)} values for "
                          f"{len(samples)} completions", hint="return one value (float or "
                          "None) per completion, in order")
    return np.array([_number(r, v, allow_none=True) for v in values], np.float64)


def _trl_kwargs(samples: Sequence[Sample]) -> dict[str, Any]:
    """TRL's keywords: ``prompts`` and ``completions`` (plain text, or chat turns for
    a conversational row, as TRL passes them), ``completion_ids``, and every column
    as a list (``question`` and ``answer`` always; a row without a column gives None).
    """
    conversational = any(s.messages is not None for s in samples)
    if conversational:
        prompts: list[Any] = [list(s.messages) if s.messages is not None
                              else [{"role": "user", "content": s.question}] for s in samples]
        completions: list[Any] = [[{"role": "assistant", "content": s.completion}]
                                  for s in samples]
    else:
        prompts = [s.question for s in samples]
        completions = [s.completion for s in samples]
    rows = [{"question": s.question, "answer": s.gold, **s.columns} for s in samples]
    names = [k for k in dict.fromkeys(k for row in rows for k in row) if k not in _RESERVED]
    out: dict[str, Any] = {k: [row.get(k) for row in rows] for k in names}
    out.update(prompts=prompts, completions=completions,
               completion_ids=[list(s.completion_ids) if s.completion_ids is not None
                               else None for s in samples])
    return out
