"""The trainer's Orbax checkpoints, read and written one array at a time.

A run's checkpoint step folder (``checkpoints/<step>/``, see
``rlctl/core/trainer/checkpoint/checkpointing.py``) holds ``{"model": ..., "optimizer": ...}``
as Orbax's ``StandardSave`` writes it: ``default/_METADATA`` (the tree) and one
TensorStore zarr array per leaf, keyed by its dotted path (``model.layers.0.attn.
q_proj.w``), in an OCDBT database under ``default/``. TensorStore opens any one
of those arrays alone, so reading never restores the whole tree.

Writing builds the same layout array by array with TensorStore (``write_tree``
below), plus the two metadata files Orbax reads; ``orbax.checkpoint`` restores it
like any of its own (tested), which is how ``train`` starts from a converted model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from rlctl.core.errors import ConfigError, require_extra

CHECKPOINT = "checkpoint"  # the Orbax step folder inside a trainer folder
ITEM = "default"  # Orbax's item name for a StandardSave
META = "_METADATA"
CKPT_META = "_CHECKPOINT_METADATA"
_HANDLER = "orbax.checkpoint._src.handlers.standard_checkpoint_handler.StandardCheckpointHandler"
_CHUNK_BYTES = 64 << 20  # zarr chunk (along the first axis): bounds what one write holds


def is_step_folder(path: Path) -> bool:
    return (path / ITEM / META).is_file()


def _spec(step: Path, key: str, meta: dict[str, Any]) -> dict[str, Any]:
    base = f"file://{(step / ITEM).absolute()}/"
    driver = "zarr3" if meta.get("use_zarr3") else "zarr"
    if meta.get("use_ocdbt", True):
        return {"driver": driver, "kvstore": {"driver": "ocdbt", "base": base}, "path": key}
    return {"driver": driver, "kvstore": f"{base}{key}/"}


class OrbaxReader:
    """The arrays under ``prefix`` (``model.``) of an Orbax step folder."""

    def __init__(self, step: Path, prefix: str = "model.") -> None:
        require_extra("tensorstore", "train")
        self.step = step
        try:
            self.meta = json.loads((step / ITEM / META).read_text())
            tree = self.meta["tree_metadata"]
            keys = [".".join(str(k["key"]) for k in v["key_metadata"]) for v in tree.values()]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError(
                f"{step}: not a readable Orbax checkpoint ({type(e).__name__})",
                hint="pick another step with --step",
            ) from e
        self.keys = sorted(k[len(prefix) :] for k in keys if k.startswith(prefix))
        self.prefix = prefix
        if not self.keys:
            raise ConfigError(f"{step}: the Orbax checkpoint holds no model weights")
        self._open: dict[str, Any] = {}

    def _array(self, key: str) -> Any:
        import tensorstore as ts

        if key not in self._open:
            try:
                self._open[key] = ts.open(
                    _spec(self.step, self.prefix + key, self.meta), open=True, read=True
                ).result()
            except Exception as e:  # tensorstore's errors are ValueError with a status
                raise ConfigError(
                    f"{self.step}: array {key!r} cannot be opened ({str(e).splitlines()[0][:160]})",
                    hint="the checkpoint is damaged; pick another --step",
                ) from e
        return self._open[key]

    def shape_dtype(self, key: str) -> tuple[tuple[int, ...], str]:
        a = self._array(key)
        return tuple(int(x) for x in a.shape), str(np.dtype(a.dtype.numpy_dtype))

    def read(self, key: str) -> np.ndarray:
        try:
            out = self._array(key).read().result()
        except ValueError as e:  # a cut or garbled chunk: TensorStore's status as text
            raise unreadable(self.step, key, e) from e
        finally:
            self._open.pop(key, None)  # drop tensorstore's handle (and its cache)
        return np.asarray(out)


def unreadable(step: Path, key: str, e: BaseException) -> ConfigError:
    """A read that failed inside a checkpoint (a file cut short or garbled, without a
    manifest to have said so): one line naming the array, not "unexpected error"."""
    first = (str(e).splitlines() or [type(e).__name__])[0][:160]
    return ConfigError(
        f"{step}: array {key!r} cannot be read ({first})",
        hint="the checkpoint is damaged; pick another --step",
    )


def _zarr_dtype(dtype: np.dtype) -> str:
    return "bfloat16" if dtype.name == "bfloat16" else dtype.str


class OrbaxWriter:
    """Writes arrays into an Orbax step folder one at a time; ``finish`` writes the
    metadata that makes it a checkpoint Orbax restores."""

    def __init__(self, step: Path, prefix: str = "model.") -> None:
        require_extra("tensorstore", "train")
        self.step = step
        self.prefix = prefix
        (step / ITEM).mkdir(parents=True, exist_ok=True)
        self._kv = {"driver": "ocdbt", "base": f"file://{(step / ITEM).absolute()}/"}

    def write(self, key: str, arr: np.ndarray) -> None:
        import tensorstore as ts

        rows = max(1, _CHUNK_BYTES // max(1, arr.nbytes // max(1, arr.shape[0] if arr.ndim else 1)))
        chunks = list(arr.shape)
        if arr.ndim:
            chunks[0] = min(arr.shape[0], rows)
        spec: dict[str, Any] = {
            "driver": "zarr",
            "kvstore": self._kv,
            "path": self.prefix + key,
            "metadata": {
                "shape": list(arr.shape),
                "chunks": chunks or [1],
                "dtype": _zarr_dtype(arr.dtype),
                "compressor": None,
            },
        }
        if not arr.ndim:
            spec["metadata"].update(shape=[], chunks=[])
        t = ts.open(spec, create=True, delete_existing=True).result()
        if not arr.ndim:
            t.write(arr).result()
            return
        for a in range(0, arr.shape[0], chunks[0]):  # a chunk at a time: TensorStore
            b = min(a + chunks[0], arr.shape[0])  # copies what it writes, so this
            t[a:b].write(arr[a:b]).result()  # bounds its copy to one chunk

    def finish(self, keys: list[str]) -> None:
        tree = {}
        for key in keys:
            parts = (self.prefix + key).split(".")
            tree[str(tuple(parts))] = {
                "key_metadata": [{"key": p, "key_type": 2} for p in parts],
                "value_metadata": {"value_type": "np.ndarray", "skip_deserialize": False},
            }
        meta = {
            "tree_metadata": tree,
            "use_ocdbt": True,
            "use_zarr3": False,
            "store_array_data_equal_to_fill_value": True,
            "custom_metadata": None,
        }
        (self.step / ITEM / META).write_text(json.dumps(meta))
        (self.step / CKPT_META).write_text(
            json.dumps(
                {
                    "item_handlers": {ITEM: _HANDLER},
                    "metrics": {},
                    "performance_metrics": {},
                    "init_timestamp_nsecs": 0,
                    "commit_timestamp_nsecs": 0,
                    "custom_metadata": {},
                }
            )
        )
