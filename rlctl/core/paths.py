"""Checks on local paths a user hands rlctl to write into."""

from __future__ import annotations

from pathlib import Path

# kernel interfaces, not storage: writing a run or a cache there fails in odd ways
_PSEUDO = (Path("/proc"), Path("/sys"), Path("/dev"))


def kernel_fs(path: Path) -> str | None:
    """``/proc`` (or /sys, /dev) when ``path`` lies under one, else None."""
    p = Path(path).absolute()
    for root in _PSEUDO:
        if p.is_relative_to(root):
            return str(root)
    return None
