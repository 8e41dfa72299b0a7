"""Local paths: checks on those a user hands rlctl to write into, the default run store,
and rlctl's cache."""

from __future__ import annotations

import os
from pathlib import Path

# The run store when none is named (--runs-dir, $RLCTL_RUNS_DIR, output.root): one
# place, read by the spec's default, the run commands and shell completion.
RUNS_ROOT = "./runs"

# kernel interfaces, not storage: writing a run or a cache there fails in odd ways
_PSEUDO = (Path("/proc"), Path("/sys"), Path("/dev"))


def kernel_fs(path: Path) -> str | None:
    """``/proc`` (or /sys, /dev) when ``path`` lies under one, else None."""
    p = Path(path).absolute()
    for root in _PSEUDO:
        if p.is_relative_to(root):
            return str(root)
    return None


def cache_dir(cache_root: str | os.PathLike[str] | None = None) -> Path:
    """rlctl's cache root: the argument, else ``$RLCTL_CACHE``, else ``~/.cache/rlctl``."""
    if cache_root is not None:
        return Path(cache_root).expanduser()
    env = os.environ.get("RLCTL_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "rlctl"


def config_dir() -> Path:
    """rlctl's per-user settings folder: ``$XDG_CONFIG_HOME/rlctl``, else
    ``~/.config/rlctl`` (what rlctl keeps between commands, unlike the cache, which
    is only ever rebuilt)."""
    env = os.environ.get("XDG_CONFIG_HOME")
    base = Path(env).expanduser() if env and Path(env).is_absolute() else Path.home() / ".config"
    return base / "rlctl"
