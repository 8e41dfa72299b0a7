"""What a run's numbers lead with: its own rewards, and accuracy only where it is one.

A run scores completions with the reward functions of its spec (``rewards``); the
built-in ``accuracy`` (a correct final answer) is a reward of the run only when the run
uses the built-in ``correct``. So the step lines, the eval lines, the end summary and
``status`` show the weighted total and each reward by name, and accuracy (with the
format rate beside it) only for a run that scores with ``correct``: a run trained on
a reward of its own sees that reward, held out and per step, never an accuracy of 0
it was not trained for. Pure: metrics rows and eval records in, words out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

BUILT_IN = ("correct", "format")  # the default rewards, whose headline is accuracy
_REWARD_KEY = re.compile(r"^rewards/(.+)/mean$")


def step_rewards(metrics: Mapping[str, Any]) -> dict[str, float | None]:
    """Each reward's mean in a metrics row (``rewards/<name>/mean``), in its order."""
    return {
        m.group(1): v
        for k, v in metrics.items()
        if isinstance(k, str) and (m := _REWARD_KEY.match(k))
    }


def eval_rewards(record: Mapping[str, Any]) -> dict[str, float | None]:
    """Each reward's mean in an eval record (its ``rewards`` mapping)."""
    got = record.get("rewards")
    return dict(got) if isinstance(got, Mapping) else {}


def scores_accuracy(names: list[str] | Mapping[str, Any]) -> bool:
    """Whether the run's rewards include the built-in ``correct``, whose mean is the
    accuracy. A row that names no reward (written before rewards were named) does."""
    return not names or "correct" in names


def own_rewards(names: list[str] | Mapping[str, Any]) -> list[str]:
    """The rewards shown one by one: all of them, but for the built-in pair, whose
    accuracy and format rate already say it."""
    listed = list(names)
    return [] if set(listed) <= set(BUILT_IN) else listed


def _num(v: Any) -> str:
    return "-" if not isinstance(v, (int, float)) or isinstance(v, bool) else f"{v:.3f}"


def step_parts(metrics: Mapping[str, Any]) -> list[str]:
    """``reward 0.519``, then each of the run's own rewards, then ``accuracy 0.250``
    where the run scores with ``correct``."""
    rewards = step_rewards(metrics)
    parts = [f"reward {_num(metrics.get('reward_mean', 0))}"]
    parts += [f"{name} {_num(rewards[name])}" for name in own_rewards(rewards)]
    if scores_accuracy(rewards):
        parts.append(f"accuracy {_num(metrics.get('accuracy', 0))}")
    return parts


def pipeline_parts(metrics: Mapping[str, Any]) -> list[str]:
    """A pipelined run's step (rollout.placement=split or max_staleness >= 1): the
    versions its batch lagged, each half's busy share, the weight push's seconds;
    nothing for any other run."""
    if "staleness" not in metrics:
        return []
    parts = [f"stale {metrics['staleness']}"]
    for key, word in (("generator_busy", "gen"), ("learner_busy", "learn")):
        if isinstance(metrics.get(key), (int, float)):
            parts.append(f"{word} {metrics[key]:.0%}")
    if isinstance(metrics.get("weight_push_seconds"), (int, float)):
        parts.append(f"push {metrics['weight_push_seconds']:.2f}s")
    if metrics.get("dropped_samples"):
        parts.append(f"dropped {metrics['dropped_samples']}")
    return parts


def eval_parts(record: Mapping[str, Any]) -> list[str]:
    """An eval's numbers in the same order: accuracy and format for a run that scores
    with ``correct``; else the reward total and each reward."""
    rewards = eval_rewards(record)
    if scores_accuracy(rewards):
        return [
            f"accuracy {_num(record.get('accuracy'))}",
            f"format {_num(record.get('format_rate'))}",
        ]
    return [
        f"reward {_num(record.get('mean_reward'))}",
        *(f"{name} {_num(rewards[name])}" for name in own_rewards(rewards)),
    ]


def held_out(baseline: Mapping[str, Any], final: Mapping[str, Any]) -> str:
    """The end summary's line: the headline before and after training, held out."""
    n = final.get("n")
    rewards = eval_rewards(final)
    if scores_accuracy(rewards):
        return (
            f"held-out accuracy {_num(baseline.get('accuracy'))} -> "
            f"{_num(final.get('accuracy'))} (n={n}); format "
            f"{_num(baseline.get('format_rate'))} -> {_num(final.get('format_rate'))}"
        )
    before = eval_rewards(baseline)
    own = own_rewards(rewards)
    if len(own) == 1:  # the run's one reward, by its name
        return f"held-out {own[0]} {_num(before.get(own[0]))} -> {_num(rewards[own[0]])} (n={n})"
    each = [f"{name} {_num(before.get(name))} -> {_num(rewards[name])}" for name in own]
    return (
        f"held-out reward {_num(baseline.get('mean_reward'))} -> "
        f"{_num(final.get('mean_reward'))} (n={n}); {', '.join(each)}"
    )
