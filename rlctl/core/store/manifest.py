"""A checkpoint folder's integrity: rlctl's manifest of every file's size and SHA-256,
written when a save finished, and the check of a folder against it.

Here, below the trainer that writes checkpoints and the conversion that reads them,
so that both judge a checkpoint the same way: ``checkpoint-convert`` refuses a
damaged one with the reason, as ``resume`` sets it aside (#47: a cut file made the
conversion end in "unexpected error").
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from rlctl.core.store.base import MANIFEST, ORBAX_METADATA, atomic_write
from rlctl.core.store.records import manifest_text, read_manifest


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def checkpoint_files(folder: Path) -> list[Path]:
    """Every file of a checkpoint folder but its manifest."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(folder: Path) -> int:
    """Record every file's size and SHA-256 (written last, atomically): a checkpoint
    that later loses or changes a byte is then known to be damaged. Its total size."""
    files = {
        str(p.relative_to(folder)): (p.stat().st_size, _sha256(p)) for p in checkpoint_files(folder)
    }
    atomic_write(folder / MANIFEST, manifest_text(files))  # checked by its reader first
    return sum(size for size, _ in files.values())


def verify(folder: Path, hashes: bool = True) -> str | None:
    """None when the checkpoint in ``folder`` is intact, else what is wrong with it.
    One without a manifest (an older rlctl's, or killed just before writing it) is
    trusted as Orbax left it: Orbax renames a save into place only when complete.
    ``hashes=False``: every file's presence and size only, no byte read (``status``:
    a cut or lost file, as a killed copy or a full disk leaves one, without reading
    gigabytes per run)."""
    manifest = folder / MANIFEST
    if not manifest.exists():
        if not folder.is_dir() or not any(folder.iterdir()):
            return "its folder is empty"
        if not (folder / ORBAX_METADATA).is_file():
            return f"it has no {ORBAX_METADATA}"
        return None
    try:
        expected = read_manifest(manifest.read_text())
    except (ValueError, OSError):  # UnicodeDecodeError is a ValueError
        return f"its {MANIFEST} is damaged"
    for rel, (size, digest) in expected.items():
        p = folder / rel
        if not p.is_file():
            return f"{rel} is missing"
        if p.stat().st_size != size:
            return f"{rel} has {p.stat().st_size} bytes, not {size}"
        if hashes and _sha256(p) != digest:
            return f"{rel} does not match its recorded SHA-256"
    return None
