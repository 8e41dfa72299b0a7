"""The GKE clusters rlctl has seen, remembered on this machine for shell completion.

Completing ``--cluster <TAB>`` must answer in milliseconds and offline, so it cannot
ask the GKE API. Instead ``cluster create``/``list``/``describe`` remember the names
they saw, per project, and ``cluster delete`` forgets one, in
``<config_dir>/clusters.json`` (``~/.config/rlctl/clusters.json``), shaped
``{"PROJECT": ["NAME", ...]}``. It is a hint, not a record: a file that cannot be
read or written is ignored, never an error, and two commands writing at once may
lose a name (the next ``cluster list`` brings it back).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from rlctl.core.paths import config_dir

FILE = "clusters.json"


def _path() -> Path:
    return config_dir() / FILE


def _read() -> dict[str, list[str]]:
    try:
        data = json.loads(_path().read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        p: [n for n in names if isinstance(n, str)]
        for p, names in data.items()
        if isinstance(p, str) and isinstance(names, list)
    }


def _write(data: dict[str, list[str]]) -> None:
    """Whole or not at all (temp file + rename); any OSError is swallowed."""
    path = _path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{FILE}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
    except OSError:
        pass


def remember(project: str, names: Iterable[str], whole: bool = False) -> None:
    """Add ``names`` to ``project``'s; ``whole``: they are all of the project's
    clusters now (a listing of every location), so the others are dropped."""
    data = _read()
    mine = set() if whole else set(data.get(project, []))
    mine |= set(names)
    if sorted(mine) != data.get(project):
        data[project] = sorted(mine)
        _write(data)


def forget(project: str, name: str) -> None:
    data = _read()
    if name in data.get(project, []):
        data[project] = [n for n in data[project] if n != name]
        _write(data)


def known_clusters() -> list[str]:
    """Every remembered cluster name, of every project, sorted and once each."""
    return sorted({n for names in _read().values() for n in names})
