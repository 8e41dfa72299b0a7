"""Render trainer events on stderr: a live bar on a terminal, one line per step elsewhere.

Piped to a file or a CI log, a live bar only shows its last, truncated frame, so
outside a terminal each step is one plain line that reads well in ``tail -f``::

    step 3/20  reward 0.519  accuracy 0.250  loss -0.0000  10.5 s/step  eta 2m58s
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlctl.cli._output import Output

if TYPE_CHECKING:  # pragma: no cover
    from rlctl.core.runs.results import TrainResult


def _duration(seconds: float) -> str:
    s = max(0, round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def step_line(step: int, total: int, metrics: dict[str, Any], eta_seconds: float | None) -> str:
    """The plain one-line form of a finished step."""
    parts = [
        f"step {step}/{total}",
        f"reward {metrics.get('reward_mean', 0):.3f}",
        f"accuracy {metrics.get('accuracy', 0):.3f}",
        f"loss {metrics.get('loss', 0):+.4f}",
        f"{metrics.get('step_seconds', 0):.1f} s/step",
    ]
    if eta_seconds is not None:
        parts.append(f"eta {_duration(eta_seconds)}")
    return "  ".join(parts)


class TrainProgress:
    """Receives trainer events (dicts) and shows step, reward, loss and ETA."""

    def __init__(self, out: Output) -> None:
        self.out = out
        self.live = out.interactive
        self._progress = out.progress() if self.live else None
        self._task: Any = None
        self._total = 0
        self._step_seconds: list[float] = []

    def __enter__(self) -> TrainProgress:
        if self._progress is not None:
            self._progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)

    def _print(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False)
        else:
            self.out.info(text)

    def callback(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "message":
            self._print(event["message"])
        elif kind == "start":
            self._total = event["total_steps"]
            if self._progress is not None:
                self._task = self._progress.add_task(
                    event.get("name", "train"), total=self._total,
                    completed=event.get("step", 0), info="",
                )
            else:
                self._print(f"training {event.get('name', 'run')}: steps "
                            f"{event.get('step', 0) + 1}..{self._total}")
        elif kind == "step":
            self._step(event["step"], event["metrics"])
        elif kind == "eval":
            r = event["result"]
            self._print(
                f"eval/{event['which']}: accuracy {r['accuracy']:.3f}  "
                f"format {r['format_rate']:.3f}  (n={r['n']}, {r.get('seconds', 0):.0f}s)"
            )

    def _step(self, step: int, m: dict[str, Any]) -> None:
        self._step_seconds.append(float(m.get("step_seconds", 0)))
        if self._progress is not None:
            if self._task is None:
                return
            info = (
                f"reward {m.get('reward_mean', 0):.3f}  loss {m.get('loss', 0):+.4f}  "
                f"{m.get('step_seconds', 0):.1f}s/step"
            )
            self._progress.update(self._task, completed=step, info=info)
            return
        # steady-state pace: the first step of a process also compiles
        recent = self._step_seconds[1:] or self._step_seconds
        eta = sum(recent) / len(recent) * max(self._total - step, 0)
        self._print(step_line(step, self._total, m, eta))

    def summary(self, record: TrainResult) -> str:
        lines = [f"run {record.name}: {record.phase} at step {record.step}"]
        base, final = record.baseline, record.final
        if base and final:
            lines.append(
                f"held-out accuracy {base.accuracy:.3f} -> {final.accuracy:.3f} "
                f"(n={final.n}); format {base.format_rate:.2f} -> {final.format_rate:.2f}"
            )
        lines.append(f"files: {record.path}")
        return "\n".join(lines)
