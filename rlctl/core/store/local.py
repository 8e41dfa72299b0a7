"""The run store on a local path: files written in place, whole files atomically."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rlctl.core.errors import NotFoundError
from rlctl.core.names import validate_name
from rlctl.core.store.base import CHECKPOINTS, SPEC, atomic_write, existing_run


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


class LocalRunStore:
    def __init__(self, root: str | Path) -> None:
        # absolute once, here: every path a run hands to Orbax or TensorBoard derives
        # from it, and Orbax >= 0.12.8 refuses relative ones (--runs-dir ./runs)
        self.root = Path(os.path.abspath(Path(root).expanduser()))
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
