"""``metrics.jsonl`` read back: the rows that can be the run's, and each line that
cannot, named by its line number.

The trainer appends one row per optimizer step, steps 1, 2, 3... in order; a resume
first cuts the rows its checkpoint does not hold (``MetricsWriter.truncate_after``).
So a row whose step is not a whole number from 1, is not after the row before it,
or is beyond the run's steps, was not written by that trainer: bytes appended by
something else, a file copied over, a row edited by hand. Such a row is damage, and
never the run's progress (#57: one row ``{"step": 99}`` made a 6-step run at
checkpoint 2 read as 99/6, and ``status`` hint ``resume --steps N (N > 99)``).

A last line without its newline is a write in progress, or one a kill cut: normal,
not damage.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from rlctl.core.store.base import METRICS, RunDir


@dataclass
class MetricsRows:
    """The rows that can be the run's, one per step in step order, and what is wrong
    with each line that cannot, by line number."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def after(self, step: int) -> int:
        """How many of the rows are of steps after ``step`` (the latest checkpoint's:
        steps a resume repeats)."""
        return sum(1 for r in self.rows if r["step"] > step)

    @property
    def damaged(self) -> str | None:
        """The first problem, with the count of the others: one line."""
        if not self.problems:
            return None
        more = len(self.problems) - 1
        tail = f" (and {more} more line{'s' if more > 1 else ''})" if more else ""
        return f"{METRICS} {self.problems[0]}{tail}"


def _step(row: dict[str, Any]) -> int | None:
    step = row.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def check_rows(text: str, steps: int | None, garbled: bool = False) -> MetricsRows:
    """The rows of ``text`` (metrics.jsonl) checked against ``steps`` (the most steps
    the run may have: None, unknown). A row out of order is damage, yet kept, as a
    resume keeps it (``truncate_after``: one row per step, the last written winning);
    a row with no step, or a step outside 1..``steps``, is not. ``garbled``: the file
    was not UTF-8, its bad bytes replaced by U+FFFD, and a line holding one is
    damage even if it parses."""
    out = MetricsRows()
    lines = text.splitlines()
    by_step: dict[int, dict[str, Any]] = {}
    last = 0
    for n, line in enumerate(lines, start=1):
        torn = n == len(lines) and not text.endswith("\n")
        row, why = _parse(line, garbled, torn)
        if row is None:
            if why:  # else blank, or a torn last line
                out.problems.append(f"line {n} {why}")
            continue
        step = _step(row)
        if step is None:
            out.problems.append(f"line {n} has no step number")
            continue
        if step < 1:
            out.problems.append(f"line {n}: step {step} is not a step (they count from 1)")
            continue
        if steps is not None and step > steps:
            out.problems.append(f"line {n}: step {step} is beyond the run's {steps} steps")
            continue
        if step <= last:
            out.problems.append(f"line {n}: step {step} is out of order (after step {last})")
        by_step[step] = row
        last = max(last, step)
    out.rows = [by_step[k] for k in sorted(by_step)]
    return out


def _parse(line: str, garbled: bool, torn: bool) -> tuple[dict[str, Any] | None, str]:
    """(the row, "") when ``line`` is a JSON object; (None, "") when it is nothing to
    count (blank, or a torn last line); else (None, what it is instead)."""
    if garbled and "\ufffd" in line:  # may still parse ('"\ufffd\ufffdss": 0.1')
        return None, "is not UTF-8 text"
    try:
        row = json.loads(line)
    except RecursionError:  # bytes not ours, nested too deeply to read
        return None, "is not JSON"
    except json.JSONDecodeError:
        return None, "" if torn or not line.strip() else "is not JSON"
    return (row, "") if isinstance(row, dict) else (None, "is not a JSON object")


def read_rows(run: RunDir, steps: int | None) -> MetricsRows:
    """The run's metrics.jsonl checked (``check_rows``); none when it has none."""
    if not run.exists(METRICS):
        return MetricsRows()
    try:
        return check_rows(run.read_text(METRICS), steps)
    except UnicodeDecodeError as e:  # the bad bytes become U+FFFD: their line is damage
        return check_rows(bytes(e.object).decode("utf-8", errors="replace"), steps, garbled=True)
    except OSError as e:  # a folder where the file should be
        return MetricsRows(problems=[f"cannot be read ({e.strerror or type(e).__name__})"])
