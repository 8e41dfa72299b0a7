"""Byte counts as people read and write them, and Kubernetes quantities."""

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


# Kubernetes resource quantities (k8s.io/apimachinery pkg/api/resource/quantity.go):
# decimal suffixes k..E, binary Ki..Ei, and m for thousandths (millicores).
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_QUANTITY_SCALE = {
    None: 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def quantity(v: object) -> float:
    """A Kubernetes quantity as a number (cores, bytes or a count); ValueError if not one."""
    m = _QUANTITY.fullmatch(str(v).strip())
    if not m:
        raise ValueError(f"{v!r} is not a Kubernetes quantity")
    return float(m.group(1)) * _QUANTITY_SCALE[m.group(2)]
