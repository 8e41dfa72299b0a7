"""Weights and trajectories between a learner and a generator process, through the run store.

``rollout.placement=process`` (docs/async.md): the generator is a process of its own
(on the learner's machine, or pods of their own on a cluster), the fallback transport
the issue names when no device or collective joins the two. The learner decides
everything, as in one process (``run/pipeline.py``): it writes each policy version's
weights, then asks for step ``j`` from version ``v`` with a request; the generator
serves requests in order and writes each trajectory beside it.

Everything goes through the run's own ``RunDir`` (``store/base.py``), so a local run
store and a ``gs://`` one take the same path: small JSON files by ``write_json``, the
arrays as safetensors files written in this process's staging folder and ``push``ed
(``pull``ed by the reader). Nothing is read before it is complete: a local file is
written under a temporary name and renamed into place, a GCS object appears whole
when its upload finishes; weights are written before the request that names them.

Layout under the run's ``pipeline/`` folder::

    plan.json                       the attempt's id: a generator of another attempt stops
    weights/<v>.safetensors         the policy's state after v updates (flat nnx paths)
    requests/<j>-<a>.json           {step, version, attempt}: sample step j from version v
    trajectories/<j>-<a>.safetensors  what the generator sampled and scored for it (its
                                    JSON figures in the file's metadata)
    trajectories/<j>-<a>.error.json a reward's error (a ConfigError), said by the learner
    stop                            {"attempt": id}: that attempt is over
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlctl.core.errors import NotFoundError
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


def remote(run: RunDir) -> bool:
    """Whether the run's files are objects in a bucket (each look is a request)."""
    return "://" in run.uri


class Exchange:
    """The ``pipeline/`` folder of one run, as either side reads and writes it."""

    def __init__(self, run: RunDir) -> None:
        self.run = run
        # this process's copy of the files it writes or reads (the run's own folder for
        # a local store, a staging folder of its own for gs://)
        self.root = Path(run.staging_dir()) / PIPELINE
        # seconds between looks: a file's stat is free, a bucket's listing is a request
        self.poll = 0.5 if remote(run) else 0.02

    # --- the files, whichever the store ---------------------------------------------
    def _put_arrays(self, rel: str, arrays: dict[str, np.ndarray], meta: dict | None) -> None:
        from safetensors.numpy import save_file

        _atomic(self.root / rel, lambda p: save_file(arrays, str(p), metadata=meta))
        self.run.push(f"{PIPELINE}/{rel}")  # an upload on gs:// (whole or not at all)

    def _get_arrays(self, rel: str) -> tuple[dict[str, np.ndarray], dict[str, str]] | None:
        from safetensors import safe_open

        local = self.root / rel
        if remote(self.run):
            local.unlink(missing_ok=True)  # only what the store holds now counts
            self.run.pull(f"{PIPELINE}/{rel}")  # nothing comes when there is no object
        if not local.is_file():
            return None
        with safe_open(str(local), framework="numpy") as f:
            arrays = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - not a dict
            meta = f.metadata() or {}
        return arrays, meta

    def _put_json(self, rel: str, data: Any) -> None:
        self.run.write_json(f"{PIPELINE}/{rel}", data)

    def _get_json(self, rel: str) -> Any:
        try:
            return self.run.read_json(f"{PIPELINE}/{rel}")
        except (NotFoundError, FileNotFoundError):
            return None

    def _list(self, folder: str) -> list[str]:
        """Complete files only: a local writer's temporary names start with a dot."""
        return [n for n in self.run.list(f"{PIPELINE}/{folder}") if not n.startswith(".")]

    def _forget(self, rel: str) -> None:
        """A gs:// store's staging copy of ``rel``, removed once uploaded or read: the
        store holds it (weights are half a GB a version). A local store's copy is the
        file itself, kept."""
        if remote(self.run):
            (self.root / rel).unlink(missing_ok=True)

    def _drop(self, rel: str) -> None:
        self.run.delete(f"{PIPELINE}/{rel}")
        (self.root / rel).unlink(missing_ok=True)

    # --- the learner's side ------------------------------------------------------------
    def begin(self, attempt: str) -> None:
        """A new attempt: what an earlier one left (a killed run's) is dropped."""
        self.clear()
        self._put_json("plan.json", {"id": attempt})

    def clear(self, keep: tuple[str, ...] = ()) -> None:
        """Everything exchanged, gone (nothing of it is needed again), but ``keep``'s
        files (the plan and the stop, for generator pods still to read them)."""
        if keep:
            for name in self.run.list(PIPELINE):
                if name not in keep:
                    self._drop_tree(name)
            return
        self.run.delete(PIPELINE)
        shutil.rmtree(self.root, ignore_errors=True)

    def _drop_tree(self, rel: str) -> None:
        self.run.delete(f"{PIPELINE}/{rel}")
        shutil.rmtree(self.root / rel, ignore_errors=True)
        (self.root / rel).unlink(missing_ok=True)

    def put_weights(self, version: int, flat: dict[str, np.ndarray]) -> int:
        """Version ``version``'s state, complete when this returns; its bytes."""
        self._put_arrays(f"weights/{version}.safetensors", flat, None)
        self._forget(f"weights/{version}.safetensors")
        return sum(a.nbytes for a in flat.values())

    def drop_weights(self, below: int) -> None:
        """Versions no step will be sampled from any more."""
        for name in self._list("weights"):
            stem = name.removesuffix(".safetensors")
            if stem.isdigit() and int(stem) < below:
                self._drop(f"weights/{name}")

    def request(self, step: int, version: int, attempt: int) -> None:
        self._put_json(
            f"requests/{step}-{attempt}.json",
            {"step": step, "version": version, "attempt": attempt},
        )

    def result(self, step: int, attempt: int) -> tuple[Trajectory | None, dict | None]:
        """(the trajectory, None), (None, the error it said), or (None, None) yet."""
        base = f"trajectories/{step}-{attempt}"
        error = self._get_json(f"{base}.error.json")
        if error is not None:
            return None, error
        got = self._get_arrays(f"{base}.safetensors")
        if got is None:
            return None, None
        arrays, meta = got
        self._drop(f"{base}.safetensors")  # taken: the learner keeps it in memory
        return Trajectory(arrays, {k: json.loads(v) for k, v in meta.items()}), None

    def stop(self, attempt: str | None = None) -> None:
        self._put_json("stop", {"attempt": attempt if attempt is not None else self.attempt()})

    # --- the generator's side ----------------------------------------------------------
    def attempt(self) -> str | None:
        plan = self._get_json("plan.json")
        return plan["id"] if plan else None

    def stopped(self) -> str | None:
        """The attempt the learner said is over, if it said so ('' for an unnamed one)."""
        said = self._get_json("stop")
        return None if said is None else str(said.get("attempt") or "")

    def pending(self) -> list[dict[str, int]]:
        """Requests not answered yet, by step."""
        answered = {n.split(".")[0] for n in self._list("trajectories")}
        out = []
        for name in self._list("requests"):
            if name.endswith(".json") and name.removesuffix(".json") not in answered:
                r = self._get_json(f"requests/{name}")
                if r is not None:  # answered and removed since the listing
                    out.append(r)
        return sorted(out, key=lambda r: (r["step"], r["attempt"]))

    def weights(self, version: int) -> dict[str, np.ndarray] | None:
        got = self._get_arrays(f"weights/{version}.safetensors")
        self._forget(f"weights/{version}.safetensors")
        return None if got is None else got[0]

    def answer(self, request: dict[str, int], trajectory: Trajectory) -> None:
        name = f"{request['step']}-{request['attempt']}"
        meta = {k: json.dumps(v) for k, v in trajectory.meta.items()}
        self._put_arrays(f"trajectories/{name}.safetensors", trajectory.arrays, meta)
        self._forget(f"trajectories/{name}.safetensors")
        self._drop(f"requests/{name}.json")

    def refuse(self, request: dict[str, int], message: str, hint: str | None) -> None:
        name = f"{request['step']}-{request['attempt']}"
        self._put_json(f"trajectories/{name}.error.json", {"message": message, "hint": hint})
        self._drop(f"requests/{name}.json")


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
