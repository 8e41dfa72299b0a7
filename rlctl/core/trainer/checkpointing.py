"""Orbax checkpoints of a run: the model's parameters and the optimizer's state.

Those two are all a step depends on besides (seed, step), so a run resumed from
its latest complete checkpoint continues exactly as if it had never stopped. In a
multi-host run every process restores the step process 0 chose, and process 0
alone writes, from arrays gathered whole.

Where the numerics table says so (an accelerator's row: ``background_saves``) a save
does not stall the steps: the state is copied on the device (the next update donates
the model's own buffers) and a thread writes that copy, its manifest and the store's
commit marker while the next steps run. At most one save is in flight: the next one,
a stop and the end of the run wait for it. A process killed meanwhile leaves only
Orbax's temporary folder, removed on the next open, so resume restores the previous
complete checkpoint; nothing half-written is ever restored.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from rlctl.core.checkpoints.lora import LORA_FILE
from rlctl.core.errors import ConflictError, DiskFullError
from rlctl.core.store.base import (
    CHECKPOINTS,
    MANIFEST,  # in each step folder, written after Orbax finished
    ORBAX_METADATA,  # written by every Orbax save we make
    SET_ASIDE,
    RunDir,
    atomic_write,
    set_aside_checkpoints,
    step_number,
)
from rlctl.core.store.manifest import checkpoint_files as _files
from rlctl.core.store.manifest import verify, write_manifest
from rlctl.core.store.records import read_manifest
from rlctl.core.trainer import stops
from rlctl.core.trainer.distributed import Topology, agree, place_like, to_host
from rlctl.core.trainer.memory import return_freed_memory
from rlctl.core.units import human_bytes

# Free space wanted before a save: the checkpoint's expected size (the last one's on
# disk; for the first, estimated from the state: checkpoint_size.py) plus 10% and
# 256 KiB for Orbax's metadata files and the file system's blocks (a fixed 16 MiB
# refused a small model's first save on a disk twice its checkpoint's size).
HEADROOM = 1.1
SLACK = 256 * 2**10


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in _files(folder)) if folder.is_dir() else 0


def checkpoint_bytes(folder: str | Path) -> int:
    """Bytes on disk of one checkpoint folder (0 when absent)."""
    return _size(Path(folder))


def space_needed(last_checkpoint: int, state: int) -> int:
    """Free bytes to ask for before a save: from the last checkpoint's size on disk
    when there is one, else from ``state``, the first checkpoint's size estimated from
    the state (``checkpoint_size.estimate_bytes``: Orbax compresses, so a checkpoint
    can be far smaller than the state's bytes in memory); plus a margin. Asking for
    more than that refused saves that would have fit."""
    base = last_checkpoint or state
    return int(base * HEADROOM) + SLACK if base else 0


def first_line(e: BaseException, limit: int = 200) -> str:
    """An exception's first line, cut to ``limit`` characters."""
    line = (str(e).strip().splitlines() or [""])[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _manifest_damaged(folder: Path) -> str | None:
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


def _failed_read(exc: BaseException | None, tb: Any = None, text: str = "") -> bool:
    """Whether an exception (its traceback, its text, or the text it is reported
    with) comes from Orbax's or TensorStore's reads. Collected late, some come without
    a traceback ("Future exception was never retrieved"), so the text counts too:
    TensorStore's errors name their drivers ("Error opening \"zarr\" driver") or,
    reading a chunk past a cut file's end, only Orbax's OCDBT key-value store
    ("OUT_OF_RANGE: Error reading \"model.lm_head.w/0.0\" in OCDBT database at ...":
    a CI run in about ten met that one)."""
    tb = tb or getattr(exc, "__traceback__", None)
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if "/orbax/" in name or "/tensorstore/" in name:
            return True
        tb = tb.tb_next
    said = f"{text} {exc}"
    return (
        "/orbax/" in said
        or "TensorStore" in said
        or '" driver' in said
        or "in OCDBT database" in said
    )


def restore_noise(info: Any) -> bool:
    """An unraisable exception a failed Orbax restore leaves behind: one of
    TensorStore's read callbacks landing on the failed read's closed event loop, or
    one of Orbax's read coroutines (``_read_array_index_and_device_put``) raising
    its read error as it is garbage-collected unawaited ("Exception ignored in:
    <coroutine ...>", a 60-line TensorStore spec each, in whichever order the
    collector runs: why the same damage printed it in one test run in four)."""
    e = info.exc_value
    if isinstance(e, RuntimeError) and str(e) == "Event loop is closed":
        return True
    return _failed_read(e, info.exc_traceback, repr(getattr(info, "object", "")))


class _UnretrievedReads(logging.Filter):
    """Drop asyncio's "Task exception was never retrieved" dump (80 lines and a
    chained traceback each) for an Orbax read task of a restore that already failed
    and was reported in one line. Installed once, for the rest of the process: the
    tasks report when collected, often at exit."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "exception was never retrieved" not in str(record.msg) or not record.exc_info:
            return True
        _, exc, tb = record.exc_info
        return not _failed_read(exc, tb, record.getMessage())


_UNRETRIEVED = _UnretrievedReads()

# Orbax's read coroutines that a failed restore leaves unawaited: collected at exit,
# each printed "sys:1: RuntimeWarning: coroutine '_read_array_index_and_device_put'
# was never awaited" and a tracemalloc hint after the command's error and hint (a
# CI run in about ten, a checkpoint's largest data file cut in half).
_UNAWAITED_READS = (
    r"coroutine '(?:\w+\.)*_read_(?:shard|array_index_and_device_put"
    r"|and_create_array)' was never awaited"
)


class _QuietRestore:
    """Keep a failed restore to the one warning line the fallback prints: without this
    each damaged checkpoint also printed its TensorStore reads' "Event loop is closed"
    tracebacks (unraisable exceptions), asyncio's "Task exception was never
    retrieved" dumps and, at exit, "coroutine ... was never awaited" warnings:
    hundreds of lines for the tiny test model, tens of thousands for a real one.
    Anything else still reaches the hook in place before."""

    def __init__(self) -> None:
        self.previous: Any = None

    def _hook(self, info: Any) -> None:
        if not restore_noise(info):
            self.previous(info)

    def install(self) -> None:
        logging.getLogger("asyncio").addFilter(_UNRETRIEVED)  # once: a set of filters
        # for the rest of the process too (they come at exit); Python keeps one copy
        warnings.filterwarnings("ignore", _UNAWAITED_READS, RuntimeWarning)
        if self.previous is None:
            self.previous, sys.unraisablehook = sys.unraisablehook, self._hook

    def remove(self) -> None:
        if self.previous is not None and sys.unraisablehook == self._hook:
            sys.unraisablehook = self.previous
        self.previous = None


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


def _last_good(step: int | None) -> str:
    return f"the last good checkpoint is {step}" if step else "no checkpoint was saved yet"


def _trained(lora: bool) -> Any:
    """What a checkpoint holds of the model: a LoRA run's adapters alone (its base is
    the model source, recorded in ``LORA_FILE``), else every parameter."""
    from flax import nnx

    return nnx.LoRAParam if lora else nnx.Param


def _state(model: Any, optimizer: Any, lora: bool = False) -> dict[str, Any]:
    from flax import nnx

    return {
        "model": nnx.to_pure_dict(nnx.state(model, _trained(lora))),
        "optimizer": nnx.to_pure_dict(nnx.state(optimizer)),
    }


def _free(tree: Any, keep: Any) -> None:
    """Delete the device buffers of ``tree``'s arrays, but those also in ``keep``."""
    import jax

    held = {id(x) for x in jax.tree.leaves(keep)}
    for x in jax.tree.leaves(tree):
        if isinstance(x, jax.Array) and id(x) not in held and not x.is_deleted():
            x.delete()


def _owned(tree: Any) -> Any:
    """``tree`` with each restored array replaced by a copy XLA allocated, one array
    at a time (each source freed before the next copy: at most one array more).

    On the CPU a restored array wraps the host buffer TensorStore read it into; the
    first step over such weights (the sampler's compile and first decode) peaked about
    1 GiB above a fresh run's on the default model with the same live arrays: whole
    runs 4.88 vs 3.86 GiB; over XLA's own copies 3.94 vs 3.85
    (bench/bench_resume_memory.py)."""
    import jax
    import jax.numpy as jnp

    leaves, treedef = jax.tree.flatten(tree)
    for i, x in enumerate(leaves):
        if isinstance(x, jax.Array):
            leaves[i] = jnp.array(x, copy=True)
            x.delete()
    return jax.tree.unflatten(treedef, leaves)


def remove_partial(folder: str | Path) -> list[str]:
    """Delete the temporary folders of saves that never finished (Orbax writes
    ``<step>.orbax-checkpoint-tmp...`` and renames it when complete): a killed or
    interrupted save must not keep its disk space, nor be mistaken for a checkpoint."""
    import shutil

    removed = []
    p = Path(folder)
    for entry in sorted(p.iterdir()) if p.is_dir() else []:
        if "orbax-checkpoint-tmp" in entry.name:
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink()
            removed.append(entry.name)
    return removed


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM for the block, then deliver them to the handlers that
    were in place. An interrupt inside a save leaves Orbax's writer threads filling a
    temp folder after the folder was cleaned up; a save takes seconds, so the stop
    waits for it and the run stops at a safe point with one more complete checkpoint."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    wanted = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, frame: held.append(signum)) for s in wanted}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    for signum in dict.fromkeys(held):
        signal.raise_signal(signum)


def _device_copy(x: Any) -> Any:
    """A copy of ``x`` in its own device buffer, where it is (a background save's): a
    transfer, not a compiled program, so a save after the first step is no late
    compile (``compiles.CompileWatch``)."""
    import jax

    if not isinstance(x, jax.Array):
        return x
    return jax.device_put(x, x.sharding, may_alias=False)


# Bytes of the state Orbax may have copied at once while saving. Its default, 96 GB,
# copies the whole state first: measured on the default run, the save then raised the
# process's resident memory by 0.8-1.3 GB (its peak); 256 MB in flight holds that to
# about 0.25 GB at the same speed. An array larger than this is let through whole.
SAVE_IN_FLIGHT = 256 * 2**20


@dataclass
class Saved:
    """One save: its step, the seconds it held the step up (the copy, or the whole
    save in the step) and the seconds its write took, in the background or not."""

    step: int
    held_s: float
    write_s: float = 0.0
    background: bool = False
    bytes: int | None = None  # the checkpoint's size on disk (its manifest's total)

    def record(self) -> dict[str, Any]:
        """status.json's ``last_save``: what ``status`` shows of it."""
        return {
            "step": self.step,
            "bytes": self.bytes,
            "seconds": round(self.write_s if self.background else self.held_s, 2),
            "background": self.background,
        }


@dataclass
class _Flight:
    """The save a thread is writing: its thread, what it reports, its failure."""

    thread: threading.Thread
    saved: Saved
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


class Checkpoints:
    """The run's checkpoint folder, brought up to date from the run store on open.

    ``background``: saves written by a thread while the run goes on (one process
    only; ``numerics.Numerics.background_saves``); ``latest`` is always the newest
    complete checkpoint, and ``finished()`` hands over the saves completed since."""

    def __init__(
        self,
        run: RunDir,
        topo: Topology,
        keep: int,
        warn: Callable[[str], None] | None = None,
        recover: bool = False,
        lora: dict[str, Any] | None = None,
        background: bool = False,
    ) -> None:
        import orbax.checkpoint as ocp

        self.background = background and not topo.multi_process
        self._flight: _Flight | None = None
        self._finished: list[Saved] = []  # complete, not yet handed over (finished())
        self.run = run
        self.lora = lora  # a LoRA run: what each checkpoint records of its base
        self.topo = topo
        # Orbax >= 0.12.8 refuses relative paths (a relative staging root, say)
        folder = os.path.abspath(run.path_for(CHECKPOINTS))
        self.folder = folder
        if topo.is_writer:
            remove_partial(folder)  # left by a run killed while saving
        # the newest checkpoint that verifies (run store sync, gs://: fetched into
        # staging first); every process restores the step process 0 chose
        self._warn = warn or (lambda message: None)
        self._quiet = _QuietRestore()
        self._recovered: set[int] = set()
        if topo.is_writer:
            self._set_aside_incomplete()
        if recover and topo.is_writer:
            self._recover()
        latest = agree(self._newest_intact(self._warn), topo)
        self.latest: int | None = latest or None
        if latest:
            run.fetch_checkpoint(latest)
        extra = {}
        if topo.multi_process:
            # gathered, unsharded arrays: each process reads and writes them on its own
            # (Orbax leaves creating the folder to us in that mode)
            Path(folder).mkdir(parents=True, exist_ok=True)
            me = topo.process_index
            extra["multiprocessing_options"] = ocp.options.MultiprocessingOptions(
                primary_host=me, active_processes={me}
            )
        self.latest_size = _size(Path(folder) / str(latest)) if latest else 0
        self._options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            create=not topo.multi_process,
            enable_async_checkpointing=False,
            **extra,
        )
        self._in_flight = SAVE_IN_FLIGHT
        self.manager = self._new_manager()

    def _new_manager(self) -> Any:
        import orbax.checkpoint as ocp

        # save_concurrent_gb is typed int (GB), but a fraction of a GB works as well;
        # a restore reads as little at once (its host buffers sit beside the arrays
        # they become: 96 GB by default, the whole state held twice on a resume)
        handler = ocp.StandardCheckpointHandler(
            save_concurrent_gb=self._in_flight / 1e9, restore_concurrent_gb=self._in_flight / 1e9
        )
        return ocp.CheckpointManager(self.folder, options=self._options, item_handlers=handler)

    def _fit_in_flight(self, state: Any) -> None:
        """Raise the in-flight limit to the state's largest array (plus 1 MiB) when
        that is above ``SAVE_IN_FLIGHT``: Orbax refuses to read or write an array larger
        than its limit ("Requested more bytes than we reserved space for"), which on a
        restore would set a sound checkpoint aside as damaged."""
        import jax

        in_flight = max(
            [SAVE_IN_FLIGHT, *(getattr(x, "nbytes", 0) + 2**20 for x in jax.tree.leaves(state))]
        )
        if in_flight != self._in_flight:
            self._in_flight = in_flight
            self.manager.close()
            self.manager = self._new_manager()

    def _fresh_manager(self) -> None:
        """A new manager over the folder as it is now: after a failed restore Orbax's
        handlers keep state that fails the next restore ("Must provide args ...")."""
        self.manager.close()
        self.manager = self._new_manager()

    def _newest_intact(self, warn: Callable[[str], None]) -> int:
        steps = sorted(self.run.checkpoint_steps(), reverse=True)
        for i, step in enumerate(steps):
            self.run.fetch_checkpoint(step)
            why = verify(Path(self.folder) / str(step))
            if why is None:
                return step
            later = steps[i + 1] if i + 1 < len(steps) else None
            warn(
                f"checkpoint {step} is damaged ({why}); {self._set_aside(step)}; "
                + (f"trying checkpoint {later}" if later else "no earlier checkpoint")
            )
        if steps or set_aside_checkpoints(self.run):
            # never a reason to start over: the set-aside data may be all the run has
            self._refuse("no intact checkpoint")
        return 0

    def _set_aside_incomplete(self) -> None:
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
            self._warn(
                f"checkpoint {step} is incomplete ({why or 'not a checkpoint'}); "
                f"{self._set_aside(step)}"
            )

    def _refuse(self, what: str, cause: BaseException | None = None) -> NoReturn:
        raise refusal(self.run, what) from cause

    def _recover(self) -> None:
        """``resume --recover``: bring back the set-aside checkpoints newer than every
        remaining one whose only known damage is a missing or unreadable manifest (one
        whose data does not match a manifest that reads stays aside). The manifest is
        dropped; restoring then reads every array (a failed read sets the checkpoint
        aside again) and a fresh manifest is written once it restored."""
        newest, newer = recover_candidates(self.run)
        refused: list[str] = []
        for name in newer:
            step = int(SET_ASIDE.match(name).group(1))  # type: ignore[union-attr]
            if step in self._recovered:
                continue
            folder = Path(self.folder) / name
            why = _manifest_damaged(folder)
            if why is not None:
                refused.append(f"{CHECKPOINTS}/{name}: {why}")
                continue
            if verify(folder) is not None:  # only the manifest is lost: drop it
                (folder / MANIFEST).unlink(missing_ok=True)
            self.run.move(f"{CHECKPOINTS}/{name}", f"{CHECKPOINTS}/{step}")
            self._recovered.add(step)
            self._warn(
                f"recovering checkpoint {step} from {CHECKPOINTS}/{name}: "
                "its data is read back to check it"
            )
        if not self._recovered:
            raise nothing_to_recover(self.run, newest, refused)

    def _check_space(self, step: int, state: Any) -> None:
        """Fail before a save that cannot fit, not inside Orbax (which leaves a
        partial folder filling the disk and a wall of errors); see ``space_needed``."""
        from rlctl.core.trainer.checkpoint_size import estimate_bytes

        need = space_needed(self.latest_size, 0 if self.latest_size else estimate_bytes(state))
        if not need:
            return
        free = shutil.disk_usage(self.folder).free
        if free < need:
            good = _last_good(self.manager.latest_step())
            raise DiskFullError(
                f"not enough disk space for checkpoint {step}: needs about "
                f"{human_bytes(need)}, {human_bytes(free)} free in {self.folder}; "
                f"{good}",
                hint=f"free some space (or lower checkpoint.keep), then 'rlctl resume "
                f"{self.run.name}'",
            )

    def save(self, step: int, model: Any, optimizer: Any) -> None:
        """Checkpoint ``step``, holding at most ``SAVE_IN_FLIGHT`` bytes (or the
        largest array) of host copies at once; in the background, the state's device
        copy is handed to a thread and this returns once it is made."""
        import jax

        self.wait()  # at most one save in flight: the previous one is complete first
        t0 = time.perf_counter()
        state = _state(model, optimizer, self.lora is not None)
        if self.topo.multi_process:
            state = to_host(state, self.topo)  # a collective: every process takes part
        if not self.topo.is_writer:
            return
        self._check_space(step, state)
        self._fit_in_flight(state)
        # Ctrl-C / SIGTERM land after the save (or its copy), not inside it (under the
        # run driver's handler a second one cuts it short: the user asked twice)
        with stops.deferred() if stops.is_installed() else signals_deferred():
            if self.background:
                # the save's own arrays: the next update donates (reuses) the model's
                copies = jax.block_until_ready(jax.tree.map(_device_copy, state))
                saved = Saved(step, time.perf_counter() - t0, background=True)
                flight = _Flight(
                    threading.Thread(
                        target=self._write_in_background,
                        args=(step, copies),
                        daemon=True,
                        name=f"rlctl-save-{step}",
                    ),
                    saved,
                )
                self._flight = flight
                flight.thread.start()
                return
            self._write(step, state)
            held = time.perf_counter() - t0
            self._finished.append(Saved(step, held, held, bytes=self.latest_size))
        # the save's host copies and TensorStore's buffers, freed in its threads' heaps:
        # kept there, they raised the default run's peak by 0.6 GB at the next update
        return_freed_memory()

    def _write(self, step: int, state: Any) -> None:
        """Orbax's save of ``state`` as ``step``, then the LoRA record and the manifest,
        then the run store's commit (gs://: upload, then its marker)."""
        import orbax.checkpoint as ocp

        try:
            self.manager.save(step, args=ocp.args.StandardSave(state))
            self.manager.wait_until_finished()
        except Exception as e:  # Orbax wraps ENOSPC in its own errors: find it by text
            remove_partial(self.folder)  # a partial save would keep the disk full
            if "No space left" not in str(e) and "RESOURCE_EXHAUSTED" not in str(e):
                raise
            raise DiskFullError(
                f"disk full while saving checkpoint {step} in {self.folder}; "
                f"{_last_good(self.manager.latest_step())}",
                hint=f"free some space, then 'rlctl resume {self.run.name}'",
            ) from None
        if self.lora is not None:  # covered by the manifest, written next
            atomic_write(
                Path(self.folder) / str(step) / LORA_FILE, json.dumps(self.lora, indent=1) + "\n"
            )
        self.latest_size = write_manifest(Path(self.folder) / str(step))
        self.run.publish_checkpoint(step)  # run store sync (gs://): upload, then marker
        self.latest = step

    def _write_in_background(self, step: int, copies: Any) -> None:
        """The thread of a background save: its failure is kept for ``wait``."""
        flight = self._flight
        assert flight is not None and flight.saved.step == step
        t0 = time.perf_counter()
        try:
            self._write(step, copies)
            flight.saved.bytes = self.latest_size
        except BaseException as e:  # raised on the run's thread by wait()
            flight.error = e
        finally:
            del copies  # the device copy's memory, as soon as it is written
            flight.saved.write_s = time.perf_counter() - t0
            flight.done.set()
            return_freed_memory()

    def in_flight(self) -> int | None:
        """The step a background save is writing now, or None."""
        flight = self._flight
        return None if flight is None or flight.done.is_set() else flight.saved.step

    def wait(self) -> None:
        """Until the save in flight (if any) is complete: its manifest written and
        the store committed. Its failure is raised here, on the run's thread."""
        flight, self._flight = self._flight, None
        if flight is None:
            return
        flight.thread.join()
        if flight.error is not None:
            raise flight.error
        self._finished.append(flight.saved)

    def finished(self) -> list[Saved]:
        """The saves completed since the last call (a background one once it is
        complete and committed: ``latest`` is then its step)."""
        flight = self._flight
        if flight is not None and flight.done.is_set():
            self.wait()
        out, self._finished = self._finished, []
        return out

    def restore_latest(self, model: Any, optimizer: Any) -> int:
        """Load the latest checkpoint into ``model`` and ``optimizer`` in place; its
        step, or 0 (and nothing loaded) when the run has none."""
        import jax
        import orbax.checkpoint as ocp
        from flax import nnx

        step = self.latest
        if step is None:
            return 0
        if self.lora is not None:
            self._check_base(step)
        state = _state(model, optimizer, self.lora is not None)
        self._fit_in_flight(state)
        if self.topo.multi_process:  # whole arrays from disk, then sharded over the mesh
            target = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), state)
            restored = self.manager.restore(step, args=ocp.args.StandardRestore(target))
            restored = place_like(restored, state)
        else:
            abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
            # The optimizer's fresh moments (zeros: two thirds of the state) are
            # replaced by the checkpoint's: freed first, a resume does not hold both
            # (it peaked 1.2-1.7 GB above a fresh run on the default model). Nothing
            # else holds them; a failed read refuses the run, which never uses them.
            _free(state["optimizer"], keep=state["model"])
            del state
            step, restored = self._restore_readable(step, abstract)
            if jax.default_backend() == "cpu":
                restored = _owned(restored)
        if step in self._recovered and self.topo.is_writer:
            self.latest_size = write_manifest(Path(self.folder) / str(step))
            self._warn(
                f"recovered checkpoint {step}: every array read back; its {MANIFEST} written anew"
            )
        model_state = nnx.state(model, _trained(self.lora is not None))
        nnx.replace_by_pure_dict(model_state, restored["model"])
        nnx.update(model, model_state)
        opt_state = nnx.state(optimizer)
        nnx.replace_by_pure_dict(opt_state, restored["optimizer"])
        nnx.update(optimizer, opt_state)
        del restored, model_state, opt_state
        return_freed_memory()  # TensorStore's read buffers, freed in its threads' heaps
        return int(step)

    def _check_base(self, step: int) -> None:
        """A LoRA checkpoint's adapters fit only the base they were trained on: refuse
        to restore them onto a model whose weights changed since."""
        assert self.lora is not None
        path = Path(self.folder) / str(step) / LORA_FILE
        try:
            saved = json.loads(path.read_text())["base"]
        except (OSError, ValueError, KeyError, TypeError):
            raise ConflictError(
                f"checkpoint {step} of run {self.run.name!r} is not a LoRA checkpoint of "
                f"this run (no readable {LORA_FILE})",
                hint=f"'rlctl delete run {self.run.name}' and train again",
            ) from None
        now = self.lora["base"]
        if saved.get("sha256") != now["sha256"]:
            raise ConflictError(
                f"run {self.run.name!r}: its LoRA adapters were trained on other weights "
                f"of {saved.get('source')!r} (SHA-256 {str(saved.get('sha256'))[:12]}, now "
                f"{now['sha256'][:12]}); restoring them onto this base would be wrong",
                hint="put the original model back, or train a new run",
            )

    def _set_aside(self, step: int) -> str:
        """Rename a damaged step folder out of the checkpoint list (kept for a look,
        never restored again) so that the resumed run saves that step afresh: Orbax
        skips a save whose step it already has, which would keep the damage."""
        if not self.topo.is_writer:
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

    def _restore_readable(self, newest: int, abstract: Any) -> tuple[int, Any]:
        """(step, state) of the newest checkpoint from ``newest`` down that Orbax can
        read. One without a manifest (an older rlctl's) is verified only by reading it;
        a failure is one warning line (TensorStore's own run to dozens) and the one
        before it is tried."""
        import orbax.checkpoint as ocp

        steps = [s for s in sorted(self.run.checkpoint_steps(), reverse=True) if s <= newest]
        errors: list[str] = []
        last: BaseException | None = None
        self._quiet.install()  # until close(): a failed read's noise comes late too
        for s in steps:
            try:
                self.run.fetch_checkpoint(s)
                return s, self.manager.restore(s, args=ocp.args.StandardRestore(abstract))
            except Exception as e:
                last = e
                errors.append(f"{s} ({type(e).__name__}: {first_line(e, 120)})")
                self._warn(
                    f"checkpoint {s} could not be read ({errors[-1]}); "
                    f"{self._set_aside(s)}; "
                    + ("trying the one before it" if s != steps[-1] else "no earlier checkpoint")
                )
                self._fresh_manager()
        self._refuse("no readable checkpoint", last)

    def close(self) -> None:
        """Wait for the save in flight (a second stop signal cuts that wait short;
        its temporary folder then goes at the next open), then drop any save an
        interrupt cut short. A background save's failure is not raised here: the run
        raised it already (``wait`` before it completed) or is failing for another
        reason, which stays the one reported."""
        flight = self._flight
        try:
            if flight is not None:
                flight.thread.join()
        finally:
            self._flight = None
            if flight is None or flight.done.is_set():
                self.manager.close()
                if self.topo.is_writer:
                    remove_partial(self.folder)
            self._quiet.remove()
