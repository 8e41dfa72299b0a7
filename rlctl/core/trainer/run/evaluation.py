"""Greedy evaluation on the held-out set: the figure a run is judged by.

Greedy decoding and a fixed batch shape make the result a function of the
weights alone, so the baseline, the periodic and the final evals compare.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rlctl.core.config.models import EvalSpec
from rlctl.core.trainer.data import Problem
from rlctl.core.trainer.rewards import Reward
from rlctl.core.trainer.rollout.rollout import Rollout, score

SCALARS = ("accuracy", "format_rate", "mean_reward")  # what TensorBoard plots of an eval


def scalars(result: dict[str, Any]) -> dict[str, Any]:
    """What TensorBoard plots of an eval record: ``SCALARS`` and each reward's mean."""
    out = {k: result[k] for k in SCALARS if k in result}
    for name, mean in (result.get("rewards") or {}).items():
        if mean is not None:
            out[f"rewards/{name}/mean"] = mean
    return out


def scalar_prefix(which: str) -> str:
    """TensorBoard tag prefix: baseline and final stand alone, the rest form one curve."""
    return f"eval_{which}" if which in ("baseline", "final") else "eval"


def evaluate(
    rollout: Rollout,
    model: Any,
    problems: list[Problem],
    reward_fns: list[Reward],
    e: EvalSpec,
    which: str,
    step: int,
    on_batch: Callable[[int, int], None] | None = None,
    say: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The eval record of ``model`` on ``problems`` (``eval/<which>.json``).

    ``on_batch(done, total)`` is called before the first batch and after each one:
    an eval can take a minute (its first batch compiles), and a user sees it move.
    ``say``: where the lines a reward prints go (the run's log)."""
    rollout.sync(model)
    t0 = time.perf_counter()
    texts: list[str] = []
    tokens: list[Any] = []
    batches = -(-len(problems) // e.batch_size)
    if on_batch is not None:
        on_batch(0, batches)
    for i in range(0, len(problems), e.batch_size):
        chunk = problems[i : i + e.batch_size]
        padded = chunk + [chunk[0]] * (e.batch_size - len(chunk))  # one compiled shape
        prompts, width = rollout.render(padded)
        out = rollout.sample(prompts, width, seed=0, greedy=True)
        texts.extend(out.text[: len(chunk)])
        tokens.extend(out.tokens[: len(chunk)])
        if on_batch is not None:
            on_batch(i // e.batch_size + 1, batches)
    scores = score(reward_fns, texts, problems, tokens, say)
    n = len(problems)
    return {
        "which": which,
        "step": step,
        "n": n,
        "accuracy": float(np.mean(scores.correct)) if n else 0.0,
        "format_rate": float(np.mean(scores.formatted)) if n else 0.0,
        "mean_reward": float(np.mean(scores.reward)) if n else 0.0,
        "rewards": scores.reward_means,  # each reward's mean (None: applied to none)
        "greedy": True,
        "seconds": round(time.perf_counter() - t0, 2),
        "samples": [
            {"question": p.question, "gold": p.answer, "completion": t, "correct": bool(c)}
            for p, t, c in list(zip(problems, texts, scores.correct))[: e.samples]
        ],
    }
