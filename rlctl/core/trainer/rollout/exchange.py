"""Weights and trajectories between a learner and a generator process, through the run store.

``rollout.placement=process`` (docs/async.md): the generator is a process of its own,
the fallback transport the issue names when no device or collective joins the two.
The learner decides everything, as in one process (``run/pipeline.py``): it writes
each policy version's weights, then asks for step ``j`` from version ``v`` with a
request file; the generator serves requests in order and writes each trajectory
beside it. Nothing is read before it is complete: every file is written under a
temporary name and renamed into place (``atomic``), weights before the request that
names them.

Layout under the run's ``pipeline/`` folder::

    plan.json                       the attempt's id: a generator of another attempt stops
    weights/<v>.safetensors         the policy's state after v updates (flat nnx paths)
    requests/<j>-<a>.json           {step, version, attempt}: sample step j from version v
    trajectories/<j>-<a>.safetensors  what the generator sampled and scored for it (its
                                    JSON figures in the file's metadata)
    trajectories/<j>-<a>.error.json a reward's error (a ConfigError), said by the learner

A local run store only, for now: a ``gs://`` one would go through ``RunDir.push`` and
``pull`` file by file (docs/async.md).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlctl.core.store.base import RunDir

PIPELINE = "pipeline"


@dataclass(frozen=True)
class Trajectory:
    """One step as the generator sends it: its arrays (the samples and their scores)
    and its JSON figures (each reward's mean, the engine's checks)."""

    arrays: dict[str, np.ndarray]
    meta: dict[str, Any]


def _atomic(path: Path, write: Any) -> None:
    """``write(tmp)`` then rename ``tmp`` to ``path``: a reader sees all of it or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write(tmp)
    os.replace(tmp, path)


class Exchange:
    """The ``pipeline/`` folder of one run, as either side reads and writes it."""

    def __init__(self, run: RunDir) -> None:
        self.run = run
        self.root = Path(run.staging_dir()) / PIPELINE

    # --- the learner's side ------------------------------------------------------------
    def begin(self, attempt: str) -> None:
        """A new attempt: what an earlier one left (a killed run's) is dropped."""
        import shutil

        shutil.rmtree(self.root, ignore_errors=True)
        _atomic(self.root / "plan.json", lambda p: p.write_text(json.dumps({"id": attempt})))

    def put_weights(self, version: int, flat: dict[str, np.ndarray]) -> int:
        """Version ``version``'s state, complete when this returns; its bytes."""
        from safetensors.numpy import save_file

        _atomic(self.root / "weights" / f"{version}.safetensors", lambda p: save_file(flat, p))
        return sum(a.nbytes for a in flat.values())

    def drop_weights(self, below: int) -> None:
        """Versions no step will be sampled from any more."""
        folder = self.root / "weights"
        for f in folder.glob("*.safetensors") if folder.is_dir() else []:
            if int(f.stem) < below:
                f.unlink(missing_ok=True)

    def request(self, step: int, version: int, attempt: int) -> None:
        _atomic(
            self.root / "requests" / f"{step}-{attempt}.json",
            lambda p: p.write_text(
                json.dumps({"step": step, "version": version, "attempt": attempt})
            ),
        )

    def result(self, step: int, attempt: int) -> tuple[Trajectory | None, dict | None]:
        """(the trajectory, None), (None, the error it said), or (None, None) yet."""
        from safetensors import safe_open

        base = self.root / "trajectories" / f"{step}-{attempt}"
        error = base.with_name(base.name + ".error.json")
        if error.is_file():
            return None, json.loads(error.read_text())
        path = base.with_name(base.name + ".safetensors")
        if not path.is_file():
            return None, None
        with safe_open(str(path), framework="numpy") as f:
            arrays = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - not a dict
            meta = {k: json.loads(v) for k, v in (f.metadata() or {}).items()}
        path.unlink(missing_ok=True)  # taken: the learner keeps it in memory
        return Trajectory(arrays, meta), None

    def stop(self) -> None:
        _atomic(self.root / "stop", lambda p: p.write_text(""))

    # --- the generator's side ----------------------------------------------------------
    def attempt(self) -> str | None:
        plan = self.root / "plan.json"
        return json.loads(plan.read_text())["id"] if plan.is_file() else None

    def stopped(self) -> bool:
        return (self.root / "stop").is_file()

    def pending(self) -> list[dict[str, int]]:
        """Requests not answered yet, by step."""
        folder = self.root / "requests"
        out = []
        for f in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            r = json.loads(f.read_text())
            done = self.root / "trajectories" / f"{r['step']}-{r['attempt']}"
            if (
                not done.with_name(done.name + ".npz").exists()
                and not done.with_name(done.name + ".error.json").exists()
            ):
                out.append(r)
        return sorted(out, key=lambda r: (r["step"], r["attempt"]))

    def weights(self, version: int) -> dict[str, np.ndarray] | None:
        from safetensors.numpy import load_file

        f = self.root / "weights" / f"{version}.safetensors"
        return load_file(f) if f.is_file() else None

    def answer(self, request: dict[str, int], trajectory: Trajectory) -> None:
        from safetensors.numpy import save_file

        name = f"{request['step']}-{request['attempt']}.safetensors"
        meta = {k: json.dumps(v) for k, v in trajectory.meta.items()}
        _atomic(
            self.root / "trajectories" / name,
            lambda p: save_file(trajectory.arrays, str(p), metadata=meta),
        )
        (self.root / "requests" / f"{request['step']}-{request['attempt']}.json").unlink(
            missing_ok=True
        )

    def refuse(self, request: dict[str, int], message: str, hint: str | None) -> None:
        name = f"{request['step']}-{request['attempt']}.error.json"
        _atomic(
            self.root / "trajectories" / name,
            lambda p: p.write_text(json.dumps({"message": message, "hint": hint})),
        )


def flat_state(state: Any) -> dict[str, np.ndarray]:
    """An nnx state's arrays as {'a/b/c': host array}: what ``put_weights`` writes (RNG
    keys and other non-numeric leaves stay as the generator built them)."""
    import jax
    from flax import nnx

    out = {}
    for path, v in nnx.to_flat_state(state):
        value = v.get_value()
        if _numeric(value):
            out["/".join(str(k) for k in path)] = np.asarray(jax.device_get(value))
    return out


def load_flat(model: Any, flat: dict[str, np.ndarray]) -> None:
    """``flat`` (``flat_state``'s) into ``model``'s state, each array where it was."""
    import jax
    from flax import nnx

    pairs = []
    for path, v in nnx.to_flat_state(nnx.state(model)):
        key = "/".join(str(k) for k in path)
        if key not in flat:
            pairs.append((path, v))
            continue
        sharding = getattr(v.get_value(), "sharding", None)
        new = flat[key]
        pairs.append((path, v.replace(jax.device_put(new, sharding) if sharding else new)))
    nnx.update(model, nnx.from_flat_state(pairs))


def _numeric(value: Any) -> bool:
    import jax

    dtype = getattr(value, "dtype", None)
    return dtype is not None and not jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)
