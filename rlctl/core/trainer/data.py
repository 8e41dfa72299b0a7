"""Datasets of (question, gold answer) pairs, addressed by step for exact resume.

Training prompts for step ``k`` are a pure function of (seed, k), so a resumed
run draws exactly what an uninterrupted one would have, with no iterator state
to checkpoint. The embedded default is an arithmetic word-problem generator
that SmolLM2-135M solves sometimes (~0.2 greedy) but not mostly, so GRPO has
reward variance to learn from; GSM8K is the real benchmark.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlctl.core.config.models import DataSpec
from rlctl.core.errors import ConfigError
from rlctl.core.trainer.rewards import gsm8k_gold, normalize_number


@dataclass(frozen=True)
class Problem:
    question: str
    answer: str  # normalized number


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
        [Problem(r["question"], gsm8k_gold(r["answer"])) for r in ds[split]]
        for split in ("train", "test")
    ]
    return conv[0], conv[1]


def read_problems(path: str, spec: DataSpec) -> list[Problem]:
    """JSONL or parquet rows with a question field and an answer field.

    The answer is GSM8K-style (``... #### 42``) or a plain number.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"data file {path!r} does not exist")
    rows: list[dict]
    if p.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise ConfigError("reading parquet needs pyarrow", hint="pip install pyarrow") from e
        rows = pq.read_table(p).to_pylist()
    else:
        rows = []
        for n, line in enumerate(p.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}:{n}: not valid JSON ({e.msg})") from e
    out = []
    for n, row in enumerate(rows, 1):
        try:
            q = str(row[spec.question_field])
            raw = str(row[spec.answer_field])
        except KeyError as e:
            raise ConfigError(
                f"{path}: row {n} has no field {e.args[0]!r}",
                hint="set data.question_field / data.answer_field",
            ) from e
        gold = gsm8k_gold(raw) if "####" in raw else normalize_number(raw)
        if gold is None:
            raise ConfigError(f"{path}: row {n}: answer {raw[-40:]!r} is not a number")
        out.append(Problem(q, gold))
    if not out:
        raise ConfigError(f"data file {path!r} has no rows")
    return out
