"""Trainer events as the plain lines a log shows: one per phase, step and eval.

These lines are what stderr shows when it is not a terminal (CI, ``nohup``, a
pipe) and what the run's ``train.log`` keeps, so both read the same. Each step
line carries an ETA from the first finished step on::

    step 3/20  reward 0.519  accuracy 0.250  loss -0.0000  10.5 s/step  eta 2m58s
"""

from __future__ import annotations

import math
from typing import Any

from rlctl.core.runs.headline import eval_parts, pipeline_parts, step_parts
from rlctl.core.trainer.api import parse_phase

PACE_WINDOW = 10  # steady-state pace: the mean of this many recent steps
EVERY_BATCH_UP_TO = 20  # a longer eval logs about every tenth of its batches


def duration(seconds: float) -> str:
    s = max(0, round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def step_line(step: int, total: int, metrics: dict[str, Any], eta_seconds: float | None) -> str:
    """The plain one-line form of a finished step: the reward total, the run's own
    rewards by name, accuracy where the run scores with ``correct`` (``headline``)."""
    parts = [
        f"step {step}/{total}",
        *step_parts(metrics),
        f"loss {metrics.get('loss', 0):+.4f}",
        f"{metrics.get('step_seconds', 0):.1f} s/step",
        *pipeline_parts(metrics),
    ]
    if eta_seconds is not None:
        parts.append(f"eta {duration(eta_seconds)}")
    return "  ".join(parts)


def eval_line(which: str, r: dict[str, Any]) -> str:
    return f"eval/{which}: {'  '.join(eval_parts(r))}  (n={r['n']}, {r.get('seconds', 0):.0f}s)"


class Pace:
    """The seconds of this process's steps, and the time the rest will take."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.first: float | None = None  # the first step without its compiles, if known

    def add(self, seconds: float, compile_seconds: float | None = None) -> None:
        seconds = max(0.0, seconds)
        if not self.seconds and compile_seconds is not None:
            # what the first step would have taken without compiling: never less than
            # a tenth of it (a compile's seconds overlap the step's own work)
            self.first = max(seconds - compile_seconds, seconds / 10)
        self.seconds.append(seconds)

    def eta(self, step: int, total: int) -> float | None:
        """None before any step finished, and after the first one unless its compile
        seconds are known: it compiled (minutes on a CPU), so extrapolating it said
        'eta 1h52m' for a run of minutes (#53); it counts without them. From the
        second step on, the mean of the recent steps after the first, the steady pace."""
        left = max(total - step, 0)
        steady = self.seconds[1:][-PACE_WINDOW:]
        if steady:
            return sum(steady) / len(steady) * left
        if self.first is not None:
            return self.first * left
        return 0.0 if self.seconds and not left else None


def shown_in_log(done: int, total: int) -> bool:
    """Whether an eval's ``done``-th batch of ``total`` gets a line of its own."""
    return total <= EVERY_BATCH_UP_TO or done % math.ceil(total / 10) == 0 or done == total


class PlainLines:
    """Turns the trainer's events into plain lines; keeps the step count and pace."""

    def __init__(self) -> None:
        self.total = 0
        self.pace = Pace()

    def eta(self, step: int) -> float | None:
        return self.pace.eta(step, self.total)

    def lines(self, event: dict[str, Any]) -> list[str]:
        kind = event.get("event")
        if kind == "message":
            return [str(event["message"])]
        if kind == "phase":
            p = parse_phase(event)
            if p.in_progress and not shown_in_log(p.done or 0, p.total or 0):
                return []
            return [f"{p.text} ({p.count})" if p.count else p.text]
        if kind == "start":
            self.total = int(event["total_steps"])
            return [
                f"training {event.get('name', 'run')}: steps "
                f"{int(event.get('step', 0)) + 1}..{self.total}"
            ]
        if kind == "step":
            step, m = int(event["step"]), event["metrics"]
            compiled = event.get("compile_seconds")
            self.pace.add(
                float(m.get("step_seconds", 0)), None if compiled is None else float(compiled)
            )
            return [step_line(step, self.total, m, self.eta(step))]
        if kind == "eval":
            return [eval_line(event["which"], event["result"])]
        return []
