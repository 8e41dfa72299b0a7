"""Datasets of (question, gold answer) pairs, addressed by step for exact resume.

Training prompts for step ``k`` are a pure function of (seed, k), so a resumed
run draws exactly what an uninterrupted one would have, with no iterator state
to checkpoint. The data is the embedded arithmetic generator (``generator``), a
local file (``files``: JSONL, JSON, Parquet, CSV) or a hub dataset (``hub``); the
columns that hold the prompt and the answer are found by ``columns``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlctl.core.config.models import GENERATED, DataSpec
from rlctl.core.errors import ConfigError
from rlctl.core.trainer.data.columns import choose, column_names, not_a_mapping, to_problem
from rlctl.core.trainer.data.files import read_rows
from rlctl.core.trainer.data.generator import arithmetic
from rlctl.core.trainer.data.problem import Problem

__all__ = ["Problem", "ProblemSource", "load_source", "read_problems"]

# a held-out slice carved off the training data takes at most this share of its rows
HELD_OUT_SHARE = 5  # one fifth


class ProblemSource:
    """Train prompts by step, plus a fixed held-out set disjoint from training.

    ``notes`` are what the trainer should say about the data (one line each), e.g.
    that a small file's held-out slice is smaller than ``eval.size``."""

    def __init__(
        self,
        train: list[Problem] | None,
        eval_set: list[Problem],
        spec: DataSpec,
        notes: tuple[str, ...] = (),
    ):
        self._train = train
        self.eval_set = eval_set
        self.spec = spec
        self.notes = notes
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
                p = arithmetic(rng, self.spec.max_operand)
                if p.question not in self._eval_questions:
                    out.append(p)
            return out
        idx = rng.choice(len(self._train), size=n, replace=len(self._train) < n)
        return [self._train[int(i)] for i in idx]


def load_source(spec: DataSpec, eval_size: int) -> ProblemSource:
    """The run's data: ``eval_size`` held-out problems and the training problems.

    The held-out set is the eval file or split when there is one, else a seeded
    slice of the training data of at most a fifth of its rows (said in ``notes``
    when that is less than ``eval_size``), so the training split is never emptied.
    """
    if spec.dataset == GENERATED:
        rng = np.random.default_rng([spec.seed, 2])
        seen: dict[str, Problem] = {}
        while len(seen) < eval_size:
            p = arithmetic(rng, spec.max_operand)
            seen.setdefault(p.question, p)
        return ProblemSource(None, list(seen.values()), spec)
    name, train = _train_problems(spec)
    held = _eval_problems(spec)
    notes: list[str] = []
    if held is None:  # carve a disjoint held-out slice off a seeded permutation (also
        # with eval.size 0: the training order, so the batches, are those of older runs)
        take = _held_out_size(len(train), eval_size, name)
        if take < eval_size:
            notes.append(
                f"{name} has {len(train)} rows: holding out {take} for eval, not "
                f"eval.size={eval_size} (at most a fifth of the rows; give a "
                "separate eval set with data.eval_path or data.eval_split)"
            )
        order = np.random.default_rng([spec.seed, 3]).permutation(len(train))
        held = [train[int(i)] for i in order[:take]]
        train = [train[int(i)] for i in order[take:]]
    held = held[:eval_size]
    held_q = {p.question for p in held}
    train = [p for p in train if p.question not in held_q]
    if not train:
        raise ConfigError(
            f"every training question of {name} is also a held-out question",
            hint="evaluate on other questions (data.eval_path / "
            "data.eval_split), or pass --eval-size 0",
        )
    return ProblemSource(train, held, spec, tuple(notes))


def _held_out_size(rows: int, eval_size: int, name: str) -> int:
    if rows < 2 and eval_size:
        raise ConfigError(
            f"{name} has {rows} row: none can be held out for eval and still trained on",
            hint="pass --eval-size 0, or an eval file with data.eval_path",
        )
    return min(eval_size, max(1, rows // HELD_OUT_SHARE))


def _train_problems(spec: DataSpec) -> tuple[str, list[Problem]]:
    if spec.path:
        return f"data file {spec.path!r}", read_problems(spec.path, spec)
    repo = spec.hub_id
    assert repo is not None  # DataSpec: no path and not generated is a hub dataset
    return repo, _hub_problems(repo, spec, spec.split)


def _eval_problems(spec: DataSpec) -> list[Problem] | None:
    if spec.eval_path:
        return read_problems(spec.eval_path, spec)
    if spec.eval_split and spec.hub_id:
        return _hub_problems(spec.hub_id, spec, spec.eval_split)
    return None


def _hub_problems(repo: str, spec: DataSpec, split: str) -> list[Problem]:
    from rlctl.core.trainer.data.hub import hub_rows

    return _problems(hub_rows(repo, spec.config, split), f"{repo} ({split} split)", spec)


def read_problems(path: str, spec: DataSpec) -> list[Problem]:
    """The rows of a local file as Problems: its format from the file, its prompt and
    answer columns from ``spec`` or found (``columns``). A file or row that cannot be
    used is a ConfigError naming the file, the row and why, before any training."""
    return _problems(read_rows(path), f"data file {path!r}", spec)


def _problems(rows: list[tuple[str, Any]], source: str, spec: DataSpec) -> list[Problem]:
    if not rows:
        raise ConfigError(f"{source} has no rows")
    columns = column_names(rows)
    where, first = next(((w, row) for w, row in rows if isinstance(row, Mapping)), (None, None))
    if first is None:  # no row is an object: say what the first one is
        raise not_a_mapping(*rows[0])
    layout = choose(columns, first, source, spec.prompt_column, spec.answer_column, where=where)
    return [to_problem(row, where, layout) for where, row in rows]
