"""What the run functions hand back to the CLI: typed, and ``-o json`` is their dump.

``model_dump(mode="json")`` of each model is exactly what the command prints with
``-o json`` (``Phase`` serializes as its string), so the field names and order here
are the public JSON of ``status``, ``train``, ``resume`` and ``delete run``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from rlctl.core.k8s.diagnose import Diagnosis
from rlctl.core.k8s.fit import Placement
from rlctl.core.phases import Phase
from rlctl.core.runs.curve import Curve
from rlctl.core.trainer.api import DeviceFit

EVALS = ("baseline", "final")


class EvalSummary(BaseModel):
    """The headline numbers of one eval (``eval/<which>.json``), as ``status`` shows them."""

    accuracy: float | None = None
    format_rate: float | None = None
    mean_reward: float | None = None
    rewards: dict[str, float | None] | None = None  # each reward's mean, by name
    n: int | None = None


class Resize(BaseModel):
    """One attempt that began on another count of hosts or devices than the one before
    (status.json's ``resizes``): an elastic Ray job that gained or lost hosts."""

    step: int = Field(ge=0)  # the checkpoint the new attempt resumed from
    hosts: tuple[int, int]  # (before, after)
    devices: tuple[int, int]
    at: str | None = None

    @property
    def text(self) -> str:
        """'1 -> 2 hosts (8 -> 16 devices) at step 2'"""
        (h0, h1), (d0, d1) = self.hosts, self.devices
        counts = f"{h0} -> {h1} hosts" if h0 != h1 else f"{h1} hosts"
        return f"{counts} ({d0} -> {d1} devices) at step {self.step}"


class RunEvals(BaseModel):
    """The baseline and final evals a run has so far; one not run yet is left out of
    the JSON, as its file is absent from ``eval/``."""

    baseline: EvalSummary | None = None
    final: EvalSummary | None = None

    @model_serializer(mode="wrap")
    def _present_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}

    def present(self) -> Iterator[tuple[str, EvalSummary]]:
        """(which, summary) of the evals that exist, baseline first."""
        for which in EVALS:
            e = getattr(self, which)
            if e is not None:
                yield which, e


class RunInfo(BaseModel):
    """One run as the run store describes it (``rlctl status``)."""

    name: str
    path: str
    phase: Phase
    algorithm: str | None = None
    step: int = 0  # the steps done: the latest complete checkpoint's (#57)
    # steps metrics.jsonl holds after that checkpoint: a running run's progress since
    # its last save, or steps a resume repeats
    steps_after_checkpoint: int = 0
    total_steps: int | None = None
    latest_checkpoint: int | None = None
    checkpoint_bytes: int | None = None  # the latest checkpoint's size on disk
    disk_bytes: int | None = None  # the run folder's (checkpoints, metrics, logs, eval)
    processes: int | None = None
    devices: int | None = None
    resizes: list[Resize] | None = None  # each change of hosts or devices, oldest first
    engine: str | None = None  # the rollout engine (rollout.engine resolved)
    precision: str | None = None  # what the update's matmuls read (model.compute_dtype)
    sampling_precision: str | None = None  # the sampler's (rollout.compute_dtype resolved)
    rollout: str | None = None  # a pipelined run's placement and staleness bound
    # program -> seconds its compilations took this attempt, summed ("step": the update,
    # "sample_groups": the sampler), as the trainer recorded them
    compiles: dict[str, float] | None = None
    last_save: dict[str, Any] | None = None  # the newest save: step, bytes, seconds
    peak_device_bytes: int | None = None  # the device allocator's peak (None on a CPU)
    created: str | None = None
    updated: str | None = None
    # every file of the run that cannot be trusted, and why (a line each, '; '-joined);
    # the table marks such a run "(damaged)", and ``error`` begins with it
    damaged: str | None = None
    error: str | None = None
    latest_metrics: dict[str, Any] | None = None  # the last row of metrics.jsonl to trust
    eval: RunEvals = Field(default_factory=RunEvals)
    # one run's view only (``status RUN``); absent from the JSON when not asked for,
    # so a listing keeps its keys and size
    curve: Curve | None = None

    @model_serializer(mode="wrap")
    def _curve_when_asked(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        if data.get("curve", 0) is None:
            del data["curve"]
        return data

    @property
    def finished(self) -> bool:
        return self.phase.finished


class ClusterRunInfo(RunInfo):
    """A cluster run: the run store's view merged with its workload's state.

    ``phase`` is the store's phase, overridden by the workload's when the pods know
    better (pending, failed, or running before the trainer wrote its first status).
    """

    workload: Diagnosis
    reason: str | None = None  # why the workload is not running, when it says
    cluster: str | None = None
    backend: str | None = None

    @property
    def finished(self) -> bool:
        return self.phase.finished or self.workload.phase.finished


class EvalResult(BaseModel):
    """An eval record as the trainer writes it (``eval/<which>.json``); fields the
    trainer adds later are kept as they are."""

    model_config = ConfigDict(extra="allow")

    which: str
    step: int
    n: int
    accuracy: float
    format_rate: float
    mean_reward: float = 0.0
    greedy: bool = True
    seconds: float = 0.0
    samples: list[dict[str, Any]] = []


class TrainResult(BaseModel):
    """A run trained on this machine (``rlctl train``/``resume`` without a cluster)."""

    name: str
    path: str
    phase: Phase
    step: int
    latest_checkpoint: int | None = None
    baseline: EvalResult | None = None
    final: EvalResult | None = None


class SubmitPreview(BaseModel):
    """What ``train --cluster --dry-run`` would submit; nothing written or applied.
    No Secret value is in ``manifests``."""

    cluster: str
    project: str
    region: str
    accelerator: str
    image: str
    runs_dir: str
    manifests: list[dict[str, Any]]
    placements: list[Placement] = []  # the node pool(s) each pod group goes to
    notes: list[str] = []
    # its programs compiled for the accelerator: device memory per chip (or not checked)
    device_fit: DeviceFit | None = None


class SubmitResult(BaseModel):
    """A run written to its gs:// store and applied to the cluster."""

    name: str
    path: str  # the run's folder, gs://BUCKET/PREFIX/NAME
    backend: str
    applied: list[str]  # 'Kind/name (action)', in apply order
    placements: list[Placement] = []  # the node pool(s) each pod group goes to
    notes: list[str] = []
    device_fit: DeviceFit | None = None  # as the plan found it before the apply
    cluster: str | None = None
    project: str | None = None
    region: str | None = None
    accelerator: str | None = None
    image: str | None = None

    @property
    def runs_dir(self) -> str:
        """The run store the run is in (what ``--runs-dir`` takes)."""
        return self.path.rsplit("/", 1)[0]


class ResumeResult(BaseModel):
    """A stopped cluster run re-submitted from its latest complete checkpoint."""

    name: str
    path: str
    backend: str
    checkpoint: int
    applied: list[str]
    cluster: str | None = None
    accelerator: str | None = None


class LogTail(BaseModel):
    """The last lines of a run's log, and where they were read."""

    run: str
    log: str | None = None  # the run store's train.log, when the trainer has written one
    pod: str | None = None  # else a cluster run's leading pod they came from (the fallback)
    lines: list[str]

    @property
    def source(self) -> str:
        return self.log or f"pod {self.pod}"
