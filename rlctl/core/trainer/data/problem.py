"""One row of a task, as the trainer, the rewards and the prompt renderer see it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass


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
    columns: Mapping[str, object] = dataclasses.field(
        default_factory=dict, compare=False, hash=False
    )
    messages: tuple[Mapping[str, str], ...] | None = dataclasses.field(
        default=None, compare=False, hash=False
    )
    # where the row came from (``path:line``, ``repo split: row N``): errors name it
    where: str = dataclasses.field(default="", compare=False, hash=False)
