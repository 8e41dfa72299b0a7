"""Which columns of a dataset hold the prompt and the gold answer, and each row as a Problem.

The rule, in the words of TRL's dataset formats (huggingface/trl
``docs/source/dataset_formats.md``: "standard" rows hold text, "conversational" rows
a list of ``{"role", "content"}`` messages):

- the prompt is ``data.prompt_column``, else the first of ``prompt``, ``question``,
  ``problem``, ``query``, ``messages`` the data has; it is text, or a conversation;
- the gold answer is ``data.answer_column``, else the first of ``answer``,
  ``solution``, ``ground_truth``, ``final_answer``, ``target``, ``label``; without
  one, a conversation whose last turn is the assistant's holds it there (an SFT-style
  ``messages`` row: the turns before it are the prompt);
- a conversation's last assistant turn is never part of the prompt (it is the
  reference reply), and its last user turn is the row's ``question``.

The answer is what ``rewards.gold_answer`` accepts (GSM8K's ``... #### N`` or a
number); a dataset without an answer column cannot be trained on by rlctl's rewards.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rlctl.core.errors import ConfigError
from rlctl.core.trainer.data.problem import Problem
from rlctl.core.trainer.rewards import gold_answer

PROMPT_COLUMNS = ("prompt", "question", "problem", "query", "messages")
ANSWER_COLUMNS = ("answer", "solution", "ground_truth", "final_answer", "target", "label")
FLAGS = "--set data.prompt_column=COLUMN --set data.answer_column=COLUMN"


@dataclass(frozen=True)
class Layout:
    """The columns a dataset's rows are read from. ``answer`` None: the answer is the
    last (assistant) turn of the conversation in ``prompt``."""

    prompt: str
    answer: str | None


def column_names(rows: Iterable[tuple[str, Any]]) -> list[str]:
    """The columns of the rows that are mappings, in the order they first appear."""
    seen: dict[str, None] = {}
    for _, row in rows:
        if isinstance(row, Mapping):
            seen.update((k, None) for k in row if isinstance(k, str))
    return list(seen)


def choose(
    columns: list[str],
    first: Any,
    source: str,
    prompt_column: str | None,
    answer_column: str | None,
    where: str | None = None,
) -> Layout:
    """The layout of a dataset with ``columns`` whose first row is ``first``, or a
    ConfigError that names the columns it has and the settings that map them."""
    found = ", ".join(columns) if columns else "none"
    for key, name in (("prompt_column", prompt_column), ("answer_column", answer_column)):
        if name is not None and name not in columns:
            raise ConfigError(
                f"data.{key}={name!r} is not a column of {source} (its columns: {found})",
                hint=f"name its columns with {FLAGS}",
            )
    prompt = prompt_column or next((c for c in PROMPT_COLUMNS if c in columns), None)
    answer = answer_column or next(
        (c for c in ANSWER_COLUMNS if c in columns and c != prompt), None
    )
    if prompt is None:
        raise ConfigError(
            f"{source} has no prompt column (its columns: {found}; looked for "
            f"{', '.join(PROMPT_COLUMNS)}): set data.prompt_column"
            + ("" if answer else " and data.answer_column"),
            hint=f"e.g. {FLAGS}",
        )
    conversation = isinstance(first, Mapping) and _is_conversation(first.get(prompt))
    if answer is None and not conversation and isinstance(first, Mapping):
        # a conversation meant, but malformed: say that, not "no answer column"
        bad = conversation_problem(first.get(prompt), prompt)
        if bad is not None and where is not None:
            raise ConfigError(f"{where}: {bad}", hint=CONVERSATION)
    if answer is None and not conversation:
        raise ConfigError(
            f"{source} has no answer column (its columns: {found}; looked for "
            f"{', '.join(ANSWER_COLUMNS)}): set data.answer_column",
            hint="rlctl's rewards compare against a gold answer per row ('... #### N' or "
            "a number): --set data.answer_column=COLUMN",
        )
    return Layout(prompt, answer)


def _is_conversation(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in value)
    )


ROLES = ("system", "user", "assistant", "tool")  # what chat templates render
CONVERSATION = (
    'a conversation is a list of {"role": "system" | "user" | "assistant", '
    '"content": TEXT} messages'
)


def conversation_problem(value: Any, column: str) -> str | None:
    """What is wrong with a prompt that is meant as a conversation (a list, or one
    message alone), or None when it is a good one: ``'messages'[1] has no
    'content'`` rather than "holds a array, not text or a conversation" (#47)."""
    if isinstance(value, Mapping) and ("role" in value or "content" in value):
        return (
            f"{column!r} holds one message, not a list of them: write "
            '[{"role": ..., "content": ...}]'
        )
    if not isinstance(value, list):
        return None
    if not value:
        return f"{column!r} is an empty conversation"
    for i, m in enumerate(value):
        at = f"{column!r}[{i}]"
        if not isinstance(m, Mapping):
            kind = _KINDS.get(type(m), type(m).__name__)
            return f'{at} is a {kind}, not a message {{"role": ..., "content": ...}}'
        for key in ("role", "content"):
            if key not in m:
                return f"{at} has no {key!r}"
        if m["role"] not in ROLES:
            return f"{at} has role {m['role']!r}, not one of {', '.join(ROLES)}"
        if not isinstance(m["content"], str):
            kind = _KINDS.get(type(m["content"]), type(m["content"]).__name__)
            return f"{at}'s content is a {kind}, not text"
    return None


_KINDS = {
    list: "array",
    str: "string",
    bool: "boolean",
    int: "number",
    float: "number",
    type(None): "null",
}


def not_a_mapping(where: str, row: Any) -> ConfigError:
    kind = _KINDS.get(type(row), type(row).__name__)
    return ConfigError(
        f"{where}: a JSON {kind}, not an object of columns", hint="write one JSON object per line"
    )


def to_problem(row: Any, where: str, layout: Layout) -> Problem:
    """One row as a Problem, or a ConfigError that says what is wrong with it."""
    if not isinstance(row, Mapping):
        raise not_a_mapping(where, row)
    for col in (layout.prompt, layout.answer):
        if col is not None and row.get(col) is None:
            raise ConfigError(
                f"{where}: no field {col!r}" if col not in row else f"{where}: {col!r} is empty",
                hint=f"every row needs its prompt and answer; {FLAGS}",
            )
    value = row[layout.prompt]
    bad = conversation_problem(value, layout.prompt)
    if bad is not None:
        raise ConfigError(f"{where}: {bad}", hint=CONVERSATION)
    messages: tuple[dict[str, str], ...] | None = None
    raw_answer = row.get(layout.answer) if layout.answer else None
    if _is_conversation(value):
        turns = [{"role": str(m["role"]), "content": str(m["content"])} for m in value]
        if turns[-1]["role"] == "assistant":
            last = turns.pop()
            if raw_answer is None:
                raw_answer = last["content"]
        if raw_answer is None:
            raise ConfigError(
                f"{where}: the conversation's last turn is the "
                f"{turns[-1]['role']}'s, not the assistant's answer",
                hint="--set data.answer_column=COLUMN",
            )
        users = [t["content"] for t in turns if t["role"] == "user"]
        if not users:
            raise ConfigError(f"{where}: the conversation in {layout.prompt!r} has no user turn")
        question, messages = users[-1], tuple(turns)
    elif isinstance(value, str):
        question = value
    else:
        kind = _KINDS.get(type(value), type(value).__name__)
        raise ConfigError(
            f"{where}: {layout.prompt!r} holds a {kind}, not text or a conversation",
            hint="set data.prompt_column to the prompt's column",
        )
    if isinstance(raw_answer, (Mapping, list, tuple)):
        # an object's text ("{'n': 1}") parses as math once expressions are golds
        kind = _KINDS.get(type(raw_answer), "object")
        raise ConfigError(
            f"{where}: the answer ({layout.answer or 'last turn'!r}) is a JSON "
            f"{'object' if isinstance(raw_answer, Mapping) else kind}, not text "
            "or a number",
            hint='write it as text, e.g. "#### 7", "7" or "{1, 2}"',
        )
    raw = str(raw_answer)
    gold = gold_answer(raw)
    if gold is None:
        _, sep, tail = raw.rpartition("####")
        why = (
            f"no number after '####' in answer (got {tail.strip()[:40]!r})"
            if sep
            else f"answer {raw[-40:]!r} is neither a number nor an expression math-verify can parse"
        )
        raise ConfigError(
            f"{where}: {why}",
            hint="GSM8K answers end in '#### N'; plain answers are a number or "
            "a math expression (x^2+1, \\frac{1}{2}, {1,2})",
        )
    # str keys only: a CSV line with more fields than its header puts them under None
    columns = {k: v for k, v in row.items() if isinstance(k, str)}
    return Problem(question, gold, columns=columns, messages=messages, where=where)
