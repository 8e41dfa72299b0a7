"""A reward for rlctl: copy this file, rename the function, and name it in a run.

    rlctl train grpo --set 'rewards=["correct", "path/to/reward.py:has_units"]'

Two forms are accepted, told apart by the signature (rlctl/core/trainer/rewards/loading.py):
rlctl's own, once per completion, ``fn(completion, gold) -> float``, as here; or TRL's,
once per batch, ``fn(prompts, completions, **columns) -> list[float | None]``. A value
outside [-1e6, 1e6], NaN or an exception is one error line naming the sample.

To make it a built-in (``rewards: [has_units]``), add it to ``REGISTRY`` in
rlctl/core/trainer/rewards/loading.py with a test in tests/core/trainer/test_rewards.py.
tests/test_contributing.py loads this very file through rlctl's loader and scores it.
"""

from __future__ import annotations

import re

_UNIT = re.compile(r"\b\d+(?:\.\d+)?\s*(?:dollars|cents|hours|minutes|km|kg)\b")


def has_units(completion: str, gold: str) -> float:
    """1.0 when the completion states a number with a unit, else 0.0 (shaping: give it
    a small weight beside ``correct``)."""
    return 1.0 if _UNIT.search(completion) else 0.0
