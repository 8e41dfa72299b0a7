"""Render trainer events on stderr: plain lines, and on a terminal one live line too.

Outside a terminal (CI, ``nohup``, a pipe) every phase, step and eval is one plain
line (``core.runs.log_lines``: the lines the run's ``train.log`` keeps), because a
live bar there only shows its last, truncated frame::

    loading model smollm2-135m-instruct
    evaluating baseline on 64 held-out prompts (1/4 batches)
    step 3/20  reward 0.519  accuracy 0.250  loss -0.0000  10.5 s/step  eta 2m58s

On a terminal the step, eval and message lines scroll by the same way, above one
live line: before step 1 the current phase (spinner, batches done, elapsed), which
stays behind as a line with its duration when the next begins; from the start of
training the run's bar, with an ETA computed from the step times.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rlctl.cli._output import Output
from rlctl.core.runs.log_lines import PlainLines, duration
from rlctl.core.trainer.runtime.events import PhaseEvent, parse_phase

if TYPE_CHECKING:  # pragma: no cover
    from rlctl.core.runs.results import TrainResult


class TrainProgress:
    """Receives trainer events (dicts) and shows phases, steps, evals and the ETA."""

    def __init__(self, out: Output) -> None:
        self.out = out
        self.live = out.interactive
        self._bar = out.train_bar() if self.live else None
        self._lines = PlainLines()
        self._task: Any = None  # the run's bar, from the "start" event on
        self._phase_task: Any = None  # the live line of the phase before it
        self._phase_text = ""
        self._phase_since = 0.0
        self._info = ""  # the run's line after its latest step (an eval shows, then this)

    def __enter__(self) -> TrainProgress:
        if self._bar is not None:
            self._bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def _print(self, text: str) -> None:
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False)
        else:
            self.out.info(text)

    def callback(self, event: dict[str, Any]) -> None:
        lines = self._lines.lines(event)
        if self._bar is None:
            for line in lines:
                self._print(line)
            return
        kind = event.get("event")
        if kind == "phase":
            self._phase(parse_phase(event))
            return
        if kind in ("start", "eval"):  # the phase it ends keeps its line, then this one's
            self._end_phase()
        if kind == "start":
            total, step = int(event["total_steps"]), int(event.get("step", 0))
            self._task = self._bar.add_task(
                event.get("name", "train"),
                total=total,
                completed=step,
                count=f"{step}/{total}",
                info="",
                eta="",
            )
        for line in lines:
            self._print(line)
        if kind == "step" and self._task is not None:
            self._step(int(event["step"]), event["metrics"])
        elif kind == "eval" and self._task is not None:
            self._bar.update(self._task, info=self._info)

    def _phase(self, p: PhaseEvent) -> None:
        assert self._bar is not None
        what = f"{p.text} ({p.count})" if p.count else p.text
        if self._task is not None:  # training: the run's own line says what it does
            self._bar.update(self._task, info=what)
            return
        if p.text != self._phase_text or self._phase_task is None:
            self._end_phase()
            self._phase_task = self._bar.add_task(p.text, total=p.total, count="", info="", eta="")
            self._phase_text, self._phase_since = p.text, time.monotonic()
        self._bar.update(self._phase_task, completed=p.done or 0, total=p.total, count=p.count)

    def _end_phase(self) -> None:
        """The phase's live line becomes a plain one with how long it took."""
        if self._bar is None or self._phase_task is None:
            return
        self._bar.remove_task(self._phase_task)
        self._phase_task = None
        self._print(f"{self._phase_text}  ({duration(time.monotonic() - self._phase_since)})")

    def _step(self, step: int, m: dict[str, Any]) -> None:
        assert self._bar is not None
        eta = self._lines.eta(step)
        total = self._lines.total
        from rlctl.core.runs.headline import pipeline_parts, step_parts

        self._info = "  ".join(
            [
                *step_parts(m),
                f"loss {m.get('loss', 0):+.4f}",
                f"{m.get('step_seconds', 0):.1f}s/step",
                *pipeline_parts(m),
            ]
        )
        self._bar.update(
            self._task,
            completed=step,
            count=f"{step}/{total}",
            info=self._info,
            eta="" if eta is None else f"eta {duration(eta)}",
        )

    def summary(self, record: TrainResult) -> str:
        lines = [f"run {record.name}: {record.phase} at step {record.step}"]
        base, final = record.baseline, record.final
        if base and final:
            from rlctl.core.runs.headline import held_out

            lines.append(held_out(base.model_dump(), final.model_dump()))
        lines.append(f"files: {record.path}")
        return "\n".join(lines)
