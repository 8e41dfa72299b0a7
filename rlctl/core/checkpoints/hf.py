"""Hugging Face safetensors, read and written one tensor at a time.

A safetensors file is an 8-byte header length, a JSON header (each tensor's dtype,
shape and byte range), then the raw bytes. So a tensor is read with one ranged read
of exactly its bytes, and a shard is written as its header (known in advance from
the shapes) followed by each tensor as it is produced: the whole shard never sits
in memory, and neither does the model.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlctl.core.checkpoints.places import Output, Place
from rlctl.core.errors import ConfigError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
BAND_BYTES = 4 << 20  # rows read at once when a tensor is transposed as it is read
SHARD_BYTES = 2 << 30  # per output shard (HF's own default is 5 GB; 2 GB uploads resume sooner)
_MAX_HEADER = 100 << 20
_REFETCH = "copy or download the model again"
# files of a model folder besides its weights, copied as they are
SIDECARS = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
)

_TO_NP = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}
_FROM_NP = {v: k for k, v in _TO_NP.items()}


def byte_view(arr: np.ndarray) -> memoryview:
    """The bytes of ``arr`` as a writable view, without a copy when it is contiguous
    (what safetensors files are read into and written from). Any: numpy's stubs type
    ndarray as a Buffer on Python >= 3.12 only."""
    flat: Any = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    return memoryview(flat)


def np_dtype(name: str) -> np.dtype:
    """A numpy dtype by name; bfloat16 comes from ml_dtypes (installed with jax)."""
    if name == "bfloat16":
        from rlctl.core.errors import require_extra

        require_extra("ml_dtypes", "train")
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str  # numpy name: float32, bfloat16, ...
    file: str
    start: int  # absolute byte offset in ``file``
    nbytes: int


class SafetensorsReader:
    """The tensors of an HF folder (sharded with an index, or loose files) or of one
    ``.safetensors`` file; only headers are read until a tensor is asked for."""

    def __init__(self, place: Place, files: list[str] | None = None) -> None:
        self.place = place
        if files is None:
            files = self._files()
        self.tensors: dict[str, TensorInfo] = {}
        for f in files:
            self.tensors.update(self._header(f))

    def _files(self) -> list[str]:
        if self.place.exists(INDEX):
            try:
                index = json.loads(self.place.read_bytes(INDEX))
                files = sorted(set(index["weight_map"].values()))
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise ConfigError(
                    f"{self.place.uri}/{INDEX}: not a safetensors index ({e})", hint=_REFETCH
                ) from e
            missing = [f for f in files if not self.place.exists(f)]
            if missing:
                raise ConfigError(
                    f"{self.place.uri}: shard {missing[0]} named by {INDEX} is "
                    f"missing" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""),
                    hint=_REFETCH,
                )
            return files
        files = [f for f in self.place.list() if f.endswith(".safetensors") and "/" not in f]
        if not files:
            raise ConfigError(f"{self.place.uri}: no .safetensors files")
        return files

    def _header(self, f: str) -> dict[str, TensorInfo]:
        where = f"{self.place.uri}/{f}"
        size = self.place.size(f)
        head = bytearray(8)
        if size < 8:
            raise ConfigError(f"{where}: not a safetensors file (too short)", hint=_REFETCH)
        self.place.read_into(f, 0, memoryview(head))
        n = struct.unpack("<Q", head)[0]
        if n < 2 or n > min(size - 8, _MAX_HEADER):
            raise ConfigError(f"{where}: not a safetensors file (bad header length)", hint=_REFETCH)
        raw = bytearray(n)
        self.place.read_into(f, 8, memoryview(raw))
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise ConfigError(f"{where}: not a safetensors file (bad header)", hint=_REFETCH) from e
        out = {}
        for name, t in header.items():
            if name == "__metadata__":
                continue
            try:
                a, b = t["data_offsets"]
                dtype = _TO_NP[t["dtype"]]
                shape = tuple(int(x) for x in t["shape"])
            except (KeyError, TypeError, ValueError) as e:
                raise ConfigError(
                    f"{where}: tensor {name!r}: unreadable entry ({e})", hint=_REFETCH
                ) from e
            if 8 + n + b > size:
                raise ConfigError(
                    f"{where}: truncated (tensor {name!r} ends past the end)", hint=_REFETCH
                )
            out[name] = TensorInfo(name, shape, dtype, f, 8 + n + a, b - a)
        return out

    def bands(self, name: str):
        """(first row, rows) of a 2-D tensor, read a few MB at a time into one buffer."""
        band_bytes = BAND_BYTES
        info = self.tensors[name]
        rows, cols = info.shape
        dtype = np_dtype(info.dtype)
        row_bytes = cols * dtype.itemsize
        if rows * row_bytes != info.nbytes:
            raise ConfigError(
                f"{self.place.uri}/{info.file}: tensor {name!r} has "
                f"{info.nbytes} bytes, its shape needs {rows * row_bytes}",
                hint=_REFETCH,
            )
        step = max(1, band_bytes // max(1, row_bytes))
        buf = np.empty((min(step, rows), cols), dtype)
        for r0 in range(0, rows, step):
            band = buf[: min(step, rows - r0)]
            view = byte_view(band)  # the band's own memory: read_into fills it
            self.place.read_into(info.file, info.start + r0 * row_bytes, view)
            yield r0, band

    def read(self, name: str) -> np.ndarray:
        info = self.tensors[name]
        arr = np.empty(info.shape, np_dtype(info.dtype))
        if info.nbytes != arr.nbytes:
            raise ConfigError(
                f"{self.place.uri}/{info.file}: tensor {name!r} has "
                f"{info.nbytes} bytes, its shape needs {arr.nbytes}",
                hint=_REFETCH,
            )
        if arr.nbytes:
            view = byte_view(arr)
            self.place.read_into(info.file, info.start, view)
        return arr


@dataclass(frozen=True)
class Planned:
    """An output tensor: its name, shape and dtype, known before any data is read."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np_dtype(self.dtype).itemsize


def plan_shards(tensors: list[Planned], limit: int = SHARD_BYTES) -> list[list[Planned]]:
    """Tensors in order, cut into shards of at most ``limit`` bytes (a larger tensor
    gets a shard of its own)."""
    shards: list[list[Planned]] = [[]]
    size = 0
    for t in tensors:
        if shards[-1] and size + t.nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.nbytes
    return shards


def shard_names(n: int) -> list[str]:
    return (
        [SINGLE] if n == 1 else [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    )


def shard_header(shard: list[Planned]) -> bytes:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t in shard:
        header[t.name] = {
            "dtype": _FROM_NP[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + t.nbytes],
        }
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned, as safetensors writes it
    return struct.pack("<Q", len(raw)) + raw


def write_index(out: Output, shards: list[list[Planned]], names: list[str]) -> None:
    if len(shards) == 1:
        return
    weight_map = {t.name: f for shard, f in zip(shards, names) for t in shard}
    total = sum(t.nbytes for shard in shards for t in shard)
    out.write_bytes(
        INDEX,
        (
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
            + "\n"
        ).encode(),
    )
