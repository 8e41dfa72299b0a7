"""Render trainer events as a rich progress bar on stderr."""

from __future__ import annotations

from typing import Any

from rlctl.cli._output import Output


class TrainProgress:
    """Receives trainer events (dicts) and shows step, reward, loss and ETA."""

    def __init__(self, out: Output) -> None:
        self.out = out
        self._progress = out.progress()
        self._task: Any = None

    def __enter__(self) -> TrainProgress:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._progress.__exit__(*exc)

    def callback(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "message":
            self._progress.console.print(event["message"], highlight=False)
        elif kind == "start":
            self._task = self._progress.add_task(
                event.get("name", "train"), total=event["total_steps"],
                completed=event.get("step", 0), info="",
            )
        elif kind == "step" and self._task is not None:
            m = event["metrics"]
            info = (
                f"reward {m.get('reward_mean', 0):.3f}  loss {m.get('loss', 0):+.4f}  "
                f"{m.get('step_seconds', 0):.1f}s/step"
            )
            self._progress.update(self._task, completed=event["step"], info=info)
        elif kind == "eval":
            r = event["result"]
            self._progress.console.print(
                f"eval/{event['which']}: accuracy {r['accuracy']:.3f}  "
                f"format {r['format_rate']:.3f}  (n={r['n']}, {r.get('seconds', 0):.0f}s)",
                highlight=False,
            )

    def summary(self, record: dict[str, Any]) -> str:
        lines = [f"run {record['name']}: {record['phase']} at step {record['step']}"]
        base, final = record.get("baseline"), record.get("final")
        if base and final:
            lines.append(
                f"held-out accuracy {base['accuracy']:.3f} -> {final['accuracy']:.3f} "
                f"(n={final['n']}); format {base['format_rate']:.2f} -> {final['format_rate']:.2f}"
            )
        lines.append(f"files: {record['path']}")
        return "\n".join(lines)
