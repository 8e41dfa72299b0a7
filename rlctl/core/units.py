"""Byte counts as people read and write them."""

from __future__ import annotations

import re

_SCALE = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def human_bytes(n: float) -> str:
    """Bytes for people: 1.43 GiB, 12.5 MiB, 640 KiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:.{2 if unit == 'GiB' else 1}f} {unit}"
    return f"{n / 1024:.0f} KiB"


def parse_bytes(text: str) -> int:
    """``"8GB"``, ``"512 MiB"``, ``"1.5g"`` or a plain count -> bytes (binary units).

    Raises ValueError on anything else.
    """
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not m:
        raise ValueError(f"not a size: {text!r} (write e.g. 8GB or 512MiB)")
    return int(float(m.group(1)) * _SCALE[m.group(2)])
