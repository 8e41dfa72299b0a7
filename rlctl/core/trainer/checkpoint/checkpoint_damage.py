"""Damaged checkpoints: why one cannot be recovered, and the lines that refuse a resume.

A checkpoint that fails its manifest or its read is set aside (``<step>.damaged``),
never deleted: it may be all a run has. What is decided from listings and manifests
alone lives here, so ``resume`` refuses before it writes anything (``runs/local.py``)
and ``Checkpoints`` (checkpointing.py) refuses the same way once it has looked.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from rlctl.core.errors import ConflictError
from rlctl.core.store.base import (
    CHECKPOINTS,
    MANIFEST,
    ORBAX_METADATA,
    RunDir,
    set_aside_checkpoints,
    set_aside_step,
    step_number,
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
    newer = [n for n in set_aside_checkpoints(run) if set_aside_step(n) > newest]
    return newest, newer


def nothing_to_recover(run: RunDir, newest: int, refused: list[str]) -> ConflictError:
    """The one line of a ``--recover`` with nothing to bring back: the set-aside
    checkpoints it read and refused (their data does not match their manifest), or
    why it had none to read, and what helps instead."""
    older = [n for n in set_aside_checkpoints(run) if set_aside_step(n) <= newest]
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


class SetAside:
    """A run's damaged checkpoints: found, moved aside as ``<step>.damaged`` (never
    deleted: they may be all a run has) and, for ``resume --recover``, brought back.
    Process 0 alone moves folders; the others are told what it does."""

    def __init__(
        self, run: RunDir, folder: str, is_writer: bool, warn: Callable[[str], None]
    ) -> None:
        self.run = run
        self.folder = folder  # the run's local checkpoints folder (gs://: its staging)
        self.is_writer = is_writer
        self.warn = warn
        self.recovered: set[int] = set()  # brought back this run: a manifest to re-write

    def newest_intact(self) -> int:
        """The newest checkpoint whose files verify (the damaged ones before it set
        aside), 0 when the run has none; refused when all it has were set aside."""
        steps = sorted(self.run.checkpoint_steps(), reverse=True)
        for i, step in enumerate(steps):
            self.run.fetch_checkpoint(step)
            why = verify(Path(self.folder) / str(step))
            if why is None:
                return step
            later = steps[i + 1] if i + 1 < len(steps) else None
            self.warn(
                f"checkpoint {step} is damaged ({why}); {self.move(step)}; "
                + (f"trying checkpoint {later}" if later else "no earlier checkpoint")
            )
        if steps or set_aside_checkpoints(self.run):
            # never a reason to start over: the set-aside data may be all the run has
            raise refusal(self.run, "no intact checkpoint")
        return 0

    def incomplete(self) -> None:
        """Move aside every folder named as a step that is no complete checkpoint (an
        empty folder, one copied without its metadata, a file): never counted as the
        latest (``checkpoint_steps``), but Orbax would take it for a step it has and
        skip saving that step."""
        folder = Path(self.folder)
        complete = set(self.run.checkpoint_steps())
        for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
            step = step_number(entry.name)
            if step is None or step in complete:
                continue
            why = verify(entry) if entry.is_dir() else "it is a file, not a folder"
            self.warn(
                f"checkpoint {step} is incomplete ({why or 'not a checkpoint'}); {self.move(step)}"
            )

    def recover(self) -> None:
        """``resume --recover``: bring back the set-aside checkpoints newer than every
        remaining one whose only known damage is a missing or unreadable manifest (one
        whose data does not match a manifest that reads stays aside). The manifest is
        dropped; restoring then reads every array (a failed read sets the checkpoint
        aside again) and a fresh manifest is written once it restored."""
        newest, newer = recover_candidates(self.run)
        refused: list[str] = []
        for name in newer:
            step = set_aside_step(name)
            if step in self.recovered:
                continue
            folder = Path(self.folder) / name
            why = manifest_damaged(folder)
            if why is not None:
                refused.append(f"{CHECKPOINTS}/{name}: {why}")
                continue
            if verify(folder) is not None:  # only the manifest is lost: drop it
                (folder / MANIFEST).unlink(missing_ok=True)
            self.run.move(f"{CHECKPOINTS}/{name}", f"{CHECKPOINTS}/{step}")
            self.recovered.add(step)
            self.warn(
                f"recovering checkpoint {step} from {CHECKPOINTS}/{name}: "
                "its data is read back to check it"
            )
        if not self.recovered:
            raise nothing_to_recover(self.run, newest, refused)

    def move(self, step: int) -> str:
        """Rename a damaged step folder out of the checkpoint list (kept for a look,
        never restored again) so that the resumed run saves that step afresh: Orbax
        skips a save whose step it already has, which would keep the damage."""
        if not self.is_writer:
            return "left for process 0"
        src = Path(self.folder) / str(step)
        taken = set(self.run.list(CHECKPOINTS))
        dst = src.with_name(f"{step}.damaged")
        n = 1
        while dst.exists() or dst.name in taken:
            n += 1
            dst = src.with_name(f"{step}.damaged-{n}")
        if src.exists():
            os.replace(src, dst)  # the local folder (gs://: its staging copy)
        # the store's copy is kept too (gs://: moved, its COMMITTED marker dropped first)
        self.run.move(f"{CHECKPOINTS}/{step}", f"{CHECKPOINTS}/{dst.name}")
        return f"moved to {CHECKPOINTS}/{dst.name}"
