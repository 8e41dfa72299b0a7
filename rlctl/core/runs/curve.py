"""A run's learning curve: the per-step series of metrics.jsonl and the held-out evals.

Pure: rows and eval records in, one ``Curve`` out; ``status.py`` reads them from the
run store (local or gs://) and the CLI draws them (sparklines, or a PNG). Values that
are not finite numbers (a missing key, ``NaN`` from a diverged step, a string written
by something else) become ``None``: a gap in the picture, and valid JSON for
``status RUN -o json`` (``NaN`` is not JSON).
"""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import BaseModel, Field

SERIES = ("reward_mean", "accuracy", "loss")  # every step's headline series
# the policy's state per step: what a GRPO run's loss does not say (it is near zero by
# construction), each drawn only where it carries information (not all zero)
POLICY = ("entropy", "kl", "clip_fraction")
SMOOTHING = 0.6  # TensorBoard's default weight of the exponential moving average
_STEP_EVAL = re.compile(r"^step-(\d+)$")
_REWARD_KEY = re.compile(r"^rewards/(.+)/mean$")  # each reward's per-step mean (TRL's key)


class EvalPoint(BaseModel):
    """One held-out eval (``eval/<which>.json``) as a point on the step axis."""

    which: str  # baseline, step-N, final
    step: int
    accuracy: float | None = None
    reward: float | None = None  # the weighted total's mean (mean_reward)
    rewards: dict[str, float | None] = Field(default_factory=dict)  # each reward's mean


class Curve(BaseModel):
    """Parallel lists, one entry per optimizer step in step order, plus the evals."""

    step: list[int] = Field(default_factory=list)
    reward_mean: list[float | None] = Field(default_factory=list)
    accuracy: list[float | None] = Field(default_factory=list)
    loss: list[float | None] = Field(default_factory=list)
    entropy: list[float | None] = Field(default_factory=list)
    kl: list[float | None] = Field(default_factory=list)
    clip_fraction: list[float | None] = Field(default_factory=list)
    # each reward's mean per step (metrics ``rewards/<name>/mean``), in the run's order
    rewards: dict[str, list[float | None]] = Field(default_factory=dict)
    eval: list[EvalPoint] = Field(default_factory=list)

    def series(self, key: str) -> list[float | None]:
        """A series by its metrics key: ``reward_mean``, ``rewards/correct/mean``, ..."""
        m = _REWARD_KEY.match(key)
        if m and m.group(1) in self.rewards:
            return self.rewards[m.group(1)]
        return getattr(self, key)

    def reward_keys(self) -> list[str]:
        return [f"rewards/{name}/mean" for name in self.rewards]

    @property
    def scores_accuracy(self) -> bool:
        """Whether accuracy is one of the run's rewards (the built-in ``correct``, or a
        run whose rows name no reward): else it is not drawn (``headline``)."""
        from rlctl.core.runs.headline import scores_accuracy

        names = list(self.rewards) or [n for e in self.eval for n in e.rewards]
        return scores_accuracy(names)

    def informative(self, key: str) -> bool:
        """Whether a series says anything: some value other than 0 (a run without a
        KL term logs kl 0, one update per rollout logs clip_fraction 0)."""
        return any(v not in (None, 0.0) for v in self.series(key))


def smooth(values: list[float | None], weight: float = SMOOTHING) -> list[float | None]:
    """TensorBoard's smoothing: an exponential moving average, debiased so the first
    values are not pulled toward 0; a gap stays a gap and does not break the average."""
    out: list[float | None] = []
    avg, norm = 0.0, 0.0
    for v in values:
        if v is None:
            out.append(None)
            continue
        avg = avg * weight + (1 - weight) * v
        norm = norm * weight + (1 - weight)
        out.append(avg / norm)
    return out


def number(value: Any) -> float | None:
    """``value`` as a finite float, else None (bools are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    v = float(value)
    return v if math.isfinite(v) else None


def eval_step(which: str, record: dict[str, Any]) -> int | None:
    """The step an eval was taken at: its record's ``step``, else what its name says
    (``baseline`` is before step 1, ``step-N`` after step N)."""
    step = record.get("step")
    if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
        return step
    if which == "baseline":
        return 0
    m = _STEP_EVAL.match(which)
    return int(m.group(1)) if m else None


def build_curve(rows: list[dict[str, Any]], evals: dict[str, dict[str, Any]]) -> Curve:
    """The curve of metrics ``rows`` (one per step; a step written twice keeps its
    last row) and ``evals`` (eval name -> record), evals ordered by step."""
    by_step: dict[int, dict[str, Any]] = {}
    for row in rows:
        s = row.get("step")
        if isinstance(s, int) and not isinstance(s, bool) and s >= 1:
            by_step[s] = row
    steps = sorted(by_step)
    points = []
    for which, record in evals.items():
        at = eval_step(which, record)
        if at is not None:
            each = record.get("rewards")
            each = each if isinstance(each, dict) else {}
            points.append(
                EvalPoint(
                    which=which,
                    step=at,
                    accuracy=number(record.get("accuracy")),
                    reward=number(record.get("mean_reward")),
                    rewards={str(k): number(v) for k, v in each.items()},
                )
            )
    order = {"baseline": 0, "final": 2}
    points.sort(key=lambda p: (p.step, order.get(p.which, 1)))
    names = dict.fromkeys(
        m.group(1)
        for s in steps
        for k in by_step[s]
        if isinstance(k, str) and (m := _REWARD_KEY.match(k))
    )
    rewards = {n: [number(by_step[s].get(f"rewards/{n}/mean")) for s in steps] for n in names}
    return Curve(
        step=steps,
        eval=points,
        rewards=rewards,
        **{k: [number(by_step[s].get(k)) for s in steps] for k in (*SERIES, *POLICY)},
    )
