"""The run store: one layout for a run, on a local path or ``gs://`` (see gcs.py).

    <root>/<run>/spec.yaml           the RunSpec the trainer runs
    <root>/<run>/status.json         phase, step, latest checkpoint, timestamps
    <root>/<run>/metrics.jsonl       one JSON object per optimizer step
    <root>/<run>/tensorboard/        TensorBoard event files
    <root>/<run>/checkpoints/<step>/ Orbax checkpoints (complete ones only)
    <root>/<run>/eval/{baseline,step-N,final}.json

Writes of whole files are atomic (temp file + rename), so a reader or a killed
writer never leaves a half-written ``status.json`` or ``spec.yaml``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Protocol

from rlctl.core.errors import ConfigError, NotFoundError
from rlctl.core.names import validate_name

SPEC = "spec.yaml"
STATUS = "status.json"
METRICS = "metrics.jsonl"
TENSORBOARD = "tensorboard"
CHECKPOINTS = "checkpoints"
EVAL = "eval"


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
    def checkpoint_steps(self) -> list[int]: ...
    def publish_checkpoint(self, step: int) -> None: ...
    def fetch_checkpoint(self, step: int) -> None: ...
    def delete(self, rel: str = "") -> list[str]: ...


class RunStore(Protocol):
    uri: str

    def run(self, name: str) -> RunDir: ...
    def list_runs(self) -> list[str]: ...
    def existing(self, name: str) -> RunDir: ...


class LocalRunDir:
    def __init__(self, root: Path, name: str) -> None:
        self.name = name
        self.path = root / name
        self.uri = str(self.path)

    def exists(self, rel: str = "") -> bool:
        return (self.path / rel).exists()

    def read_text(self, rel: str) -> str:
        try:
            return (self.path / rel).read_text()
        except FileNotFoundError as e:
            raise NotFoundError(f"{self.uri}/{rel} not found") from e

    def write_text(self, rel: str, text: str) -> None:
        atomic_write(self.path / rel, text)

    def list(self, rel: str) -> list[str]:
        p = self.path / rel
        return sorted(os.listdir(p)) if p.is_dir() else []

    def path_for(self, rel: str) -> str:
        """A local path to write ``rel`` at; its parent folder exists."""
        p = self.path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        return str(p)

    # JSON helpers shared by every backend
    def read_json(self, rel: str) -> Any:
        return json.loads(self.read_text(rel))

    def write_json(self, rel: str, data: Any) -> None:
        self.write_text(rel, json.dumps(data, indent=2, default=str) + "\n")

    # The trainer's files are written in place: nothing to stage or sync.
    def staging_dir(self) -> Path:
        return self.path

    def pull(self, rel: str) -> None:
        pass

    def push(self, rel: str) -> None:
        pass

    def checkpoint_steps(self) -> list[int]:
        """Orbax renames a finished save into a plain ``<step>`` folder, so temp
        folders of a killed save never match."""
        return sorted(int(n) for n in self.list(CHECKPOINTS) if n.isdigit())

    def publish_checkpoint(self, step: int) -> None:
        pass

    def fetch_checkpoint(self, step: int) -> None:
        pass

    def delete(self, rel: str = "") -> list[str]:
        import shutil

        p = self.path / rel
        if not p.exists():
            return []
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
        return [str(p)]


def atomic_write(path: Path, text: str) -> None:
    """Write to a temp file in the same folder, fsync, then rename over the target."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class LocalRunStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser()
        self.uri = str(self.root)

    def run(self, name: str) -> LocalRunDir:
        return LocalRunDir(self.root, validate_name(name, "run"))

    def list_runs(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(
            p.name for p in self.root.iterdir() if p.is_dir() and (p / SPEC).is_file()
        )

    def existing(self, name: str) -> LocalRunDir:
        return existing_run(self, name)  # type: ignore[return-value]


def existing_run(store: RunStore, name: str) -> RunDir:
    """The named run, or a NotFoundError that says how to find the right one."""
    run = store.run(name)
    if not run.exists(SPEC):
        raise NotFoundError(
            f"run {name!r} not found in {store.uri}",
            hint="list runs with 'rlctl status' or pass --runs-dir",
        )
    return run


def open_store(root: str, client: Any = None) -> RunStore:
    """A local or ``gs://`` run store; ``client`` is a storage client from the factory
    (``Clients.storage``), built from ADC when None."""
    if root.startswith("gs://"):
        from rlctl.core.errors import require_extra

        require_extra("google.cloud.storage", "gcp")  # checks, imports nothing
        from rlctl.core.runs.gcs import GcsRunStore

        return GcsRunStore(root, client=client)
    if "://" in root:
        raise ConfigError(f"run store {root!r}: only local paths and gs:// are supported",
                          hint="use a local path or gs://BUCKET/PREFIX")
    return LocalRunStore(root)


def latest_checkpoint_step(run: RunDir) -> int | None:
    """The newest *complete* checkpoint (local: a finished Orbax folder; gs://: a
    step with its COMMITTED marker)."""
    steps = run.checkpoint_steps()
    return max(steps) if steps else None
