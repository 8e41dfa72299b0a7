"""``rlctl delete run`` for a run on this machine: its folder in the local run store.

The plan lists each top-level entry of the run folder (spec, status, metrics,
checkpoints with their steps, ...) with its size, so the user sees what goes before
confirming. Deleting takes the run's writer lock first (a run being trained is
refused, exit 4), then renames the folder out of the way in one atomic step, so
the name is free at once and an interrupted delete never leaves half a run that
``status`` or ``resume`` would pick up; the renamed folder is then removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from rlctl.core.errors import NotFoundError
from rlctl.core.plan import ApplyResult, Change, Plan
from rlctl.core.store.base import CHECKPOINTS, LOCK, step_number
from rlctl.core.store.local import LocalRunDir, LocalRunStore, writing

Event = Callable[[str, str, str], None]


def _size(p: Path) -> tuple[int, int]:
    """(files, bytes) under ``p``."""
    if p.is_file():
        return 1, p.stat().st_size
    files = total = 0
    for dirpath, _, names in os.walk(p):
        for n in names:
            files += 1
            with contextlib.suppress(OSError):  # removed meanwhile
                total += (Path(dirpath) / n).stat().st_size
    return files, total


def _human(size: int) -> str:
    n = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _run(root: str, name: str) -> LocalRunDir:
    run = LocalRunStore(root).run(name)
    if not run.path.is_dir():
        raise NotFoundError(
            f"run {name!r} not found in {run.path.parent}",
            hint="list runs with 'rlctl status' or pass --runs-dir",
        )
    return run


def plan_delete_local(root: str, name: str) -> Plan:
    """What deleting run ``name`` removes: one change per entry of its folder."""
    run = _run(root, name)
    changes = []
    for entry in sorted(run.path.iterdir()):
        if entry.name == LOCK:
            continue
        files, size = _size(entry)
        fields: dict[str, object] = {"path": str(entry), "files": files, "size": _human(size)}
        if entry.name == CHECKPOINTS:
            fields["steps"] = sorted(
                s for n in os.listdir(entry) if (s := step_number(n)) is not None
            )
        changes.append(Change(kind="files", name=entry.name, action="delete", fields=fields))
    # the folder itself last: it holds the lock that keeps a trainer out meanwhile
    changes.append(
        Change(
            kind="folder",
            name=name,
            action="delete",
            fields={"path": str(run.path)},
            depends_on=[c.key for c in changes],
        )
    )
    return Plan(
        operation="delete",
        target=name,
        project="local",
        location=str(run.path.parent),
        changes=changes,
        notes=[f"run {name}: its folder {run.path} and everything in it"],
    )


def delete_local(root: str, plan: Plan, on_event: Event | None = None) -> ApplyResult:
    """Remove the run's folder (refused while a process trains it)."""
    event = on_event or (lambda key, state, info: None)
    run = _run(root, plan.target)
    with run.lock():  # ConflictError (exit 4) while train/resume holds it
        trash = run.path.parent / f".deleting-{run.name}-{os.getpid()}"
        with writing(str(run.path)):
            os.replace(run.path, trash)  # atomic: the run is gone in one step
        applied = []
        for c in plan.pending():
            if c.kind == "files":
                p = trash / c.name
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
            else:
                shutil.rmtree(trash, ignore_errors=True)
            event(c.key, "done", "")
            applied.append(c.key)
    shutil.rmtree(trash, ignore_errors=True)
    return ApplyResult.of(plan, applied)
