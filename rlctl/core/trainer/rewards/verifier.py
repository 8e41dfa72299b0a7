"""Math answers: the ``<answer>`` block of a completion, checked with math-verify.

The model is told to put its final answer in ``<answer>...</answer>``; only the
*last* such block counts, so a model cannot hedge with several answers. What is in
it is compared to the gold answer by math-verify (HuggingFace's verifier, the one
TRL's ``accuracy_reward`` uses): ``7``, ``7.0``, ``14/2`` and ``\\frac{14}{2}`` all
match a gold ``7``.

Pitfall: math-verify bounds each parse and comparison with ``signal.alarm`` by
default. That raises in any thread but the main one, and an alarm that fires depends
on the machine's load, so the same completion could score differently on a resumed
run. rlctl turns it off (``parsing_timeout=None``, ``timeout_seconds=None``) and keeps
what could run for ever out instead (``_tame``): an answer over ``MAX_ANSWER_CHARS``
characters, or a power tower such as ``9^9^9^9``, which sympy would try to evaluate
(measured: minutes), is not a match.

Measured on a shared 2-core CPU (arithmetic completions): 0.6-1.4 ms per
``correct_reward`` call when the answer is parsed for the first time, 0.15 ms when
its parse is cached; the first call in a process costs 1-2 s (importing
math-verify and sympy, done lazily, and the grammars' set-up).
"""

from __future__ import annotations

import functools
import re
from decimal import Decimal, InvalidOperation
from typing import Any

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_NUMBER = re.compile(r"^[-+]?\d+(\.\d+)?$")
_MATH_SIGN = re.compile(r"[0-9_^{}()\[\]+\-*/=<>|!]")  # text that is math, not words
MAX_ANSWER_CHARS = 200  # longer answers are not parsed: not a match, not formatted
_MAX_EXPONENT = 1000  # 2^1000 is fine to compare; 123456789^987654321 is not


def extract_answer(completion: str) -> str | None:
    """The text inside the last well-formed ``<answer>`` block, stripped."""
    blocks = _ANSWER.findall(completion)
    return blocks[-1].strip() if blocks else None


def normalize_number(text: str | None) -> str | None:
    """'$1,234.00' -> '1234'; '-0.50' -> '-0.5'; not a number -> None."""
    if text is None:
        return None
    t = text.strip().replace(",", "").replace("$", "").replace(" ", "")
    t = t.rstrip(".")
    if not _NUMBER.match(t):
        return None
    try:
        d = Decimal(t)
    except InvalidOperation:
        return None
    d = d.normalize()
    if d == d.to_integral_value():
        return str(int(d))
    return format(d, "f")


def _math_verify() -> Any:
    """The math_verify module, imported on first use (0.8 s), its timeout warning
    silenced: rlctl turns the alarm-based timeout off on purpose (module docstring)."""
    import logging

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    import math_verify

    return math_verify


def _tame(parsed: list[Any]) -> bool:
    """No part of ``parsed`` that sympy could spend minutes on: a power whose
    exponent is itself a power, or a number beyond ``_MAX_EXPONENT``."""
    from sympy import Basic, Pow

    for item in parsed:
        if not isinstance(item, Basic):
            continue
        for p in item.atoms(Pow):
            e = p.exp
            if e.has(Pow) or (e.is_Number and abs(e) > _MAX_EXPONENT):
                return False
    return True


@functools.lru_cache(maxsize=8192)
def parse_math(text: str) -> tuple[Any, ...]:
    """math-verify's parse of ``text``, or () when it holds no expression or one too
    costly to compare. A pure function of the text: cached, as each gold answer is
    compared once per completion of its group.

    A number (``7``, ``-0.5``, ``14/2``) is parsed as it is. Other text with a LaTeX
    command or a mathematical sign (an operator, a bracket) is parsed as inline math
    (``$...$``) first: math-verify's plain parse returns nothing for ``x^2+1`` or
    ``{1,2}`` and the last number of others (``2`` for ``2^{10}``, ``3`` for ``x=3``,
    ``1`` for ``x^2 + 1``), so such a gold answer could never be matched (#47). Words
    alone are never read as math, where any word parses, as a product of symbols."""
    text = text.strip()
    if not text or len(text) > MAX_ANSWER_CHARS:
        return ()
    mv = _math_verify()
    numberish = normalize_number(text) is not None or bool(_FRACTION.match(text))
    parsed: list[Any] = []
    if not numberish and ("\\" in text or _MATH_SIGN.search(text)):
        parsed = mv.parse(f"${text}$", parsing_timeout=None)
    if not parsed:
        parsed = mv.parse(text, parsing_timeout=None)
    return tuple(parsed) if parsed and _tame(parsed) else ()


def answers_match(gold: str, answer: str) -> bool:
    """math-verify: does ``answer`` equal ``gold`` (numbers, fractions, LaTeX, sets)?"""
    g, a = parse_math(gold), parse_math(answer)
    if not g or not a:
        return False
    return bool(_math_verify().verify(list(g), list(a), timeout_seconds=None))


def gold_answer(answer_field: str | int | float) -> str | None:
    """The gold answer of an answer field: after the last ``####`` (GSM8K) when there
    is one, else the whole field; a number is normalised ('1,200' -> '1200'), any
    other math expression (``\\frac{1}{2}``, ``x+1``) kept as written. None when it
    holds no expression math-verify can parse, so a data reader can say which row of
    which file is bad (gsm8k_gold's ValueError cannot)."""
    if isinstance(answer_field, bool):
        return None
    if isinstance(answer_field, (int, float)):
        answer_field = str(answer_field)
    _, sep, tail = answer_field.rpartition("####")
    text = (tail if sep else answer_field).strip()
    number = normalize_number(text)
    if number is not None:
        return number
    return text if parse_math(text) else None


def gsm8k_gold(answer_field: str) -> str:
    """GSM8K's gold answer is what follows ``####``."""
    value = gold_answer(answer_field)
    if value is None:
        raise ValueError(f"no answer after '####' in {answer_field[-60:]!r}")
    return value


_FRACTION = re.compile(r"^[-+]?\d+\s*/\s*\d+$")
_LATEX_FRACTION = re.compile(r"^\$?[-+]?\\[dt]?frac\s*\{\s*\d+\s*\}\s*\{\s*\d+\s*\}\$?$")


def one_number(text: str) -> bool:
    """Is ``text`` one number as written: ``7``, ``-0.5``, ``$1,200``, ``14/2`` or
    ``\\frac{14}{2}``, and not a sum, a list or a number with words?

    Why: the prompt asks for "the final answer as a number", and math-verify alone
    credits ``18 + 11`` (sympy adds it up), ``30, 29`` (a list ending in the gold) and
    ``7 apples`` against a gold 29 or 7. Measured on the default run (5 seeds): with
    that leniency the held-out gain fell from +0.30 to +0.23; a model rewarded for
    writing the sum learns less arithmetic, and one rewarded for a list learns to hedge."""
    return (
        normalize_number(text) is not None
        or bool(_FRACTION.match(text))
        or bool(_LATEX_FRACTION.match(text))
    )


def _answer_form(gold: str, answer: str) -> bool:
    """The answer has the form the gold asks for: one number for a numeric gold
    (``one_number``), any expression math-verify parses for any other gold."""
    if normalize_number(gold) is not None:
        return one_number(answer)
    return bool(parse_math(answer))


def correct_reward(completion: str, gold: str) -> float:
    """1.0 when the last ``<answer>`` block has the gold's form (``_answer_form``) and
    math-verify finds it equal to the gold answer."""
    got = extract_answer(completion)
    if got is None or not _answer_form(gold, got):
        return 0.0
    number = normalize_number(got)  # '$1,200' as '1200': math-verify reads '$' as LaTeX
    return 1.0 if answers_match(gold, got if number is None else number) else 0.0


def format_reward(completion: str, gold: str) -> float:
    """1.0 when the last ``<answer>`` block has the gold's form: one number for a
    numeric gold, a math expression for any other; else 0.0. The run config weighs
    it (0.1 by default: shaping, not the goal)."""
    got = extract_answer(completion)
    return 1.0 if got is not None and _answer_form(gold, got) else 0.0
