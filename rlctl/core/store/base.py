"""The run store's contract: one layout for a run, on a local path (local.py) or
``gs://`` (gcs.py), and what the trainer and the commands may ask of a run's folder.

    <root>/<run>/spec.yaml           the RunSpec the trainer runs
    <root>/<run>/status.json         phase, step, latest checkpoint, timestamps
    <root>/<run>/metrics.jsonl       one JSON object per optimizer step
    <root>/<run>/train.log           the run's progress lines, every attempt (rlctl logs)
    <root>/<run>/tensorboard/        TensorBoard event files
    <root>/<run>/checkpoints/<step>/ Orbax checkpoints (complete ones only)
    <root>/<run>/checkpoints/<step>.damaged[-n]/  a damaged checkpoint set aside: never
                                     restored on its own, never a reason to start over
    <root>/<run>/eval/{baseline,step-N,final}.json

Writes of whole files are atomic (temp file + rename), so a reader or a killed
writer never leaves a half-written ``status.json`` or ``spec.yaml``.
"""

from __future__ import annotations

import builtins  # annotations below a method named list
import os
import re
import tempfile
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rlctl.core.errors import NotFoundError
from rlctl.core.phases import ACTIVE, FINISHED, Phase  # noqa: F401 - re-exported

SPEC = "spec.yaml"
STATUS = "status.json"
METRICS = "metrics.jsonl"
LOG = "train.log"
GENERATOR_LOG = "generator.log"  # a generator process's (rollout.placement=process)
TENSORBOARD = "tensorboard"
CHECKPOINTS = "checkpoints"
EVAL = "eval"
LOCK = ".lock"  # a local run's writer lock (its holder: pid, start time, host; holder.py)
# A folder holding any of these is a run (listed; shown damaged when spec.yaml is
# missing): a folder with none of them is someone else's, left out of the listing.
RUN_MARKERS = (SPEC, STATUS, METRICS)
# In a checkpoint folder: Orbax's metadata, written when its save finished, and
# rlctl's manifest of every file, written after it (trainer/checkpoint/checkpointing.py)
ORBAX_METADATA = "_CHECKPOINT_METADATA"
MANIFEST = "rlctl-manifest.json"
# A step folder's name as Orbax names (and finds) one: ASCII digits, no leading zero.
# "07", "٣" or "²" are no step to Orbax; counted by int() or str.isdigit() they made
# a checkpoint no folder holds, and the run stuck on it (#47).
STEP_NAME = re.compile(r"^(?:0|[1-9][0-9]*)$")


@dataclass(frozen=True)
class LockState:
    """Whether the process a run's writer lock names holds it now: True, False, or
    None where the store cannot tell at no cost (a gs:// lease, a lock file not
    ours to read). ``why``: what was seen when it is not held, for ``status``."""

    held: bool | None
    why: str | None = None


class RunDir(Protocol):
    """What the trainer and the commands need from one run's folder."""

    name: str
    uri: str

    def exists(self, rel: str = "") -> bool: ...
    def read_text(self, rel: str) -> str: ...
    def write_text(self, rel: str, text: str) -> None: ...
    def list(self, rel: str) -> list[str]: ...
    def path_for(self, rel: str) -> str: ...
    def read_json(self, rel: str) -> Any: ...
    def write_json(self, rel: str, data: Any) -> None: ...
    # Files the trainer writes incrementally (metrics.jsonl, TensorBoard, Orbax) live
    # under path_for(); a remote store syncs them with these. Local: no-ops.
    def staging_dir(self) -> Path: ...
    def pull(self, rel: str) -> None: ...
    def push(self, rel: str) -> None: ...
    def checkpoint_steps(self) -> builtins.list[int]: ...
    def publish_checkpoint(self, step: int) -> None: ...
    def fetch_checkpoint(self, step: int) -> None: ...
    def delete(self, rel: str = "") -> builtins.list[str]: ...
    # Rename a file or folder in the store (a checkpoint set aside, or recovered).
    def move(self, src: str, dst: str) -> None: ...
    # Held by the one process that trains the run (train, resume), for its whole life.
    def lock(self) -> AbstractContextManager[None]: ...
    # Whether the process that ``lock()`` records holds it now (a local file lock);
    # held None where the store cannot tell at no cost (a gs:// lease).
    def lock_state(self) -> LockState: ...


class RunStore(Protocol):
    uri: str

    def run(self, name: str) -> RunDir: ...
    def list_runs(self) -> list[str]: ...
    def existing(self, name: str) -> RunDir: ...


def _durable_temp(path: Path, text: str | bytes) -> Path:
    """``text`` (or bytes) in a synced temp file beside ``path`` (same file system: it
    can be renamed or linked into place atomically)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def create_exclusive(path: Path, text: str) -> bool:
    """Write ``path`` whole, only if it does not exist yet (atomic: the temp file is
    hard-linked into place, which fails if the name is taken). False if it was."""
    tmp = _durable_temp(path, text)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write(path: Path, text: str | bytes) -> None:
    """Write to a temp file in the same folder, fsync, then rename over the target."""
    tmp = _durable_temp(path, text)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def existing_run(store: RunStore, name: str) -> RunDir:
    """The named run, or a NotFoundError that says how to find the right one."""
    run = store.run(name)
    if not run.exists(SPEC):
        if any(not n.startswith(".") for n in run.list("")):
            from rlctl.core.errors import ConfigError

            raise ConfigError(
                f"run {name!r} is damaged: {run.uri} has no {SPEC}",
                hint=f"restore its {SPEC} (the run's settings) to resume it, or remove the "
                f"run with 'rlctl delete run {name}'",
            )
        raise NotFoundError(
            f"run {name!r} not found in {store.uri}",
            hint=f"list the runs there with 'rlctl status --runs-dir {store.uri}', or pass "
            "the --runs-dir that holds it",
        )
    return run


def step_number(name: str) -> int | None:
    """The step a checkpoint folder's name says, or None when it is no step name."""
    return int(name) if STEP_NAME.match(name) else None


def latest_checkpoint_step(run: RunDir) -> int | None:
    """The newest *complete* checkpoint (local: a finished Orbax folder; gs://: a
    step with its COMMITTED marker)."""
    steps = run.checkpoint_steps()
    return max(steps) if steps else None


SET_ASIDE = re.compile(r"^([0-9]+)\.damaged(?:-[0-9]+)?$")  # checkpoints/<step>.damaged[-n]


def set_aside_step(name: str) -> int:
    """The step of a set-aside checkpoint's folder name (``12.damaged-1`` -> 12)."""
    return int(name.split(".", 1)[0])


def set_aside_checkpoints(run: RunDir) -> list[str]:
    """The run's damaged checkpoints that were set aside (``<step>.damaged[-n]``),
    newest step first. Each may still hold intact data: a run that has them is never
    started over from step 0 on its own."""
    names = [n for n in run.list(CHECKPOINTS) if SET_ASIDE.match(n)]
    return sorted(names, key=lambda n: (-set_aside_step(n), n))
