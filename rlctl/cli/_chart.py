"""The learning curve as text: one sparkline per series, for ``rlctl status RUN``.

Pure: a ``Curve`` and a width in, plain lines out (no colour, no markup), so the same
lines read on a terminal, in a pipe and in a CI log. Each series is scaled to its own
min..max, because reward, accuracy and loss live on different scales and what a
reader wants from a glance is the shape; the numbers beside it (last, min, max) give
the scale back. More steps than columns are averaged into one mark per bucket.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from rlctl.core.runs.curve import Curve

BLOCKS = "▁▂▃▄▅▆▇█"
ASCII_BLOCKS = "_.-:=+*#"  # where the output's encoding has no block characters
LABELS = {
    "reward_mean": "reward",
    "accuracy": "accuracy",
    "loss": "loss",
    "entropy": "entropy",
    "kl": "kl",
    "clip_fraction": "clipped",
}
LABEL_WIDTH = 10  # "accuracy" plus a space, and "held-out"
# a reward's name under "reward", indented one: the column widens to show it whole, up
# to this many characters (longer ones are cut, so the marks keep most of the width)
REWARD_LABEL = 24
INDENT = "  "
MIN_SPARK = 8  # narrower than this, the numbers go on a line of their own


def num(v: float | None) -> str:
    """A value as the chart prints it: 3 decimals, or 3 significant digits when that
    would print a tiny loss as 0.000 (or a huge one too wide)."""
    if v is None:
        return "-"
    if v == 0 or 1e-3 <= abs(v) < 1e4:
        return f"{v:.3f}"
    return f"{v:.2e}"


def buckets(values: list[float | None], cells: int) -> list[float | None]:
    """``values`` squeezed into at most ``cells`` marks, each the mean of its share
    of the steps (None where a share has no value)."""
    n = len(values)
    if n <= cells:
        return list(values)
    out: list[float | None] = []
    for i in range(cells):
        part = [v for v in values[i * n // cells : (i + 1) * n // cells] if v is not None]
        out.append(sum(part) / len(part) if part else None)
    return out


def sparkline(values: list[float | None], blocks: str = BLOCKS) -> str:
    """One mark per value, its height scaled to the values' min..max; a gap (space)
    for a missing value; a flat series sits in the middle."""
    present = [v for v in values if v is not None]
    if not present:
        return " " * len(values)
    lo, hi = min(present), max(present)
    top = len(blocks) - 1
    marks = []
    for v in values:
        if v is None:
            marks.append(" ")
        elif hi == lo:
            marks.append(blocks[top // 2])
        else:
            marks.append(blocks[round((v - lo) / (hi - lo) * top)])
    return "".join(marks)


def _stats(values: list[float | None]) -> tuple[str, str, str]:
    present = [v for v in values if v is not None]
    if not present:
        return "-", "-", "-"
    return num(present[-1]), num(min(present)), num(max(present))


def _eval_lines(curve: Curve, width: int, arrow: str, more: str) -> list[str]:
    """``held-out  baseline 0.219 → step-10 0.400 → final 0.547``; with too many evals
    for the width, the first and the last ones around an ellipsis; narrower still,
    one eval a line."""
    if not curve.eval:
        return []
    head = f"{INDENT}{'held-out':<{label_width(curve)}}"
    # the run's headline: accuracy where it scores with 'correct', else its reward
    value = (lambda p: p.accuracy) if curve.scores_accuracy else (lambda p: p.reward)
    parts = [f"{p.which} {num(value(p))}" for p in curve.eval]
    for keep in range(len(parts) - 1, 0, -1):
        shown = parts if keep == len(parts) - 1 else [*parts[:1], more, *parts[len(parts) - keep :]]
        line = head + arrow.join(shown)
        if len(line) <= width:
            return [line]
    return [head + parts[0], *(" " * len(head) + p for p in parts[1:])]


def _numbers_below(stats: tuple[str, str, str], width: int) -> list[str]:
    """last/min/max under a series' marks on a narrow terminal: one line, or two."""
    pad = INDENT * 2
    last, lo, hi = stats
    one = f"{pad}last {last}  min {lo}  max {hi}"
    return [one] if len(one) <= width else [f"{pad}last {last}", f"{pad}min {lo}  max {hi}"]


def label_width(curve: Curve) -> int:
    """The label column: LABEL_WIDTH, or wide enough for the run's reward names (each
    indented one, a space after), up to REWARD_LABEL."""
    longest = max((len(n) for n in curve.rewards), default=0)
    return max(LABEL_WIDTH, min(longest, REWARD_LABEL - 1) + 2)


def _cut(name: str, width: int, more: str) -> str:
    return name if len(name) <= width else name[: width - len(more)] + more


def curve_lines(curve: Curve, width: int = 80, ascii_only: bool = False) -> list[str]:
    """The chart of ``curve`` as lines no wider than ``width``; [] for a run with no
    step and no eval yet.

    ``ascii_only`` draws with ASCII marks and arrows, for an output whose encoding
    cannot print the block characters.
    """
    from rlctl.core.runs.curve import POLICY

    blocks = ASCII_BLOCKS if ascii_only else BLOCKS
    arrow, more = (" -> ", "...") if ascii_only else (" → ", "…")
    # each reward's own mean under the summed reward, so a reader sees which one moved;
    # accuracy where the run scores with 'correct'; the policy's entropy, KL and clip
    # fraction where they say something, not the loss (near zero by construction)
    keys = [
        "reward_mean",
        *curve.reward_keys(),
        *(["accuracy"] if curve.scores_accuracy else []),
        *(k for k in POLICY if curve.informative(k)),
    ]
    width_of_labels = label_width(curve)
    labels = {
        **LABELS,
        **{
            f"rewards/{name}/mean": " " + _cut(name, REWARD_LABEL - 1, more)
            for name in curve.rewards
        },
    }
    n = len(curve.step)
    if not n and not curve.eval:
        return []
    lines = []
    if n:
        stats = {k: _stats(curve.series(k)) for k in keys}
        w_last, w_min, w_max = (max(len(s[i]) for s in stats.values()) for i in range(3))
        text = {
            k: f"last {a:>{w_last}}  min {b:>{w_min}}  max {c:>{w_max}}"
            for k, (a, b, c) in stats.items()
        }
        stats_len = max(len(t) for t in text.values())
        lead = len(INDENT) + width_of_labels
        cells = width - lead - 2 - stats_len
        own_line = cells < MIN_SPARK  # a narrow terminal: numbers below the marks
        if own_line:
            cells = max(1, width - lead)
        marks = min(n, cells)
        per = "" if marks == n else f", a mark per ~{n / marks:.3g} steps"
        span = f"step {curve.step[0]}" if n == 1 else f"steps {curve.step[0]}-{curve.step[-1]}"
        lines.append(f"learning curve, {span}{per}")
        for k in keys:
            spark = sparkline(buckets(curve.series(k), marks), blocks)
            row = f"{INDENT}{labels[k]:<{width_of_labels}}{spark}"
            if own_line:
                lines += [row, *_numbers_below(stats[k], width)]
            else:
                lines.append(f"{row}  {text[k]}")
        first, last = str(curve.step[0]), str(curve.step[-1])
        axis = (
            first
            if n == 1 or marks < len(first) + len(last) + 1
            else first + last.rjust(marks - len(first))
        )
        lines.append(f"{INDENT}{'step':<{width_of_labels}}{axis}")
    else:
        lines.append("learning curve: no step yet")
    lines += _eval_lines(curve, width, arrow, more)
    return [line[:width].rstrip() for line in lines]
