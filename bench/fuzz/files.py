"""Files of a case's folder and of a run store: write them, fingerprint them (``snap``,
``diff``), read a run's status and metrics back, and say what is wrong with a run a
command reported as completed."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

ACTIVE = {"pending", "starting", "evaluating", "running"}  # phases of a live process


def write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    path.write_bytes(data)
    return path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snap(path: Path, exclude: tuple[str, ...] = (".lock",)) -> dict[str, str]:
    """relative path -> sha256 of every file under ``path`` (a file: itself)."""
    if path.is_file():
        return {".": sha(path)}
    out: dict[str, str] = {}
    if not path.is_dir():
        return out
    for p in sorted(path.rglob("*")):
        if p.is_file() and not p.is_symlink() and p.name not in exclude:
            out[str(p.relative_to(path))] = sha(p)
    return out


def diff(before: dict[str, str], after: dict[str, str]) -> str:
    gone = sorted(set(before) - set(after))
    new = sorted(set(after) - set(before))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    parts = []
    for what, items in (("removed", gone), ("added", new), ("changed", changed)):
        if items:
            parts.append(f"{what} {', '.join(items[:4])}{' ...' if len(items) > 4 else ''}")
    return "; ".join(parts)


def truncate_largest(folder: Path) -> Path:
    files = [p for p in folder.rglob("*") if p.is_file() and p.name != "rlctl-manifest.json"]
    big = max(files, key=lambda p: p.stat().st_size)
    with big.open("r+b") as f:
        f.truncate(big.stat().st_size // 2)
    return big


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def metrics_steps(run_dir: Path) -> tuple[list[Any], int]:
    """(steps of the metrics rows in file order, lines that do not parse)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return [], 0
    steps, bad = [], 0
    for line in path.read_bytes().decode(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(row, dict):
            steps.append(row.get("step"))
        else:
            bad += 1
    return steps, bad


def check_completed(run_dir: Path, n: int, eval_on: bool = True) -> list[str]:
    """What is wrong with a run that a command reported as completed."""
    bad = []
    st = read_json(run_dir / "status.json")
    if not isinstance(st, dict):
        bad.append("status.json unreadable after a successful run")
    elif (st.get("phase"), st.get("step")) != ("completed", n):
        bad.append(
            f"status.json says phase={st.get('phase')!r} step={st.get('step')!r}, "
            f"expected completed/{n}"
        )
    steps, torn = metrics_steps(run_dir)
    if steps != list(range(1, n + 1)):
        bad.append(f"metrics steps {steps}, expected 1..{n} once each in order")
    if torn:
        bad.append(f"{torn} unparseable line(s) left in metrics.jsonl")
    ck = run_dir / "checkpoints"
    names = sorted(os.listdir(ck)) if ck.is_dir() else []
    if str(n) not in names:
        bad.append(f"no checkpoint {n} (checkpoints/: {names})")
    tmp = [x for x in names if "orbax-checkpoint-tmp" in x]
    if tmp:
        bad.append(f"partial checkpoint folders left: {tmp}")
    if eval_on:
        for which in ("baseline", "final"):
            if not isinstance(read_json(run_dir / "eval" / f"{which}.json"), dict):
                bad.append(f"eval/{which}.json missing or damaged after the run")
    return bad


def dead_pid() -> int:
    pid = 4_000_000
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 7


def read_json_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None
