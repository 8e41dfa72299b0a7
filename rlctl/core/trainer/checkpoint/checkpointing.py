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

This module holds the Orbax manager and the save/restore it drives; beside it, by
job: checkpoint_saves.py (the save in flight and those completed: bookkeeping),
checkpoint_memory.py (the memory a save or restore holds), checkpoint_size.py (the
disk space a save asks for), checkpoint_damage.py (set-aside checkpoints and the
lines that refuse a resume), checkpoint_noise.py (a failed read's late noise).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from rlctl.core.checkpoints.lora import LORA_FILE
from rlctl.core.errors import ConflictError, DiskFullError
from rlctl.core.store.base import (
    CHECKPOINTS,
    MANIFEST,  # in each step folder, written after Orbax finished
    RunDir,
    atomic_write,
)
from rlctl.core.store.manifest import write_manifest
from rlctl.core.trainer.checkpoint.checkpoint_damage import (
    SetAside,
    first_line,
    refusal,
)
from rlctl.core.trainer.checkpoint.checkpoint_memory import (
    SAVE_IN_FLIGHT,
    device_copy,
    free,
    in_flight_limit,
    owned,
)
from rlctl.core.trainer.checkpoint.checkpoint_noise import QuietRestore
from rlctl.core.trainer.checkpoint.checkpoint_saves import Saved, SaveLedger, signals_deferred
from rlctl.core.trainer.checkpoint.checkpoint_size import checkpoint_bytes, space_needed
from rlctl.core.trainer.runtime import stops
from rlctl.core.trainer.runtime.distributed import Topology, agree, place_like, to_host
from rlctl.core.trainer.runtime.memory import return_freed_memory
from rlctl.core.units import human_bytes


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


class Checkpoints:
    """The run's checkpoint folder, brought up to date from the run store on open.

    ``background``: saves written by a thread while the run goes on (one process
    only; ``numerics.Numerics.background_saves``); ``latest`` is always the newest
    complete checkpoint, and ``finished()`` hands over the saves completed since.
    ``in_flight``: the bytes of the state Orbax may hold copied at once
    (``checkpoint_memory.SAVE_IN_FLIGHT`` by default; raised to the largest array)."""

    def __init__(
        self,
        run: RunDir,
        topo: Topology,
        keep: int,
        warn: Callable[[str], None] | None = None,
        recover: bool = False,
        lora: dict[str, Any] | None = None,
        background: bool = False,
        in_flight: int = SAVE_IN_FLIGHT,
    ) -> None:
        import orbax.checkpoint as ocp

        self.background = background and not topo.multi_process
        self.saves = SaveLedger()  # the save in flight, those not yet handed over
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
        self._quiet = QuietRestore()
        self.aside = SetAside(run, folder, topo.is_writer, self._warn)
        if topo.is_writer:
            self.aside.incomplete()
        if recover and topo.is_writer:
            self.aside.recover()
        latest = agree(self.aside.newest_intact(), topo)
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
        self.latest_size = checkpoint_bytes(Path(folder) / str(latest)) if latest else 0
        self._options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            create=not topo.multi_process,
            enable_async_checkpointing=False,
            **extra,
        )
        self._in_flight_floor = in_flight
        self._in_flight = in_flight
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
        """A new manager when the state's largest array needs a higher in-flight limit
        than the one it has (``checkpoint_memory.in_flight_limit``)."""
        in_flight = in_flight_limit(state, self._in_flight_floor)
        if in_flight != self._in_flight:
            self._in_flight = in_flight
            self.manager.close()
            self.manager = self._new_manager()

    def _fresh_manager(self) -> None:
        """A new manager over the folder as it is now: after a failed restore Orbax's
        handlers keep state that fails the next restore ("Must provide args ...")."""
        self.manager.close()
        self.manager = self._new_manager()

    def _refuse(self, what: str, cause: BaseException | None = None) -> NoReturn:
        raise refusal(self.run, what) from cause

    def _check_space(self, step: int, state: Any) -> None:
        """Fail before a save that cannot fit, not inside Orbax (which leaves a
        partial folder filling the disk and a wall of errors); see ``space_needed``."""
        from rlctl.core.trainer.checkpoint.checkpoint_size import estimate_bytes

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
        """Checkpoint ``step``, holding at most ``in_flight`` bytes (or the
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
                copies = jax.block_until_ready(jax.tree.map(device_copy, state))
                saved = Saved(step, time.perf_counter() - t0, background=True)
                self.saves.start(saved, lambda tree: self._write(step, tree), copies)
                return
            self._write(step, state)
            held = time.perf_counter() - t0
            self.saves.done(Saved(step, held, held, bytes=self.latest_size))
        # the save's host copies and TensorStore's buffers, freed in its threads' heaps:
        # kept there, they raised the default run's peak by 0.6 GB at the next update
        return_freed_memory()

    def _write(self, step: int, state: Any) -> int:
        """Orbax's save of ``state`` as ``step``, then the LoRA record and the manifest,
        then the run store's commit (gs://: upload, then its marker); the checkpoint's
        bytes on disk."""
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
        return self.latest_size

    def in_flight(self) -> int | None:
        """The step a background save is writing now, or None."""
        return self.saves.in_flight()

    def wait(self) -> None:
        """Until the save in flight (if any) is complete: its manifest written and
        the store committed. Its failure is raised here, on the run's thread."""
        self.saves.wait()

    def finished(self) -> list[Saved]:
        """The saves completed since the last call (a background one once it is
        complete and committed: ``latest`` is then its step)."""
        return self.saves.finished()

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
            free(state["optimizer"], keep=state["model"])
            del state
            step, restored = self._restore_readable(step, abstract)
            if jax.default_backend() == "cpu":
                restored = owned(restored)
        if step in self.aside.recovered and self.topo.is_writer:
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
                    f"{self.aside.move(s)}; "
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
        try:
            self.saves.settle(self._closed)
        finally:
            self._quiet.remove()

    def _closed(self, idle: bool) -> None:
        """Orbax's manager closed and a cut save's temporary folder removed, once no
        thread is writing (else both go at the next open)."""
        if idle:
            self.manager.close()
            if self.topo.is_writer:
                remove_partial(self.folder)
