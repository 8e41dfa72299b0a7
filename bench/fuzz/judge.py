"""How one run is judged: a traceback, or an error a user cannot act on (the wrong exit
code, more than one ``error:`` line, no word naming what to fix, invalid JSON with
``-o json``, a library's log line on stderr)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from bench.fuzz.proc import Run

TRACEBACK = "Traceback (most recent call last)"
LIB_LOG = re.compile(r"^(WARNING|INFO|DEBUG)[:\s]|^[WIEF]\d{4} \d\d:\d\d|^\S+Warning: ")


def error_shape(err: str) -> str | None:
    """None when stderr ends in one ``error:`` line and at most one ``hint:`` line."""
    lines = [x.rstrip() for x in err.splitlines() if x.strip()]
    if not lines:
        return "failed with nothing on stderr"
    if any(x.startswith("Usage:") for x in lines) or any("─ Error ─" in x for x in lines):
        return f"click usage box ({len(lines)} lines) instead of one 'error:' line"
    errs = [i for i, x in enumerate(lines) if x.startswith("error:")]
    if not errs:
        return "no 'error:' line on stderr"
    if len(errs) > 1:
        return f"{len(errs)} 'error:' lines"
    after = lines[errs[0] + 1 :]
    if len(after) > 1 or (after and not after[0].startswith("hint:")):
        return f"{len(after)} line(s) after the error line"
    if len(lines[errs[0]]) > 400:
        return f"error line is {len(lines[errs[0]])} characters"
    return None


def _has(text: str, kw: str | tuple[str, ...]) -> bool:
    alts = (kw,) if isinstance(kw, str) else kw
    low = text.lower()
    return any(a.lower() in low for a in alts)


def _kw(kw: str | tuple[str, ...]) -> str:
    return repr(kw) if isinstance(kw, str) else " or ".join(map(repr, kw))


def judge(
    run: Run,
    expect: Iterable[int | None],
    keywords: Iterable = (),
    ok_keywords: Iterable = (),
    forbid: Iterable[str] = (),
    one_line: bool = True,
    allow_traceback: bool = False,
    json_mode: bool | None = None,
) -> tuple[bool, list[str]]:
    """(traceback?, unclear reasons) of one run."""
    expect = tuple(expect)
    text = run.out + "\n" + run.err
    tb = TRACEBACK in text and not allow_traceback
    why: list[str] = []
    if run.timed_out:
        why.append(f"did not finish in {run.timeout:.0f} s")
    elif run.rc not in expect:
        why.append(f"exit {run.rc}, expected {'/'.join(map(str, expect))}")
    failed = run.rc not in (0, None)
    if failed and one_line and not allow_traceback and not tb and run.rc is not None and run.rc > 0:
        shape = error_shape(run.err)
        if shape:
            why.append(shape)
    if not run.timed_out:
        for kw in keywords if failed else ok_keywords:
            if not _has(run.err if failed else text, kw):
                why.append(f"does not name {_kw(kw)}")
    for pat in forbid:
        m = re.search(pat, text, re.IGNORECASE | re.MULTILINE)
        if m:
            why.append(f"says {m.group(0)!r}")
    if json_mode is None:
        json_mode = _json_mode(run.argv, run.env_shown)
    if json_mode and not run.timed_out:
        s = run.out.strip()
        if s:
            try:
                json.loads(s)
            except ValueError:
                why.append("-o json: stdout is not one valid JSON document")
        elif run.rc == 0:
            why.append("-o json: nothing on stdout")
    if not allow_traceback:
        logs = [x for x in run.err.splitlines() if LIB_LOG.search(x)]
        if logs:
            why.append(f"library log line on stderr: {logs[0][:100]!r}")
    return tb, why


def _json_mode(argv: list[str], env: dict[str, str | None]) -> bool:
    for i, a in enumerate(argv):
        if a in ("-o", "--output") and i + 1 < len(argv) and argv[i + 1].lower() == "json":
            return True
        if a in ("-ojson", "--output=json"):
            return True
    return (env.get("RLCTL_OUTPUT") or "").lower() == "json"
