"""The run store: the two trained runs of fixture ``store`` (``good``: completed, 2
steps; ``dmg``: interrupted after step 2 of 3) copied into the case's ``{runs}``, the
damage done to them, and what a command may not change in them.

A setup fingerprints what its posts compare against in ``c.state``: ``good`` (run
good), ``store`` (every file of ``{runs}``), ``intact`` (the checkpoints a damage left
alone) and ``metrics`` (dmg's metrics.jsonl)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.fuzz.case import Judge, Setup
from bench.fuzz.files import (
    ACTIVE,
    check_completed,
    dead_pid,
    diff,
    read_json,
    read_json_text,
    snap,
    truncate_largest,
    write,
)
from bench.fuzz.fixtures import Ctx, ro_dir
from bench.fuzz.proc import Run
from bench.fuzz.registry import hook

# ------------------------------------------------------------------ the copies


@hook("setup")
def plain_store(c: Ctx) -> None:
    """The two runs copied into ``{runs}``, nothing fingerprinted."""
    shutil.copytree(c.fx.store, c.runs, symlinks=True)


@hook("setup")
def copy_store(c: Ctx) -> None:
    """The two runs copied into ``{runs}``; run good fingerprinted (``good_unchanged``)."""
    plain_store(c)
    c.state["good"] = snap(c.runs / "good")


@hook("setup")
def watched_store(c: Ctx) -> None:
    """``copy_store``, and every file of the store fingerprinted (``store_unchanged``)."""
    copy_store(c)
    c.state["store"] = snap(c.runs)


@hook("setup", factory=True)
def logs_store(drop_log: bool = False) -> Setup:
    """The two runs, fingerprinted; ``drop_log``: ``good`` as an older rlctl left it,
    with no train.log."""

    def setup(c: Ctx) -> None:
        plain_store(c)
        if drop_log:
            (c.runs / "good" / "train.log").unlink()
        c.state["store"] = snap(c.runs)

    return setup


@hook("setup", factory=True)
def store_as(runs: dict[str, str]) -> Setup:
    """The store's runs copied under other names (new name: good or dmg), in order."""

    def setup(c: Ctx) -> None:
        for name, source in runs.items():
            shutil.copytree(c.fx.store / source, c.runs / name, symlinks=True)

    return setup


@hook("setup")
def read_only_store(c: Ctx) -> None:
    """The two runs in ``{tmp}/ro/runs``, a read-only tmpfs (skip ``need_mount``)."""

    def fill(path: Path) -> None:
        shutil.copytree(c.fx.store, path / "runs", symlinks=True)

    c.state["ro"] = ro_dir(c, "ro", fill)
    c.state["before"] = snap(c.state["ro"] / "runs")


# --------------------------------------------------------------- the damages


def _status(d: Path, data: Any) -> None:
    write(d / "status.json", data if isinstance(data, (str, bytes)) else json.dumps(data))


def running_dead(d: Path) -> None:
    """status.json says running, under a pid no process has."""
    st = json.loads((d / "status.json").read_text())
    st.update(phase="running", pid=dead_pid(), host=socket.gethostname(), backend="local")
    _status(d, st)


def _running_reused(d: Path) -> None:
    """#57: status.json names a pid that is alive (this bench: another process than
    the run's), and the folder has no .lock: nothing holds the run."""
    st = json.loads((d / "status.json").read_text())
    st.update(phase="running", pid=os.getpid(), host=socket.gethostname(), backend="local")
    _status(d, st)
    (d / ".lock").unlink(missing_ok=True)


def _append(path: Path, data: str | bytes) -> None:
    with path.open("ab") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def _metrics_lines(d: Path, order: list[int]) -> None:
    lines = (d / "metrics.jsonl").read_text().splitlines()
    write(d / "metrics.jsonl", "".join(lines[i] + "\n" for i in order))


def _metrics_non_utf8(d: Path) -> None:
    raw = bytearray((d / "metrics.jsonl").read_bytes())
    i = raw.index(b'"loss"')
    raw[i + 1 : i + 3] = b"\xff\xfe"
    write(d / "metrics.jsonl", bytes(raw))


def _spec_types(d: Path) -> None:
    text = (d / "spec.yaml").read_text()
    write(d / "spec.yaml", re.sub(r"(?m)^(  steps:) \d+$", r"\1 many", text, count=1))


def _ckpt(d: Path, step: int) -> Path:
    return d / "checkpoints" / str(step)


def _cut(path: Path, frac: float = 0.5) -> None:
    with path.open("r+b") as f:
        f.truncate(int(path.stat().st_size * frac))


def _empty_ckpt(d: Path) -> None:
    shutil.rmtree(_ckpt(d, 2))
    _ckpt(d, 2).mkdir()


def _file_instead(d: Path, rel: str) -> None:
    shutil.rmtree(d / rel)
    write(d / rel, "not a folder\n")


def _run_is_file(d: Path) -> None:
    shutil.rmtree(d)
    write(d, "not a run\n")


def _set_aside(d: Path) -> None:
    shutil.rmtree(_ckpt(d, 1))
    _ckpt(d, 2).rename(_ckpt(d, 2).with_name("2.damaged"))


# what each damage does to run dmg's folder (store-damage.yaml names them)
DAMAGES: dict[str, Callable[[Path], object]] = {
    "status-garbage": lambda d: _status(d, "}{ not json"),
    "status-json-list": lambda d: _status(d, "[1, 2, 3]"),
    "status-wrong-types": lambda d: _status(
        d, {"phase": 42, "step": "two", "pid": "x", "created": 5}
    ),
    "status-empty": lambda d: _status(d, ""),
    "status-nul-bytes": lambda d: _status(d, b"\0" * 64),
    "status-removed": lambda d: (d / "status.json").unlink(),
    "status-running-dead-pid": running_dead,
    "status-running-reused-pid": _running_reused,
    "metrics-garbage-row": lambda d: _append(d / "metrics.jsonl", '{"step": 99, "loss": 0.5}\n'),
    "metrics-appended-bytes": lambda d: _append(d / "metrics.jsonl", b"\x00\xffgarbage{{\n"),
    "metrics-non-utf8": _metrics_non_utf8,
    "metrics-duplicated-row": lambda d: _metrics_lines(d, [0, 0, 1]),
    "metrics-out-of-order": lambda d: _metrics_lines(d, [1, 0]),
    "eval-baseline-cut": lambda d: _cut(d / "eval" / "baseline.json"),
    "eval-removed": lambda d: shutil.rmtree(d / "eval"),
    "spec-removed": lambda d: (d / "spec.yaml").unlink(),
    "spec-garbage": lambda d: write(d / "spec.yaml", ":: [unclosed\n\0\n"),
    "spec-wrong-types": _spec_types,
    "spec-empty": lambda d: write(d / "spec.yaml", ""),
    "ckpt-newest-truncated": lambda d: truncate_largest(_ckpt(d, 2)),
    "ckpt-empty-metadata": lambda d: _cut(_ckpt(d, 2) / "_CHECKPOINT_METADATA", 0),
    "ckpt-manifest-garbage": lambda d: write(_ckpt(d, 2) / "rlctl-manifest.json", "garbage"),
    "ckpt-manifest-removed": lambda d: (_ckpt(d, 2) / "rlctl-manifest.json").unlink(),
    "ckpt-manifest-removed-and-truncated": lambda d: (
        (_ckpt(d, 2) / "rlctl-manifest.json").unlink(),
        truncate_largest(_ckpt(d, 2)),
    ),
    "ckpt-only-manifest-garbage": lambda d: (
        shutil.rmtree(_ckpt(d, 1)),
        write(_ckpt(d, 2) / "rlctl-manifest.json", "garbage"),
    ),
    "ckpt-only-manifest-removed-and-truncated": lambda d: (
        shutil.rmtree(_ckpt(d, 1)),
        (_ckpt(d, 2) / "rlctl-manifest.json").unlink(),
        truncate_largest(_ckpt(d, 2)),
    ),
    "ckpt-only-set-aside": _set_aside,
    "ckpt-newest-empty-folder": _empty_ckpt,
    "ckpt-all-truncated": lambda d: (truncate_largest(_ckpt(d, 1)), truncate_largest(_ckpt(d, 2))),
    "ckpt-orbax-tmp-left": lambda d: write(
        d / "checkpoints" / "3.orbax-checkpoint-tmp-1700000000" / "x", "junk"
    ),
    "ckpt-user-folder": lambda d: write(d / "checkpoints" / "backup" / "notes.txt", "mine\n"),
    "checkpoints-is-file": lambda d: _file_instead(d, "checkpoints"),
    "tensorboard-is-file": lambda d: _file_instead(d, "tensorboard"),
    "lock-garbage": lambda d: write(d / ".lock", b"\xff garbage"),
    "run-folder-is-file": _run_is_file,
}


@hook("setup", factory=True)
def damaged_store(damage: str, breaks: Sequence[int] = ()) -> Setup:
    """The two runs, run dmg damaged by ``damage`` (DAMAGES), which breaks its
    checkpoints ``breaks``; the others are fingerprinted, then the whole store."""
    if damage not in DAMAGES:
        raise ValueError(f"no damage named {damage!r} (DAMAGES in {__name__})")
    fn = DAMAGES[damage]

    def setup(c: Ctx) -> None:
        shutil.copytree(c.fx.store, c.runs, symlinks=True)
        d = c.runs / "dmg"
        c.state["intact"] = {s: snap(_ckpt(d, s)) for s in (1, 2) if s not in breaks}
        fn(d)
        c.state["store"] = snap(c.runs)
        c.state["good"] = snap(c.runs / "good")
        m = d / "metrics.jsonl"
        c.state["metrics"] = m.read_bytes() if m.is_file() else None

    return setup


@hook("setup")
def nan_status(c: Ctx) -> None:
    """dmg's status.json says step NaN (valid JSON to Python, not to a strict parser)."""
    copy_store(c)
    st = json.loads((c.runs / "dmg" / "status.json").read_text())
    text = json.dumps(st).replace('"step": 2', '"step": NaN')
    write(c.runs / "dmg" / "status.json", text)


@hook("setup")
def overstated(c: Ctx) -> None:
    """dmg's status.json says step 50; its files say 2."""
    copy_store(c)
    st = json.loads((c.runs / "dmg" / "status.json").read_text())
    st.update(step=50)
    write(c.runs / "dmg" / "status.json", json.dumps(st))


@hook("setup")
def odd_names(c: Ctx) -> None:
    """dmg's checkpoints/ also holds 07 (a copy of 2), ², an empty 9 and an 8 with
    no metadata: none of them is a newer checkpoint than 2."""
    copy_store(c)
    ck = c.runs / "dmg" / "checkpoints"
    shutil.copytree(ck / "2", ck / "07")
    (ck / "\u00b2").mkdir()
    (ck / "9").mkdir()
    shutil.copytree(ck / "2", ck / "8")
    (ck / "8" / "_CHECKPOINT_METADATA").unlink()
    (ck / "8" / "rlctl-manifest.json").unlink(missing_ok=True)


def stale_aside(c: Ctx) -> None:
    """dmg stale (running under a dead pid) with both its checkpoints set aside."""
    copy_store(c)
    d = c.runs / "dmg"
    for n in ("1", "2"):
        (d / "checkpoints" / n).rename(d / "checkpoints" / f"{n}.damaged")
    running_dead(d)


@hook("setup")
def older_aside(c: Ctx) -> None:
    """dmg's checkpoint 1 set aside, 2 intact: nothing newer to recover."""
    copy_store(c)
    ck = c.runs / "dmg" / "checkpoints"
    (ck / "1").rename(ck / "1.damaged")
    c.state["store"] = snap(c.runs)


@hook("setup", factory=True)
def damaged_ckpt(kind: str) -> Setup:
    """good's checkpoints: ``aside`` (both set aside), ``no-metadata`` (2 without
    Orbax's _METADATA), ``cut-no-manifest`` (2's every data file cut, no manifest) or
    ``cut`` (2's largest file cut)."""
    if kind not in ("aside", "no-metadata", "cut-no-manifest", "cut"):
        raise ValueError(f"no checkpoint damage {kind!r}")

    def setup(c: Ctx) -> None:
        copy_store(c)
        ck = c.runs / "good" / "checkpoints"
        if kind == "aside":
            for n in ("1", "2"):
                (ck / n).rename(ck / f"{n}.damaged")
            return
        if kind == "no-metadata":
            (ck / "2" / "default" / "_METADATA").unlink()
            return
        if kind == "cut-no-manifest":  # every data file cut: no array of it reads
            (ck / "2" / "rlctl-manifest.json").unlink()
            for f in (ck / "2" / "default").rglob("d/*"):
                with f.open("r+b") as h:
                    h.truncate(min(1000, f.stat().st_size))
            return
        truncate_largest(ck / "2")

    return setup


@hook("setup")
def nan_checkpoint(c: Ctx) -> None:
    """Run good's checkpoint 3: its checkpoint 2 with one weight NaN, saved by Orbax
    (what an older rlctl saved once its loss had gone NaN)."""
    import numpy as np
    import orbax.checkpoint as ocp

    plain_store(c)
    with ocp.CheckpointManager(c.runs / "good" / "checkpoints") as manager:
        state = manager.restore(2, args=ocp.args.StandardRestore())
        w = state["model"]["final_norm"]["w"]
        state["model"]["final_norm"]["w"] = np.full(np.shape(w), np.nan, np.float32)
        manager.save(3, args=ocp.args.StandardSave(state))
        manager.wait_until_finished()


@hook("setup")
def first_save_disk(c: Ctx) -> None:
    """``{runs}`` a tmpfs twice the size of a first checkpoint (skip ``need_mount``)."""
    size = sum(
        p.stat().st_size
        for p in (c.fx.store / "good" / "checkpoints" / "1").rglob("*")
        if p.is_file()
    )
    c.fx.mounts.tmpfs(c.runs, f"{2 * size // 1024 + 1}k")
    c.state["size"] = size


# --------------------------------------------------------------- what changed


@hook("post")
def store_read_only(c: Ctx, run: Run) -> list[str]:
    """A status command changed no file of the store (as the setup fingerprinted it)."""
    d = diff(c.state["store"], snap(c.runs))
    return [f"a status command changed the store: {d}"] if d else []


@hook("post")
def store_unchanged(c: Ctx, run: Run) -> list[str]:
    """A refused command changed no file of the store (as the setup fingerprinted it)."""
    d = diff(c.state["store"], snap(c.runs))
    return [f"a refused command changed the store: {d}"] if d else []


@hook("post")
def read_only_store_unchanged(c: Ctx, run: Run) -> list[str]:
    """The store of ``read_only_store`` is as it was."""
    d = diff(c.state["before"], snap(c.state["ro"] / "runs"))
    return [f"read-only store changed: {d}"] if d else []


@hook("post", factory=True)
def good_unchanged(says: str) -> Judge:
    """Run good is as ``copy_store`` left it; else ``says: what changed``."""

    def post(c: Ctx, run: Run) -> list[str]:
        d = diff(c.state["good"], snap(c.runs / "good"))
        return [f"{says}: {d}"] if d else []

    return post


@hook("post")
def listing_json(c: Ctx, run: Run) -> list[str]:
    """``status -o json`` changed nothing and shows the healthy run as it is."""
    bad = store_read_only(c, run)
    try:
        rows = json.loads(run.out)
    except ValueError:
        return bad
    good = (
        [r for r in rows if isinstance(r, dict) and r.get("name") == "good"]
        if isinstance(rows, list)
        else []
    )
    if not good:
        bad.append("status -o json lost the healthy run 'good'")
    elif good[0].get("phase") != "completed" or good[0].get("step") != 2:
        bad.append(
            f"status -o json shows the healthy run as {good[0].get('phase')!r} "
            f"step {good[0].get('step')!r}"
        )
    return bad


@hook("check")
def listing_has_dmg(c: Ctx, run: Run) -> list[str]:
    """``status -o json`` lists the damaged run dmg (damaged, but there)."""
    try:
        rows = json.loads(run.out)
    except ValueError:
        return []
    names = [r.get("name") for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []
    return [] if "dmg" in names else ["status -o json does not list the damaged run 'dmg'"]


@hook("post", factory=True)
def resume_outcome(user_folder: bool = False) -> Judge:
    """After ``resume dmg`` of a ``damaged_store``: good untouched; completed 3 steps
    (and ``user_folder``: the user's checkpoints/backup/ kept), or refused with the
    intact checkpoints, metrics.jsonl and a readable status left as they were."""

    def post(c: Ctx, run: Run) -> list[str]:
        d = c.runs / "dmg"
        bad = []
        g = diff(c.state["good"], snap(c.runs / "good"))
        if g:
            bad.append(f"resume of dmg changed the healthy run good: {g}")
        if run.rc == 0:
            bad += check_completed(d, 3)
            if user_folder and not (d / "checkpoints" / "backup" / "notes.txt").is_file():
                bad.append("a user's folder checkpoints/backup/ was deleted by resume")
            return bad
        for s, before in c.state["intact"].items():
            moved = sorted(x.name for x in (d / "checkpoints").glob(f"{s}.*"))
            if not _ckpt(d, s).exists() and moved:
                bad.append(
                    f"refused resume moved the intact checkpoint {s} to "
                    f"checkpoints/{moved[0]} (nothing left to resume from)"
                )
                continue
            ch = diff(before, snap(_ckpt(d, s)))
            if ch:
                bad.append(f"refused resume changed the intact checkpoint {s}: {ch}")
        st = read_json(d / "status.json") if d.is_dir() else None
        if isinstance(st, dict) and st.get("phase") in ACTIVE:
            bad.append(f"after the refused resume status.json says {st.get('phase')!r}")
        m = d / "metrics.jsonl"
        if c.state.get("metrics") is not None and (
            not m.is_file() or m.read_bytes() != c.state["metrics"]
        ):
            bad.append("the refused resume changed or removed metrics.jsonl")
        named = st.get("latest_checkpoint") if isinstance(st, dict) else None
        if isinstance(named, int) and not _ckpt(d, named).is_dir():
            bad.append(
                f"after the refused resume status.json names checkpoint {named}, "
                "which is not there (set aside or lost)"
            )
        if (c.runs / "good").is_dir():
            r = c.run(["status", "good", "--runs-dir", str(c.runs), "-o", "json"])
            info = read_json_text(r.out)
            if r.rc != 0 or not isinstance(info, dict) or info.get("phase") != "completed":
                bad.append(f"status of the healthy run good broke after it (exit {r.rc})")
        return bad

    return post


@hook("post")
def extended(c: Ctx, run: Run) -> list[str]:
    """``resume good --steps 3`` ran step 3 and wrote the new count to spec.yaml."""
    bad = check_completed(c.runs / "good", 3)
    spec = (c.runs / "good" / "spec.yaml").read_text()
    if "steps: 3" not in spec:
        bad.append("spec.yaml does not say the new step count 3")
    return bad


@hook("post")
def first_saved(c: Ctx, run: Run) -> list[str]:
    """Run fs saved its first checkpoint on the disk of ``first_save_disk``."""
    ck = c.runs / "fs" / "checkpoints" / "1"
    if not (ck / "_CHECKPOINT_METADATA").is_file():
        return [f"no first checkpoint on a disk of twice its size ({2 * c.state['size']} B)"]
    return []
