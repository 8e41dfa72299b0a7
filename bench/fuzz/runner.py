"""One case run and judged in its own folder; ``--list``; the report of a run."""

from __future__ import annotations

import os
import random
import re
import shutil
import time
import traceback
from pathlib import Path

from bench.fuzz.case import Case, Outcome
from bench.fuzz.files import read_json
from bench.fuzz.fixtures import Ctx, Fixtures
from bench.fuzz.judge import judge
from bench.fuzz.proc import REPO, Run


def _env_of(case: Case, c: Ctx) -> dict[str, str | None]:
    e = case.env
    return dict(e(c) if callable(e) else (e or {}))


def no_run_left(runs: Path) -> list[str]:
    if not runs.is_dir():
        return []
    left = sorted(p.name for p in runs.iterdir())
    if not left:
        return []
    phase = ""
    st = read_json(runs / left[0] / "status.json")
    if isinstance(st, dict):
        phase = f" (phase {st.get('phase')})"
    return [f"exit 2 ('nothing was changed') but left {runs.name}/{', '.join(left)}{phase}"]


def run_case(case: Case, fx: Fixtures, root: Path, seed: int, keep: bool) -> Outcome:
    o = Outcome(case.cid, case.family, expected="/".join(map(str, case.expect)))
    tmp = root / "cases" / re.sub(r"[^A-Za-z0-9_.-]+", "_", case.cid)
    tmp.mkdir(parents=True, exist_ok=True)
    c = Ctx(tmp, fx, random.Random(f"{seed}:{case.cid}"))
    t0 = time.monotonic()
    try:
        for what in case.needs:
            why = fx.need(what)
            if why:
                o.skipped = why
                return o
        if case.skip and (why := case.skip(c)):
            o.skipped = why
            return o
        if case.setup:
            case.setup(c)
        if case.runner:
            case.runner(c, o)
            return o
        assert case.argv is not None
        before = set(os.listdir(tmp))
        run = c.run(case.argv(c), _env_of(case, c), case.timeout)
        o.take(run)
        o.traceback, o.unclear = judge(
            run,
            case.expect,
            case.keywords,
            case.ok_keywords,
            case.forbid,
            case.one_line,
            case.allow_traceback,
        )
        if case.check:
            o.unclear += case.check(c, run)
        if run.rc == 2:
            if case.train:
                o.lost += no_run_left(c.runs)
            new = sorted(set(os.listdir(tmp)) - before - {"runs"})
            if new:
                o.lost.append(
                    f"exit 2 ('nothing was changed') but created {new} in the working directory"
                )
        if case.post:
            o.lost += case.post(c, run)
    except Exception:
        o.lost.append(
            "HARNESS ERROR (not rlctl's): " + traceback.format_exc().strip().splitlines()[-1]
        )
        o.note = traceback.format_exc()
    finally:
        o.secs = time.monotonic() - t0
        fx.mounts.release_under(tmp)
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return o


def list_cases(cases: list[Case]) -> None:
    fx = Fixtures(Path("$T"), listing=True)
    for case in cases:
        c = Ctx(Path("$T") / "case", fx, random.Random(0))
        if case.runner:
            cmd = f"(custom: {case.runner_name})"
        else:
            assert case.argv is not None
            env = _env_of(case, c)
            cmd = Run(case.argv(c), env, 0, "", "", 0).cmd()
        print(f"{case.cid:58} expect {'/'.join(map(str, case.expect)):7} {cmd}")
    print(f"{len(cases)} cases")


def short(text: str, root: Path) -> str:
    return text.replace(str(root), "$T").replace(str(REPO), "$REPO")


def report(outcomes: list[Outcome], root: Path, secs: float, fx: Fixtures) -> None:
    fams: dict[str, list[Outcome]] = {}
    for o in outcomes:
        fams.setdefault(o.family, []).append(o)
    head = (
        f"{'family':16} {'cases':>5} {'tracebacks':>10} {'unclear':>7} {'lost/wrong':>10} "
        f"{'skipped':>7}"
    )
    print("\n" + head + "\n" + "-" * len(head))
    tot = [0, 0, 0, 0, 0]
    for fam, os_ in fams.items():
        row = [
            len(os_),
            sum(o.traceback for o in os_),
            sum(bool(o.unclear) for o in os_),
            sum(bool(o.lost) for o in os_),
            sum(o.skipped is not None for o in os_),
        ]
        tot = [a + b for a, b in zip(tot, row)]
        print(f"{fam:16} {row[0]:5} {row[1]:10} {row[2]:7} {row[3]:10} {row[4]:7}")
    print("-" * len(head))
    print(
        f"{'TOTAL':16} {tot[0]:5} {tot[1]:10} {tot[2]:7} {tot[3]:10} {tot[4]:7}"
        f"   ({secs / 60:.1f} min"
        + (f"; one tiny 2-step train: {fx.train_secs:.1f} s)" if fx.train_secs else ")")
    )
    for what, why in fx.errors.items():
        print(f"FIXTURE {what}: {why}")
    bad = [o for o in outcomes if o.bad]
    if bad:
        print(f"\n{len(bad)} case(s) with a traceback, an unclear error or lost/wrong data:\n")
    for o in bad:
        tags = ",".join(
            t
            for t, on in (
                ("traceback", o.traceback),
                ("unclear", bool(o.unclear)),
                ("lost", bool(o.lost)),
            )
            if on
        )
        print(f"[{tags}] {o.cid}   exit {o.rc} (expected {o.expected or '-'})  {o.secs:.1f}s")
        print(f"    $ {short(o.cmd, root)}")
        for w in o.lost:
            print(f"    lost/wrong: {short(w, root)}")
        for w in o.unclear:
            print(f"    unclear: {short(w, root)}")
        if o.note:
            print(f"    note: {short(o.note.splitlines()[0], root)}")
        print(f"    stderr first: {short(o.err_first, root)}")
        if o.err_error and o.err_error not in (o.err_first, o.err_last):
            print(f"    stderr error: {short(o.err_error, root)}")
        if o.err_last != o.err_first:
            print(f"    stderr last:  {short(o.err_last, root)}")
    skipped = [o for o in outcomes if o.skipped]
    if skipped:
        print(
            "\nskipped: " + "; ".join(f"{o.cid} ({short(o.skipped or '', root)})" for o in skipped)
        )
