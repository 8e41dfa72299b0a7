"""Checks (more *unclear* problems of a run) and posts (*lost/wrong* problems left in
the case's folder) that need no run store; the store's are in store.py."""

from __future__ import annotations

import json
import os
from typing import Any

from bench.fuzz.case import Judge
from bench.fuzz.files import ACTIVE, check_completed, read_json, read_json_text
from bench.fuzz.fixtures import Ctx
from bench.fuzz.hooks.files import NOT_A_FOLDER
from bench.fuzz.proc import Run
from bench.fuzz.registry import hook

# ------------------------------------------------------------------------ checks


@hook("check", factory=True)
def json_error(code: int) -> Judge:
    """With -o json a failure is also one ``{"error", "hint", "exit_code"}`` object on
    stdout (README "Output"), the exit code in it the process's."""

    def check(c: Ctx, run: Run) -> list[str]:
        try:
            doc = json.loads(run.out)
        except ValueError:
            return ["-o json: no JSON error object on stdout"]
        if not isinstance(doc, dict) or set(doc) != {"error", "hint", "exit_code"}:
            return [f"-o json: stdout is not an error object: {run.out[:80]!r}"]
        return [] if doc["exit_code"] == code else [f"-o json: exit_code {doc['exit_code']}"]

    return check


@hook("check", factory=True)
def within(secs: float) -> Judge:
    """The command gave up in time (an endpoint that does not answer)."""
    return lambda c, run: [] if run.secs < secs else [f"took {run.secs:.1f} s, more than {secs}"]


@hook("check", factory=True)
def json_field(key: str, want: Any) -> Judge:
    """``-o json`` says ``key: want``."""

    def check(c: Ctx, run: Run) -> list[str]:
        got = read_json_text(run.out)
        value = got.get(key) if isinstance(got, dict) else None
        return [] if value == want else [f"status says {key}={value!r}"]

    return check


@hook("check", factory=True)
def shows(names: list[str], phases: list[str]) -> Judge:
    """stdout shows each name and phase whole (not cut to fit the width)."""

    def check(c: Ctx, run: Run) -> list[str]:
        missing = [x for x in (*names, *phases) if x not in run.out]
        return [f"stdout does not show {', '.join(missing)} whole"] if missing else []

    return check


@hook("check", factory=True)
def one_watch_line(name: str, phase: str) -> Judge:
    """``status --watch`` into a pipe: one whole line, ``NAME phase=PHASE ...``."""

    def check(c: Ctx, run: Run) -> list[str]:
        lines = run.out.splitlines()
        if len(lines) != 1 or not run.out.endswith("\n"):
            return [f"--watch into a pipe: {len(lines)} lines, want one whole line"]
        want = f"{name} phase={phase} "
        return [] if want in lines[0] else [f"--watch line lacks {want!r}: {lines[0][:120]!r}"]

    return check


@hook("check")
def quiet_stdout(c: Ctx, run: Run) -> list[str]:
    """Nothing on stdout (what there is to say goes to stderr)."""
    return [f"stdout should be empty, got {run.out[:100]!r}"] if run.out.strip() else []


@hook("check", factory=True)
def stderr_has(text: str, why: str) -> Judge:
    """stderr says ``text`` (a hint's command); else the problem ``why``."""
    return lambda c, run: [] if text in run.err else [why]


# ------------------------------------------------------------------------- posts


@hook("post", factory=True)
def regular_file_unchanged(path: str) -> Judge:
    """The file of setup ``regular_file`` is still there, unchanged."""

    def post(c: Ctx, run: Run) -> list[str]:
        p = c.p(path)
        if not p.is_file() or p.read_bytes() != NOT_A_FOLDER.encode():
            return [f"the file {path} given as --runs-dir was changed or removed"]
        return []

    return post


@hook("post")
def full_disk_clean(c: Ctx, run: Run) -> list[str]:
    """A run that ran out of disk left no partial checkpoint and no live phase."""
    bad = []
    for run_dir in (p for p in c.runs.iterdir() if p.is_dir()) if c.runs.is_dir() else []:
        ck = run_dir / "checkpoints"
        if ck.is_dir():
            tmp = [x for x in os.listdir(ck) if "orbax-checkpoint-tmp" in x]
            if tmp:
                bad.append(f"partial checkpoint folders left on the full disk: {tmp}")
        st = read_json(run_dir / "status.json")
        if isinstance(st, dict) and st.get("phase") in ACTIVE:
            bad.append(f"status.json left at phase {st.get('phase')!r} after the process ended")
    return bad


@hook("post")
def no_plot_left(c: Ctx, run: Run) -> list[str]:
    """A refused or failed --plot leaves no image, no temp file and no new folder."""
    left = [
        str(p.relative_to(c.tmp)) for p in c.tmp.rglob("*") if ".png" in p.name or p.name == "no"
    ]
    return [f"--plot failed but left {left}"] if left else []


@hook("post")
def no_export(c: Ctx, run: Run) -> list[str]:
    """A refused checkpoint-convert left no ``{tmp}/export*``."""
    left = sorted(p.name for p in c.tmp.iterdir() if p.name.startswith("export"))
    return [f"a refused export left {left}"] if left else []


@hook("post", factory=True)
def completed(run: str, steps: int) -> Judge:
    """Run ``run`` in ``{runs}`` completed ``steps`` steps, every file in order."""
    return lambda c, r: check_completed(c.runs / run, steps)


@hook("post")
def nothing_saved(c: Ctx, run: Run) -> list[str]:
    """Run ``nan`` failed and saved no checkpoint."""
    d = c.runs / "nan"
    ck = d / "checkpoints"
    bad = (
        [f"checkpoints saved after a NaN loss: {sorted(os.listdir(ck))}"]
        if ck.is_dir() and os.listdir(ck)
        else []
    )
    st = read_json(d / "status.json")
    if not isinstance(st, dict) or st.get("phase") != "failed":
        bad.append(f"status.json {st!r:.160}, expected phase failed")
    return bad


@hook("post")
def noisy_log(c: Ctx, run: Run) -> list[str]:
    """What the reward of run ``noisy`` printed is in its train.log."""
    log = c.runs / "noisy" / "train.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    return [] if "printed: scoring" in text else ["the reward's print is not in train.log"]
