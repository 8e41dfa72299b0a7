"""File contents a case's ``write`` setup names (``content: data_row_is_list``): those
built from rows, too long, or not UTF-8, which YAML would only obscure. Short plain
text sits in the case itself (``text:``)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from bench.fuzz.registry import content

GOOD_ROWS = [{"question": f"What is {a} + 2?", "answer": a + 2} for a in range(10)]
ROWS = GOOD_ROWS[:8]  # issue #47's data files: 8 good rows, then the bad one


def jsonl(rows: Iterable[Any]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def _msgs(*extra: Any) -> str:
    """Six good chat rows, then a row for each of ``extra`` (its ``messages``)."""
    good = [
        {
            "messages": [
                {"role": "user", "content": f"{a} + 1?"},
                {"role": "assistant", "content": str(a + 1)},
            ]
        }
        for a in range(6)
    ]
    return jsonl([*good, *({"messages": m} for m in extra)])


# ------------------------------------------------------------------ config files

content("all_bytes_x4")(lambda: bytes(range(256)) * 4)
content("config_non_utf8")(lambda: b"training:\n  steps: \xff\xfe\n")

# ------------------------------------------------------------------ data (train)

content("data_non_utf8")(
    lambda: jsonl(GOOD_ROWS[:3]).encode() + b'{"question": "\xff\xfe", "answer": 1}\n'
)
content("data_row_is_list")(lambda: jsonl(GOOD_ROWS) + "[1, 2]\n")
content("data_row_invalid_json")(lambda: jsonl(GOOD_ROWS[:4]) + "{question: 1\n" + jsonl(GOOD_ROWS))
content("data_answer_not_number")(lambda: jsonl([*GOOD_ROWS, {"question": "q?", "answer": "five"}]))
content("data_answer_null")(lambda: jsonl([*GOOD_ROWS, {"question": "q?", "answer": None}]))
content("data_answer_object")(lambda: jsonl([*GOOD_ROWS, {"question": "q?", "answer": {"n": 1}}]))
content("data_question_number")(lambda: jsonl([{"question": 5, "answer": 1}, *GOOD_ROWS]))
content("data_utf8_bom")(lambda: b"\xef\xbb\xbf" + jsonl(GOOD_ROWS).encode())

# ------------------------------------------------------------------------- model

content("model_config_non_utf8")(lambda: b'{"a": "\xff"}')
content("nul_bytes_64")(lambda: b"\0" * 64)

# ----------------------------------------------------------- messages (issue #47)

content("long_line")(lambda: jsonl([*ROWS, {"question": "x" * 5_000_000, "answer": 3}]))
content("deep_jsonl")(lambda: jsonl(ROWS) + "[" * 100_000 + "]" * 100_000 + "\n")
content("deep_json_value")(lambda: '[{"question": ' + "[" * 5000 + "]" * 5000 + ', "answer": 1}]')
content("deep_yaml")(lambda: "a: " + "[" * 50_000 + "]" * 50_000 + "\n")
content("chat_no_content")(lambda: _msgs([{"role": "user"}]))
content("chat_bad_role")(lambda: _msgs([{"role": "bot", "content": "hi"}]))
content("chat_content_number")(lambda: _msgs([{"role": "user", "content": 5}]))
content("chat_empty")(lambda: _msgs([]))
content("chat_one_message")(lambda: _msgs({"role": "user", "content": "x"}))  # not a list

# ----------------------------------------------------------------------- rewards

REWARD_MODULE = """
def zero_args():
    return 1.0

def three_args(a, b, c):
    return 0.0

NOT_CALLABLE = 5

def returns_str(completion, gold):
    return "high"

def returns_nan(completion, gold):
    return float("nan")

def raises(completion, gold):
    raise ValueError("boom from my reward")

def returns_huge_int(completion, gold):
    return 10**400

def returns_just_out_of_range(completion, gold):
    return 1000001

class _NoFloat:
    def __float__(self):
        raise RuntimeError("no float for you")

def returns_no_float(completion, gold):
    return _NoFloat()

def returns_0d_array(completion, gold):
    import numpy as np
    return np.array(1.0)

def batch_returns_0d_array(prompts, completions, **kw):
    import numpy as np
    return np.array(1.0)

class _Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("str of the exception fails")

def raises_unprintable(completion, gold):
    raise _Unprintable()

def raises_keyboard_interrupt(completion, gold):
    raise KeyboardInterrupt
"""


FLAKY_REWARD = """
import os, sys

def flaky(completion, gold):
    # good until the file $BAD_AFTER exists (a checkpoint of the run), then $BAD_MODE
    if os.path.exists(os.environ.get("BAD_AFTER", "/nonexistent")):
        mode = os.environ.get("BAD_MODE", "value")
        if mode == "exit":
            sys.exit(3)
        if mode == "os-exit":
            os._exit(7)
        return float(os.environ["BAD_VALUE"])
    return sum(ch.isdigit() for ch in completion) / 10.0

def huge(completion, gold):
    return 1e308

def exits_at_once(completion, gold):
    sys.exit(0)

def noisy(completion, gold):
    print("scoring", repr(completion[:6]))
    os.write(1, b"raw bytes on descriptor 1\\n")
    return sum(ch.isdigit() for ch in completion) / 10.0
"""

content("reward_module")(lambda: REWARD_MODULE)
content("flaky_reward")(lambda: FLAKY_REWARD)
