"""The run store on a local path: files written in place, whole files atomically."""

from __future__ import annotations

import builtins  # annotations below a method named list
import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from rlctl.core.errors import (
    ConfigError,
    ConflictError,
    DiskFullError,
    NotFoundError,
    RunInUseError,
)
from rlctl.core.names import validate_name
from rlctl.core.paths import kernel_fs
from rlctl.core.store import holder
from rlctl.core.store.base import (
    CHECKPOINTS,
    LOCK,
    MANIFEST,
    ORBAX_METADATA,
    RUN_MARKERS,
    SPEC,
    TENSORBOARD,
    LockState,
    atomic_write,
    create_exclusive,
    existing_run,
    step_number,
)


def check_root(root: Path) -> None:
    """A run store root must be (or become) a folder on a real file system."""
    if pseudo := kernel_fs(root):
        raise ConfigError(
            f"run store {str(root)!r} is under {pseudo}, a kernel file system, not storage",
            hint="pass --runs-dir a folder on disk, e.g. ./runs",
        )
    if root.exists() and not root.is_dir():
        raise ConfigError(
            f"run store {str(root)!r} is a file, not a folder",
            hint="pass --runs-dir a folder (it is created if missing)",
        )


@contextlib.contextmanager
def writing(
    where: str,
    elsewhere: str = "pass another --runs-dir",
    writable: str = "pass --runs-dir a folder you can write to",
) -> Iterator[None]:
    """OSErrors of a write as one line each: read-only, no permission, disk full.
    ``elsewhere``/``writable``: the hints, for a file that is not the run store's."""
    import errno

    try:
        yield
    except OSError as e:
        if isinstance(e, (FileExistsError, FileNotFoundError)) and e.errno != errno.ENOSPC:
            raise
        why = e.strerror or type(e).__name__
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(
                f"cannot write {where}: {why}", hint=f"free space on that disk or {elsewhere}"
            ) from e
        raise ConfigError(f"cannot write {where}: {why}", hint=writable) from e


def _in_use(name: str, fd: int) -> RunInUseError:
    """The refusal of a second writer, naming the first as its lock records it; a
    record whose process is gone means another process holds the lock (a child that
    inherited its descriptor, say), which ``status`` shows the same way."""
    record = holder.read_record(os.pread(fd, 4096, 0))
    why = holder.not_its_holder(record)
    if why is None:
        return RunInUseError(
            f"run {name!r} is in use by {holder.describe(record)}",
            hint="wait for it to finish, or stop that process first",
        )
    return RunInUseError(
        f"run {name!r} is in use: another process than the one its lock records holds it ({why})",
        hint=f"stop the process that holds its {LOCK} ('fuser -v' names it), then try again",
    )


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
        if rel == SPEC:  # written once, by whoever creates the run (as on gs://)
            with writing(f"{self.uri}/{rel}"):
                created = create_exclusive(self.path / rel, text)
            if not created:
                raise ConflictError(
                    f"{self.uri}/{rel} was changed by another writer",
                    hint="another process created this run first",
                )
            return
        with writing(f"{self.uri}/{rel}"):
            atomic_write(self.path / rel, text)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive for the life of the process that trains this run: a second
        train/resume gets a ConflictError naming the holder. The kernel drops the
        lock when the holder dies, however it dies, so a killed run stays resumable.
        The file records the holder (``holder.this_process``: pid and start time),
        which ``lock_state`` checks against the process holding it now."""
        import fcntl

        with writing(f"{self.uri}/{LOCK}"):
            self.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise _in_use(self.name, fd) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(holder.this_process()).encode(), 0)
            yield
        finally:
            os.close(fd)  # releases the lock

    def lock_state(self) -> LockState:
        """Whether the process this run's lock records holds it now: the kernel's
        answer that the lock is held (a probe on a fresh descriptor, so a lock held
        in this same process counts), and the record's pid and start time that it is
        held by that process, never a pid alone (#57)."""
        import fcntl

        try:
            fd = os.open(self.path / LOCK, os.O_RDONLY)
        except FileNotFoundError:
            return LockState(False, f"no process holds its lock (the run has no {LOCK})")
        except OSError:  # not ours to read: cannot tell
            return LockState(None)
        try:
            record = holder.read_record(os.pread(fd, 4096, 0))
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                held: bool | None = False
            except BlockingIOError:
                held = True
            except OSError:  # a file system without flock: the record's word alone
                held = None
        except OSError:
            return LockState(None)
        finally:
            os.close(fd)  # also drops the probe's shared lock
        if held is False:
            return LockState(False, "no process holds its lock")
        why = holder.not_its_holder(record)
        if why is None:
            return LockState(True)
        if held:
            return LockState(
                False,
                f"another process than the one it records holds its lock ({why}); "
                "stop that process to resume the run",
            )
        return LockState(False, f"no process holds its lock ({why})")

    def list(self, rel: str) -> list[str]:
        p = self.path / rel
        return sorted(os.listdir(p)) if p.is_dir() else []

    def path_for(self, rel: str) -> str:
        """A local path to write ``rel`` at; its parent folder exists."""
        p = self.path / rel
        if rel in (CHECKPOINTS, TENSORBOARD) and p.exists() and not p.is_dir():
            raise ConfigError(
                f"{p} is a file where the run keeps a folder",
                hint="move that file aside, then resume the run",
            )
        with writing(str(p.parent)):
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

    def checkpoint_steps(self) -> builtins.list[int]:
        """The complete checkpoints: a folder with a step's name (``STEP_NAME``) that
        holds Orbax's metadata (written when its save finished) or rlctl's manifest.
        Orbax renames a finished save into place, so temp folders of a killed save
        never match; an empty or half-copied folder does not count either."""
        steps = []
        for name in self.list(CHECKPOINTS):
            step = step_number(name)
            folder = self.path / CHECKPOINTS / name
            if step is not None and any((folder / m).is_file() for m in (ORBAX_METADATA, MANIFEST)):
                steps.append(step)
        return sorted(steps)

    def publish_checkpoint(self, step: int) -> None:
        pass

    def fetch_checkpoint(self, step: int) -> None:
        pass

    def delete(self, rel: str = "") -> builtins.list[str]:
        import shutil

        p = self.path / rel
        if not p.exists():
            return []
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
        return [str(p)]

    def move(self, src: str, dst: str) -> None:
        """Rename ``src`` to ``dst`` within the run (nothing to do if ``src`` is gone:
        the trainer renames checkpoint folders in place, staging being the run)."""
        p = self.path / src
        if p.exists():
            os.replace(p, self.path / dst)


class LocalRunStore:
    def __init__(self, root: str | Path) -> None:
        # absolute once, here: every path a run hands to Orbax or TensorBoard derives
        # from it, and Orbax >= 0.12.8 refuses relative ones (--runs-dir ./runs)
        self.root = Path(os.path.abspath(Path(root).expanduser()))
        self.uri = str(self.root)
        check_root(self.root)

    def run(self, name: str) -> LocalRunDir:
        return LocalRunDir(self.root, validate_name(name, "run"))

    def list_runs(self) -> list[str]:
        if not self.root.is_dir():
            return []
        # a run that lost its spec.yaml is listed (as damaged), a stranger's folder not
        return sorted(
            p.name
            for p in self.root.iterdir()
            if p.is_dir() and any((p / m).is_file() for m in RUN_MARKERS)
        )

    def existing(self, name: str) -> LocalRunDir:
        return cast(LocalRunDir, existing_run(self, name))  # its own store's run()
