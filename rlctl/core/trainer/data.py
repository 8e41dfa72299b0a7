"""Datasets of (question, gold answer) pairs, addressed by step for exact resume.

Training prompts for step ``k`` are a pure function of (seed, k), so a resumed
run draws exactly what an uninterrupted one would have, with no iterator state
to checkpoint. The embedded default is an arithmetic word-problem generator
that SmolLM2-135M solves sometimes (~0.2 greedy) but not mostly, so GRPO has
reward variance to learn from; GSM8K is the real benchmark.
"""

from __future__ import annotations

import codecs
import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlctl.core.config.models import DataSpec
from rlctl.core.errors import ConfigError
from rlctl.core.trainer.rewards import gold_answer


@dataclass(frozen=True)
class Problem:
    """One row of a task.

    ``question`` is the user's question text (the last user turn of a chat row): it
    keys the held-out split and is what ``status`` and the eval files show.
    ``answer`` is the gold answer text the built-in rewards compare against.
    ``columns`` is every column of the source row, under its own name, handed to
    TRL-style reward functions as ``**columns`` (one list per column per batch).
    ``messages`` is a conversational prompt taken from the data as it is; when set
    it replaces the configured system prompt and examples.
    """

    question: str
    answer: str
    columns: Mapping[str, object] = dataclasses.field(default_factory=dict, compare=False,
                                                     hash=False)
    messages: tuple[Mapping[str, str], ...] | None = dataclasses.field(
        default=None, compare=False, hash=False)


_NAMES = ["Tom", "Sara", "Ali", "Mia", "Leo", "Ana", "Ben", "Zoe", "Sam", "Eva"]
_ITEMS = ["apples", "stickers", "marbles", "books", "coins", "pencils", "cards", "shells"]


def _arithmetic(rng: np.random.Generator, max_operand: int) -> Problem:
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
    return Problem(q, str(answer))


class ProblemSource:
    """Train prompts by step, plus a fixed held-out set disjoint from training."""

    def __init__(self, train: list[Problem] | None, eval_set: list[Problem], spec: DataSpec):
        self._train = train
        self.eval_set = eval_set
        self.spec = spec
        self._eval_questions = {p.question for p in eval_set}

    @property
    def finite(self) -> bool:
        return self._train is not None

    def every_train(self) -> list[Problem]:
        """All training problems of a finite dataset (the generator has no end)."""
        return list(self._train or [])

    def batch(self, step: int, n: int) -> list[Problem]:
        rng = np.random.default_rng([self.spec.seed, 1, step])
        if self._train is None:  # generator: reject held-out questions
            out: list[Problem] = []
            while len(out) < n:
                p = _arithmetic(rng, self.spec.max_operand)
                if p.question not in self._eval_questions:
                    out.append(p)
            return out
        idx = rng.choice(len(self._train), size=n, replace=len(self._train) < n)
        return [self._train[int(i)] for i in idx]


def load_source(spec: DataSpec, eval_size: int) -> ProblemSource:
    if spec.name == "arithmetic":
        rng = np.random.default_rng([spec.seed, 2])
        seen: dict[str, Problem] = {}
        while len(seen) < eval_size:
            p = _arithmetic(rng, spec.max_operand)
            seen.setdefault(p.question, p)
        return ProblemSource(None, list(seen.values()), spec)
    train, held = _load_files(spec)
    if held is None:  # carve a disjoint held-out slice off a seeded permutation
        order = np.random.default_rng([spec.seed, 3]).permutation(len(train))
        held = [train[int(i)] for i in order[:eval_size]]
        train = [train[int(i)] for i in order[eval_size:]]
    held_q = {p.question for p in held}
    train = [p for p in train if p.question not in held_q]
    if not train:
        raise ConfigError("the training split is empty after removing held-out questions")
    return ProblemSource(train, held[:eval_size], spec)


def _load_files(spec: DataSpec) -> tuple[list[Problem], list[Problem] | None]:
    if spec.path:
        train = read_problems(spec.path, spec)
        held = read_problems(spec.eval_path, spec) if spec.eval_path else None
        return train, held
    if spec.name == "gsm8k":
        return _gsm8k_from_hub(spec)
    raise ConfigError("data.path is required for this dataset")


def _gsm8k_from_hub(spec: DataSpec) -> tuple[list[Problem], list[Problem]]:
    try:
        import datasets
    except ImportError as e:
        raise ConfigError(
            "gsm8k without data.path needs the 'datasets' package and network access",
            hint="pass --data-path gsm8k_train.jsonl (question/answer columns)",
        ) from e
    try:
        ds = datasets.load_dataset("openai/gsm8k", "main")
    except Exception as e:  # offline, hub down, auth: all mean the same to the user
        raise ConfigError(
            f"could not load openai/gsm8k from the hub ({type(e).__name__})",
            hint="download it once, then pass --data-path train.jsonl "
            "--set data.eval_path=test.jsonl",
        ) from e
    conv = [
        [_problem(r, f"openai/gsm8k {split}: row {n}", "question", "answer")
         for n, r in enumerate(ds[split], 1)]
        for split in ("train", "test")
    ]
    return conv[0], conv[1]


def read_problems(path: str, spec: DataSpec) -> list[Problem]:
    """JSONL or parquet rows with a question field and an answer field.

    The answer is GSM8K-style (``... #### 42``) or a plain number. A row that cannot
    be used is a ConfigError naming the file, the row and why, before any training.
    """
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"data path {path!r} is a directory, not a file",
                          hint="pass a .jsonl or .parquet file")
    if p.exists() and not p.is_file():
        raise ConfigError(f"data path {path!r} is not a regular file",
                          hint="pass a .jsonl or .parquet file")
    if not p.is_file():
        raise ConfigError(f"data file {path!r} does not exist")
    rows = _parquet_rows(p, path) if p.suffix == ".parquet" else _jsonl_rows(p, path)
    out = [_problem(row, where, spec.question_field, spec.answer_field)
           for where, row in rows]
    if not out:
        raise ConfigError(f"data file {path!r} has no rows")
    return out


def _jsonl_rows(p: Path, path: str) -> list[tuple[str, Any]]:
    """(``path:line``, parsed value) per non-blank line.

    Split as bytes, so a line is numbered as an editor numbers it and a stray byte
    that is not UTF-8 is reported on its own line (str.splitlines would also split
    inside JSON strings at U+2028 and friends)."""
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read data file {path!r} ({e.strerror or e})") from e
    rows: list[tuple[str, Any]] = []
    for n, raw in enumerate(data.removeprefix(codecs.BOM_UTF8).splitlines(), 1):
        where = f"{path}:{n}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(
                f"{where}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})",
                hint="save the file as UTF-8 JSONL",
            ) from e
        if not line.strip():
            continue
        try:
            rows.append((where, json.loads(line)))
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}: not valid JSON ({e.msg})") from e
    return rows


def _parquet_rows(p: Path, path: str) -> list[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ConfigError("reading parquet needs pyarrow", hint="pip install pyarrow") from e
    try:
        table = pq.read_table(p)
    except (OSError, ValueError) as e:  # ArrowInvalid is a ValueError, ArrowIOError an OSError
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"{path}: not a readable parquet file ({first})") from e
    return [(f"{path}: row {n}", row) for n, row in enumerate(table.to_pylist(), 1)]


_JSON_KINDS = {list: "array", str: "string", bool: "boolean", int: "number", float: "number",
               type(None): "null"}


def _problem(row: Any, where: str, question_field: str, answer_field: str) -> Problem:
    """One row as a Problem, or a ConfigError that says what is wrong with it."""
    if not isinstance(row, dict):
        kind = _JSON_KINDS.get(type(row), type(row).__name__)
        raise ConfigError(
            f"{where}: a JSON {kind}, not an object with {question_field!r} and "
            f"{answer_field!r} fields",
            hint="write one JSON object per line",
        )
    for field in (question_field, answer_field):
        if field not in row:
            raise ConfigError(f"{where}: no field {field!r}",
                              hint="set data.question_field / data.answer_field")
    raw = str(row[answer_field])
    gold = gold_answer(raw)
    if gold is None:
        _, sep, tail = raw.rpartition("####")
        why = (f"no number after '####' in answer (got {tail.strip()[:40]!r})" if sep
               else f"answer {raw[-40:]!r} is not a number")
        raise ConfigError(f"{where}: {why}",
                          hint="GSM8K answers end in '#### N'; plain answers are one number")
    return Problem(str(row[question_field]), gold)
