"""Orbax checkpoints of a run: the model's parameters and the optimizer's state.

Those two are all a step depends on besides (seed, step), so a run resumed from
its latest complete checkpoint continues exactly as if it had never stopped. In a
multi-host run every process restores the step process 0 chose, and process 0
alone writes, from arrays gathered whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rlctl.core.errors import ConflictError, DiskFullError
from rlctl.core.store.base import CHECKPOINTS, atomic_write
from rlctl.core.store.local import LocalRunDir
from rlctl.core.trainer.distributed import Topology, agree, place_like, to_host

MANIFEST = "rlctl-manifest.json"  # in each step folder, written after Orbax finished
HEADROOM = 1.1  # free space wanted before a save, as a multiple of the last checkpoint


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(folder: Path) -> int:
    """Record every file's size and SHA-256 (written last, atomically): a checkpoint
    that later loses or changes a byte is then known to be damaged. Its total size."""
    files = {str(p.relative_to(folder)): [p.stat().st_size, _sha256(p)] for p in _files(folder)}
    atomic_write(folder / MANIFEST, json.dumps({"files": files}, indent=1) + "\n")
    return sum(size for size, _ in files.values())


def verify(folder: Path) -> str | None:
    """None when the checkpoint in ``folder`` is intact, else what is wrong with it.
    One without a manifest (an older rlctl's, or killed just before writing it) is
    trusted as Orbax left it: Orbax renames a save into place only when complete."""
    manifest = folder / MANIFEST
    if not manifest.exists():
        return None
    try:
        files = json.loads(manifest.read_text())["files"]
        expected = {rel: (int(size), str(digest)) for rel, (size, digest) in files.items()}
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return f"its {MANIFEST} is damaged"
    for rel, (size, digest) in expected.items():
        p = folder / rel
        if not p.is_file():
            return f"{rel} is missing"
        if p.stat().st_size != size:
            return f"{rel} has {p.stat().st_size} bytes, not {size}"
        if _sha256(p) != digest:
            return f"{rel} does not match its recorded SHA-256"
    return None


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in _files(folder)) if folder.is_dir() else 0


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def _state(model: Any, optimizer: Any) -> dict[str, Any]:
    from flax import nnx

    return {
        "model": nnx.to_pure_dict(nnx.state(model, nnx.Param)),
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
    """The run's checkpoint folder, brought up to date from the run store on open."""

    def __init__(self, run: LocalRunDir, topo: Topology, keep: int,
                 warn: Callable[[str], None] | None = None) -> None:
        import orbax.checkpoint as ocp

        self.run = run
        self.topo = topo
        # Orbax >= 0.12.8 refuses relative paths (a relative staging root, say)
        folder = os.path.abspath(run.path_for(CHECKPOINTS))
        self.folder = folder
        if topo.is_writer:
            remove_partial(folder)  # left by a run killed while saving
        # the newest checkpoint that verifies (run store sync, gs://: fetched into
        # staging first); every process restores the step process 0 chose
        latest = agree(self._newest_intact(warn or (lambda message: None)), topo)
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
                primary_host=me, active_processes={me})
        self.latest_size = _size(Path(folder) / str(latest)) if latest else 0
        self.manager = ocp.CheckpointManager(
            folder,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep, create=not topo.multi_process,
                enable_async_checkpointing=False, **extra
            ),
        )

    def _newest_intact(self, warn: Callable[[str], None]) -> int:
        steps = sorted(self.run.checkpoint_steps(), reverse=True)
        for i, step in enumerate(steps):
            self.run.fetch_checkpoint(step)
            why = verify(Path(self.folder) / str(step))
            if why is None:
                return step
            later = steps[i + 1] if i + 1 < len(steps) else None
            warn(f"checkpoint {step} is damaged ({why}); "
                 + (f"trying checkpoint {later}" if later else "no earlier checkpoint"))
        if steps:
            raise ConflictError(
                f"no intact checkpoint in {self.folder} (damaged: "
                f"{', '.join(map(str, steps))})",
                hint="delete the damaged step folders to start the run over from step 0",
            )
        return 0

    def _check_space(self, step: int) -> None:
        """Fail before a save that cannot fit, not inside Orbax (which leaves a
        partial folder filling the disk and a wall of errors)."""
        last = self.latest_size or 0
        if not last:
            return
        free = shutil.disk_usage(self.folder).free
        if free < last * HEADROOM:
            good = self.manager.latest_step()
            raise DiskFullError(
                f"not enough disk space for checkpoint {step}: needs about "
                f"{_gib(last * HEADROOM)}, {_gib(free)} free in {self.folder}; "
                f"the last good checkpoint is {good}",
                hint=f"free some space (or lower checkpoint.keep), then 'rlctl resume "
                f"{self.run.name}'")

    def save(self, step: int, model: Any, optimizer: Any) -> None:
        import orbax.checkpoint as ocp

        state = _state(model, optimizer)
        if self.topo.multi_process:
            state = to_host(state, self.topo)  # a collective: every process takes part
        if not self.topo.is_writer:
            return
        self._check_space(step)
        self.manager.save(step, args=ocp.args.StandardSave(state))
        self.manager.wait_until_finished()
        self.latest_size = write_manifest(Path(self.folder) / str(step))
        self.run.publish_checkpoint(step)  # run store sync (gs://): upload, then marker

    def restore_latest(self, model: Any, optimizer: Any) -> int:
        """Load the latest checkpoint into ``model`` and ``optimizer`` in place; its
        step, or 0 (and nothing loaded) when the run has none."""
        import jax
        import orbax.checkpoint as ocp
        from flax import nnx

        step = self.latest
        if step is None:
            return 0
        state = _state(model, optimizer)
        if self.topo.multi_process:  # whole arrays from disk, then sharded over the mesh
            target = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), state)
            restored = self.manager.restore(step, args=ocp.args.StandardRestore(target))
            restored = place_like(restored, state)
        else:
            abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
            restored = self.manager.restore(step, args=ocp.args.StandardRestore(abstract))
        model_state = nnx.state(model, nnx.Param)
        nnx.replace_by_pure_dict(model_state, restored["model"])
        nnx.update(model, model_state)
        opt_state = nnx.state(optimizer)
        nnx.replace_by_pure_dict(opt_state, restored["optimizer"])
        nnx.update(optimizer, opt_state)
        return int(step)

    def close(self) -> None:
        """Wait for nothing more (saves are synchronous) and drop any save an
        interrupt cut short."""
        self.manager.close()
        if self.topo.is_writer:
            remove_partial(self.folder)
