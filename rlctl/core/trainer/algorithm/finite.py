"""Finite or stopped: a step whose loss or gradient norm is not a finite number ends
the run there, before anything of it is saved.

A NaN or an infinity in the update poisons every weight it touches (Adam's moments
carry it into every later step), and the run then went on to its end, reported
``completed``, and its checkpoints exported NaN weights (#47). The values checked
are the ones every step already brings to the host for its metrics row (the loss
of each update and its gradient norm), so the check costs nothing on the device.
The rewards are checked where they enter (``rewards/scoring.py``), before any
update: a reward's value is finite and within ``REWARD_LIMIT``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rlctl.core.errors import NonFiniteError


def first_non_finite(values: Sequence[float]) -> float | None:
    """The first value of ``values`` that is NaN or infinite, else None."""
    for v in values:
        if not math.isfinite(v):
            return v
    return None


def resume_hint(run: str, latest: int | None) -> str:
    """Where a resume of ``run`` starts: its last finite checkpoint, or step 0."""
    start = f"from checkpoint {latest}" if latest else "from step 0 (no checkpoint yet)"
    return f"'rlctl resume {run}' continues {start}"


def check_update(
    step: int, losses: Sequence[float], norms: Sequence[float], run: str, latest: int | None
) -> None:
    """Raise NonFiniteError when step ``step`` (1-based) gave a non-finite loss or
    gradient norm: one line naming the value and where it came from."""
    for what, values in (("loss", losses), ("gradient norm", norms)):
        bad = first_non_finite(values)
        if bad is None:
            continue
        kept = (
            f"the last finite checkpoint, {latest}, is kept"
            if latest
            else "no checkpoint was saved yet"
        )
        raise NonFiniteError(
            f"step {step}: the {what} is {bad} (not finite): the run stopped before "
            f"saving step {step}; {kept}",
            hint=f"lower training.learning_rate or check the rewards and the model's "
            f"weights, then {resume_hint(run, latest)}",
        )
