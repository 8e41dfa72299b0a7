"""Damaged checkpoints: why one cannot be recovered, and the lines that refuse a resume.

A checkpoint that fails its manifest or its read is set aside (``<step>.damaged``),
never deleted: it may be all a run has. What is decided from listings and manifests
alone lives here, so ``resume`` refuses before it writes anything (``runs/local.py``)
and ``Checkpoints`` (checkpointing.py) refuses the same way once it has looked.
"""

from __future__ import annotations

from pathlib import Path

from rlctl.core.errors import ConflictError
from rlctl.core.store.base import (
    CHECKPOINTS,
    MANIFEST,
    ORBAX_METADATA,
    SET_ASIDE,
    RunDir,
    set_aside_checkpoints,
)
from rlctl.core.store.manifest import verify
from rlctl.core.store.records import read_manifest


def first_line(e: BaseException, limit: int = 200) -> str:
    """An exception's first line, cut to ``limit`` characters."""
    line = (str(e).strip().splitlines() or [""])[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"


def manifest_damaged(folder: Path) -> str | None:
    """Why a set-aside checkpoint cannot be recovered, or None when it may be: its
    files match its manifest (intact as far as a manifest can tell: set aside when a
    read failed, which recovering tries again), or only its manifest is missing or
    unreadable (its data then gets checked by reading it back). Every file is read
    and hashed to decide."""
    try:
        read_manifest((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        pass  # missing or unreadable: only the manifest is lost
    else:  # a manifest that reads: the data must match it
        why = verify(folder)
        return f"its data does not match its {MANIFEST} ({why})" if why else None
    if not (folder / ORBAX_METADATA).is_file():
        return f"it has no {ORBAX_METADATA}"
    return None


def refusal(run: RunDir, what: str = "no intact checkpoint") -> ConflictError:
    """The one line that stops a resume whose checkpoints were all set aside: it names
    them and the ways on. A run that has any is never restarted from step 0 unless its
    user asks (the set-aside data may be all the run has)."""
    aside = set_aside_checkpoints(run)
    names = ", ".join(f"{CHECKPOINTS}/{n}" for n in aside) or "none"
    local = not run.uri.startswith("gs://")
    recover = (
        f"if only its {MANIFEST} is damaged, 'rlctl resume {run.name} --recover' "
        "reads its data back and resumes from it; "
        if local
        else ""
    )
    return ConflictError(
        f"run {run.name!r} has {what} to resume from; set aside as damaged (kept, not "
        f"deleted): {names} in {run.uri}",
        hint=f"{recover}to start over from step 0, 'rlctl delete run {run.name}"
        f"{'' if local else ' --purge'}' and train again",
    )


def recover_candidates(run: RunDir) -> tuple[int, list[str]]:
    """(the newest complete checkpoint's step or 0, the set-aside checkpoints newer
    than it): what ``resume --recover`` may bring back, from a listing alone, so a
    resume with nothing to recover is refused before it writes anything."""
    newest = max(run.checkpoint_steps(), default=0)
    newer = [n for n in set_aside_checkpoints(run) if int(SET_ASIDE.match(n).group(1)) > newest]  # type: ignore[union-attr]
    return newest, newer


def nothing_to_recover(run: RunDir, newest: int, refused: list[str]) -> ConflictError:
    """The one line of a ``--recover`` with nothing to bring back: the set-aside
    checkpoints it read and refused (their data does not match their manifest), or
    why it had none to read, and what helps instead."""
    older = [n for n in set_aside_checkpoints(run) if int(SET_ASIDE.match(n).group(1)) <= newest]  # type: ignore[union-attr]
    what = "; ".join(refused) or (
        f"{', '.join(f'{CHECKPOINTS}/{n}' for n in older)} "
        f"{'is' if len(older) == 1 else 'are'} not newer than the intact "
        f"checkpoint {newest}"
        if older
        else "no checkpoint is set aside"
    )
    hint = (
        f"resume without --recover: it continues from checkpoint {newest}"
        if newest
        else f"nothing of it can be trained on: start over from step 0 with "
        f"'rlctl delete run {run.name}' and train again"
    )
    return ConflictError(f"nothing to recover in {run.uri}: {what}", hint=hint)
