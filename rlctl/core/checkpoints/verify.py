"""``--verify``: DST read back, tensor by tensor, against SRC.

Both sides are read through the same Hugging Face view (sources.py): a trainer
output is mapped back to HF names and layout before it is compared, so a wrong
reshape fails here even when every byte was written as planned. Per tensor: name,
shape, dtype, and a SHA-256 of its bytes (SRC's cast to the output dtype first).
At equal dtype a conversion moves bits only, so any difference is an error.
"""

from __future__ import annotations

import hashlib

import numpy as np

from rlctl.core.checkpoints.hf import byte_view, np_dtype
from rlctl.core.checkpoints.sources import Source
from rlctl.core.errors import ConfigError


class VerifyError(ConfigError):
    """DST does not hold what SRC holds (exit 2, like any bad input)."""


def digest(arr: np.ndarray) -> str:
    return hashlib.sha256(byte_view(arr)).hexdigest()


def verify_against(src: Source, dst: Source, dtype: str | None = None) -> int:
    """Raise VerifyError at the first difference; the number of tensors compared."""
    a, b = src.names(), dst.names()
    if a != b:
        only = sorted(set(a) ^ set(b))
        raise VerifyError(
            f"verify: {len(a)} tensors in SRC, {len(b)} in DST "
            f"(differ: {', '.join(only[:3]) or 'order'})"
        )
    for name in a:
        x = src.read(name)
        if dtype is not None and x.dtype.kind in "fV" and x.dtype != np_dtype(dtype):
            x = x.astype(np_dtype(dtype))
        y = dst.read(name)
        if x.shape != y.shape:
            raise VerifyError(
                f"verify: {name}: shape {list(y.shape)} in DST, {list(x.shape)} in SRC"
            )
        if x.dtype != y.dtype:
            raise VerifyError(f"verify: {name}: dtype {y.dtype} in DST, {x.dtype} in SRC")
        if digest(x) != digest(y):
            raise VerifyError(f"verify: {name}: its bytes differ from SRC's (SHA-256)")
        del x, y
    return len(a)
