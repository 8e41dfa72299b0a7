"""The phases a run goes through before (and around) its steps, as typed events.

The first step of a run can come a minute or more after ``rlctl train``: libraries
load, the default model is converted on first use, the weights load, the baseline
eval runs, a checkpoint is restored, the first step compiles. Each of those is a
``PhaseEvent`` on the progress callback, so the terminal shows what is happening
from the first second, and the run's log says where the time went.

Events travel as dicts (``{"event": "phase", ...}``), the form every progress
callback (the CLI, the pod's JSON lines) already takes; this model is their shape.
Nothing here imports JAX: the CLI reads these events too.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict


class Stage(str, Enum):
    STARTING = "starting"  # the run exists or is about to: before any heavy import
    LIBRARIES = "libraries"  # importing JAX, Flax, Tunix (seconds)
    CONVERTING = "converting"  # the default model, GGUF -> safetensors, on first use
    LOADING = "loading"  # model weights (and the reference model)
    EVALUATING = "evaluating"  # a held-out eval, batch by batch (done/total)
    RESTORING = "restoring"  # the latest checkpoint, on resume
    COMPILING = "compiling"  # the first step of a process compiles its programs

    __str__ = str.__str__

    def __format__(self, format_spec: str) -> str:
        return str.__format__(self, format_spec)


class PhaseEvent(BaseModel):
    """One phase beginning, or (``done``/``total``) its progress."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    stage: Stage
    text: str  # what a user reads: "loading model smollm2-135m-instruct"
    done: int | None = None  # units finished so far (eval batches)
    total: int | None = None
    unit: str = ""  # what done/total count: "batches"

    @property
    def in_progress(self) -> bool:
        """A progress update inside a phase that already began (not its first event,
        not its last): a log may skip some of these."""
        return self.done is not None and self.total is not None and 0 < self.done < self.total

    @property
    def count(self) -> str:
        """``2/4 batches``, or empty for a phase without units."""
        if self.done is None or self.total is None:
            return ""
        return f"{self.done}/{self.total}" + (f" {self.unit}" if self.unit else "")

    def event(self) -> dict[str, Any]:
        return {"event": "phase", **self.model_dump(mode="json")}


def phase(
    stage: Stage, text: str, done: int | None = None, total: int | None = None, unit: str = ""
) -> dict[str, Any]:
    """The progress-callback form of a ``PhaseEvent``."""
    return PhaseEvent(stage=stage, text=text, done=done, total=total, unit=unit).event()


def parse_phase(event: dict[str, Any]) -> PhaseEvent:
    return PhaseEvent.model_validate(event)
