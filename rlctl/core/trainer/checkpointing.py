"""Orbax checkpoints of a run: the model's parameters and the optimizer's state.

Those two are all a step depends on besides (seed, step), so a run resumed from
its latest complete checkpoint continues exactly as if it had never stopped. In a
multi-host run every process restores the step process 0 chose, and process 0
alone writes, from arrays gathered whole.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from rlctl.core.store.base import CHECKPOINTS, latest_checkpoint_step
from rlctl.core.store.local import LocalRunDir
from rlctl.core.trainer.distributed import Topology, agree, place_like, to_host


def _state(model: Any, optimizer: Any) -> dict[str, Any]:
    from flax import nnx

    return {
        "model": nnx.to_pure_dict(nnx.state(model, nnx.Param)),
        "optimizer": nnx.to_pure_dict(nnx.state(optimizer)),
    }


class Checkpoints:
    """The run's checkpoint folder, brought up to date from the run store on open."""

    def __init__(self, run: LocalRunDir, topo: Topology, keep: int) -> None:
        import orbax.checkpoint as ocp

        self.run = run
        self.topo = topo
        # run store sync (gs://): bring the latest committed checkpoint into staging;
        # every process restores the step process 0 chose
        latest = agree(latest_checkpoint_step(run) or 0, topo)
        self.latest: int | None = latest or None
        if latest:
            run.fetch_checkpoint(latest)
        # Orbax >= 0.12.8 refuses relative paths (a relative staging root, say)
        folder = os.path.abspath(run.path_for(CHECKPOINTS))
        extra = {}
        if topo.multi_process:
            # gathered, unsharded arrays: each process reads and writes them on its own
            # (Orbax leaves creating the folder to us in that mode)
            Path(folder).mkdir(parents=True, exist_ok=True)
            me = topo.process_index
            extra["multiprocessing_options"] = ocp.options.MultiprocessingOptions(
                primary_host=me, active_processes={me})
        self.manager = ocp.CheckpointManager(
            folder,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep, create=not topo.multi_process,
                enable_async_checkpointing=False, **extra
            ),
        )

    def save(self, step: int, model: Any, optimizer: Any) -> None:
        import orbax.checkpoint as ocp

        state = _state(model, optimizer)
        if self.topo.multi_process:
            state = to_host(state, self.topo)  # a collective: every process takes part
        if not self.topo.is_writer:
            return
        self.manager.save(step, args=ocp.args.StandardSave(state))
        self.manager.wait_until_finished()
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
        self.manager.close()
