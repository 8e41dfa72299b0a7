"""The embedded default task: arithmetic word problems, generated from a seed.

SmolLM2-135M solves them sometimes (~0.2 greedy) but not mostly, so GRPO has reward
variance to learn from.
"""

from __future__ import annotations

import numpy as np

from rlctl.core.trainer.data.problem import Problem

_NAMES = ["Tom", "Sara", "Ali", "Mia", "Leo", "Ana", "Ben", "Zoe", "Sam", "Eva"]
_ITEMS = ["apples", "stickers", "marbles", "books", "coins", "pencils", "cards", "shells"]


def arithmetic(rng: np.random.Generator, max_operand: int) -> Problem:
    a, b = (int(x) for x in rng.integers(1, max_operand + 1, size=2))
    plus = bool(rng.integers(0, 2))
    if not plus and b > a:
        a, b = b, a
    answer = a + b if plus else a - b
    form = int(rng.integers(0, 3))
    if form == 0:
        q = f"What is {a} {'+' if plus else '-'} {b}?"
    else:
        name = _NAMES[int(rng.integers(len(_NAMES)))]
        item = _ITEMS[int(rng.integers(len(_ITEMS)))]
        if plus:
            q = f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?"
        else:
            q = f"{name} has {a} {item} and gives away {b}. How many {item} are left?"
    return Problem(q, str(answer), columns={"question": q, "answer": str(answer)})
