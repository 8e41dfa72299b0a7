"""A run's phase, and one typed change of a run's status.json.

Low in the layers so that everything that names a phase (the run store, the trainer,
the Kubernetes diagnosis, the run commands) shares one enum instead of passing strings,
and the trainer tells ``core/runs/local.py`` what changed as a model, not a dict.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict


class Phase(str, Enum):
    """A run's ``phase`` in status.json, and a cluster workload's phase.

    The values are the strings status.json and ``-o json`` carry, so members compare
    equal to (and serialize as) those strings. A local run moves
    pending -> starting -> evaluating/running -> completed | failed | interrupted;
    a workload on a cluster is pending, running, completed, failed, suspended, or
    absent (no object left). ``unknown``: no readable status.json. ``stale``: status.json
    says a local run is active but the process it names is gone (killed, crashed).
    """

    PENDING = "pending"
    STARTING = "starting"
    EVALUATING = "evaluating"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    SUSPENDED = "suspended"
    ABSENT = "absent"
    STALE = "stale"
    UNKNOWN = "unknown"

    # "running", not "Phase.RUNNING", in f-strings and messages on every Python
    __str__ = str.__str__

    def __format__(self, format_spec: str) -> str:
        return str.__format__(self, format_spec)

    @classmethod
    def parse(cls, value: object) -> Phase:
        """A stored or reported phase; anything unrecognised is ``UNKNOWN``."""
        try:
            return cls(value)
        except ValueError:
            return cls.UNKNOWN

    @property
    def finished(self) -> bool:
        """Nothing more will happen without a user (``status --watch`` and ``logs -f``
        stop). An interrupted local run counts: only ``resume`` moves it on."""
        return self in FINISHED

    @property
    def active(self) -> bool:
        """A process or workload is (or is about to be) working on the run."""
        return self in ACTIVE


FINISHED: frozenset[Phase] = frozenset(
    {Phase.COMPLETED, Phase.FAILED, Phase.INTERRUPTED, Phase.SUSPENDED, Phase.ABSENT, Phase.STALE}
)
ACTIVE: frozenset[Phase] = frozenset(
    {Phase.PENDING, Phase.STARTING, Phase.EVALUATING, Phase.RUNNING}
)


class StatusUpdate(BaseModel):
    """The fields of status.json one event changes; only those given are written
    (``fields()``), so an update never blanks what it does not mention, while one given
    as None (``error=None`` on a new attempt) is written as null.

    The field order is the order keys first appear in a new status.json.
    """

    model_config = ConfigDict(extra="forbid")  # a misspelt field is an error, not lost

    phase: Phase | None = None
    pid: int | None = None
    host: str | None = None
    started: str | None = None
    error: str | None = None
    step: int | None = None
    latest_checkpoint: int | None = None
    processes: int | None = None
    devices: int | None = None
    engine: str | None = None  # what samples the completions: vanilla or vllm
    precision: str | None = None  # what the update's matmuls read: float32 or bfloat16
    sampling_precision: str | None = None  # what the sampler's read (None: vLLM samples)
    # a pipelined run's placement (rollout.placement=split or max_staleness >= 1):
    # "split: generator on 1 cpu device [1], learner on 1 cpu device [0]; at most 1
    # version behind"; None for a colocated synchronous run
    rollout: str | None = None
    # each of the run's programs ("step", "sample_groups", ...) -> seconds its
    # compilations took this attempt, summed (tracing and lowering included; a cache
    # load's time where it was loaded)
    compiles: dict[str, float] | None = None
    # the device allocator's peak so far (JAX's peak_bytes_in_use); None on a CPU
    peak_device_bytes: int | None = None
    # the newest complete save: {step, bytes, seconds, background}
    last_save: dict[str, Any] | None = None
    finished: str | None = None
    total_steps: int | None = None
    steps_changes: list[dict[str, Any]] | None = None  # each {from, to, by, at}
    # each attempt that began on another count of hosts or devices than the one before
    # (an elastic Ray job that grew or lost hosts): {step, hosts: [before, after],
    # devices: [before, after], at}; the step is the checkpoint it resumed from
    resizes: list[dict[str, Any]] | None = None

    def fields(self) -> dict[str, Any]:
        """The given fields, phase still a ``Phase`` (it serializes as its string)."""
        return self.model_dump(exclude_unset=True)
