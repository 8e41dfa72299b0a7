"""Custom runners: cases that are more than one command and its judging, so code:
writers racing for one run, ``status`` polled while a resume runs, a signal at a
chosen moment then a resume, a reward that goes bad mid-run then is fixed, an endpoint
that accepts and never answers. Each fills the outcome itself."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable, Iterable, Sequence

from bench.fuzz.case import Outcome, Runner
from bench.fuzz.files import (
    ACTIVE,
    check_completed,
    diff,
    metrics_steps,
    read_json,
    read_json_text,
    snap,
    write,
)
from bench.fuzz.fixtures import Ctx
from bench.fuzz.hooks.checks import within
from bench.fuzz.hooks.contents import FLAKY_REWARD
from bench.fuzz.hooks.store import copy_store, stale_aside
from bench.fuzz.judge import judge
from bench.fuzz.proc import TRAIN_TIMEOUT, Run, Spawned
from bench.fuzz.registry import hook

ArgvOf = Callable[[Ctx], list[str]]  # an ``argv`` argument, its placeholders bound


def judge_into(
    o: Outcome,
    run: Run,
    tag: str,
    expect: Iterable[int | None],
    keywords: Iterable = (),
    ok_keywords: Iterable = (),
) -> None:
    """Judge one of a runner's commands into its outcome, its problems tagged."""
    tb, why = judge(run, expect, keywords, ok_keywords)
    o.traceback |= tb
    o.unclear += [f"{tag}: {w}" for w in why]


# ------------------------------------------------------------------ concurrency


def _race(
    argvs: Callable[[Ctx], list[list[str]]],
    run_name: str,
    steps: int,
    winners: int = 1,
    loser_kw: tuple = (),
) -> Callable[[Ctx, Outcome], None]:
    def runner(c: Ctx, o: Outcome) -> None:
        procs = [c.spawn(a, f"p{i}") for i, a in enumerate(argvs(c))]
        runs = [p.finish(TRAIN_TIMEOUT) for p in procs]
        o.take(runs[0])
        o.cmd = "  &  ".join(r.cmd() for r in runs)
        o.expected = f"{winners}x 0, the others 4"
        o.rc = [r.rc for r in runs]
        won = [r for r in runs if r.rc == 0]
        if len(won) != winners:
            o.lost.append(
                f"{len(won)} of {len(runs)} racing writers exited 0 "
                f"(exits {o.rc}), expected exactly {winners}"
            )
        for i, r in enumerate(runs):
            if r.rc == 0:
                judge_into(o, r, f"#{i}", (0,))
            else:
                judge_into(o, r, f"#{i}", (4,), loser_kw)
                lines = [x for x in r.err.splitlines() if x.strip()]
                o.err_first, o.err_last = (lines[0][:240], lines[-1][:240]) if lines else ("", "")
        o.lost += check_completed(c.runs / run_name, steps)
        if "good" in c.state:
            g = diff(c.state["good"], snap(c.runs / "good"))
            if g:
                o.lost.append(f"the race changed the healthy run good: {g}")

    return runner


@hook("runner", factory=True)
def race(argvs: list[ArgvOf], run: str, steps: int, loser_keywords: Sequence[str] = ()) -> Runner:
    """The ``argvs`` started at once: exactly one exits 0 and completes run ``run``
    (``steps`` steps); each other exits 4 naming ``loser_keywords``."""
    return _race(lambda c: [a(c) for a in argvs], run, steps, loser_kw=tuple(loser_keywords))


@hook("runner")
def status_during_resume(c: Ctx, o: Outcome) -> None:
    """``status dmg -o json`` polled while ``resume dmg`` runs: never 'stale' while it
    lives, every poll exit 0; the resume completes."""
    p = c.spawn(["resume", "dmg", "--runs-dir", str(c.runs)], "resume")
    polls = 0
    seen: list[str] = []
    while p.alive() and polls < 400:
        r = c.run(["status", "dmg", "--runs-dir", str(c.runs), "-o", "json"])
        still = p.alive()
        polls += 1
        tb, why = judge(r, (0,))
        o.traceback |= tb
        o.unclear += [f"status poll {polls}: {w}" for w in why]
        info = read_json_text(r.out)
        if isinstance(info, dict):
            ph = info.get("phase")
            if not seen or seen[-1] != ph:
                seen.append(ph)
            if ph == "stale" and still:
                o.lost.append(f"status poll {polls} says 'stale' while resume (pid {p.pid}) runs")
        time.sleep(0.3)
    run = p.finish(TRAIN_TIMEOUT)
    o.take(run)
    o.cmd = f"{run.cmd()}  &  (rlctl status dmg -o json, polled {polls}x)"
    o.note = f"phases seen: {seen}"
    o.expected = "0 (resume and every status poll)"
    judge_into(o, run, "resume", (0,))
    o.unclear = sorted(set(o.unclear), key=o.unclear.index)[:6]
    o.lost += check_completed(c.runs / "dmg", 3)


# ---------------------------------------------------------------------- signals


def _wait_for(p: Spawned, cond: Callable[[], bool], limit: float, poll: float = 0.05) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit and p.alive():
        if cond():
            return True
        time.sleep(poll)
    return False


def _signal_case(
    sig: int, when: str, twice: bool = False, on_resume: bool = False
) -> Callable[[Ctx, Outcome], None]:
    """``when``: 'random' (uniform over the expected run time), 'spec' (as soon as
    spec.yaml exists), 'ckpt1'/'ckpt2' (once that checkpoint folder exists), 'early',
    or 'step2' (once metrics.jsonl has step 2, checkpoints every 10 steps: the stop's
    own save must keep the steps done, issue #25; twice: every step, and the second
    signal's skipped save may lose only the step in progress)."""
    steps = 4
    at_step = when == "step2"

    def runner(c: Ctx, o: Outcome) -> None:
        if on_resume:
            copy_store(c)
            name, steps_n = "dmg", 3
            argv = ["resume", "dmg", "--runs-dir", str(c.runs)]
        else:
            name, steps_n = "sig", steps
            # twice: the second signal skips the stop's save, so what is kept is what
            # the interval saved (every step here: at most the step in progress lost)
            interval = "10" if at_step and not twice else "1"
            argv = c.train(
                name=name, steps=str(steps), extra=["--set", f"checkpoint.interval={interval}"]
            )
        d = c.runs / name
        # start-up dominates: a 4-step train takes about as long as the 2-step fixture
        # run, a 1-step resume about 0.6x; aim inside that
        est = (c.fx.train_secs or 15.0) * (0.6 if on_resume else 0.95)
        p = c.spawn(argv, "train")
        if when == "random":
            delay = c.rng.uniform(0.5, 0.85 * est)
            _wait_for(p, lambda: False, delay)
            moment = f"after {delay:.1f} s"
        elif when == "early":
            _wait_for(p, lambda: False, 0.4)
            moment = "after 0.4 s"
        elif at_step:
            _wait_for(p, lambda: len(metrics_steps(d)[0]) >= 2, 200, 0.02)
            moment = "once step 2 was in metrics.jsonl"
        elif when == "spec":
            _wait_for(p, lambda: (d / "spec.yaml").exists(), 120, 0.002)
            moment = "as soon as spec.yaml appeared"
        else:
            step = when[-1]
            _wait_for(p, lambda: (d / "checkpoints" / step).is_dir(), 200, 0.02)
            moment = f"once checkpoints/{step} appeared"
        alive = p.alive()
        if alive:
            os.kill(p.pid, sig)
            if twice:
                time.sleep(0.2)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, sig)
        run = p.finish(120)
        p.kill()
        signame = signal.Signals(sig).name + (" twice" if twice else "")
        o.note = f"{signame} {moment}" + ("" if alive else " (it had already exited)")
        o.take(run)
        o.cmd = f"{run.cmd()}  ; kill -{signal.Signals(sig).name[3:]} {moment}"
        created = (d / "spec.yaml").exists()
        done = (read_json(d / "status.json") or {}).get("phase") == "completed"
        if sig == signal.SIGKILL:
            o.expected = "-9, then status not active, then resume 0"
        else:
            o.expected = f"130 (-{sig} before the run exists), then resume 0"
        if not alive:
            judge_into(o, run, "train", (0,))
        elif sig == signal.SIGKILL:
            if run.rc != -signal.SIGKILL:
                o.unclear.append(f"exit {run.rc} after SIGKILL")
        else:
            judge_into(
                o,
                run,
                "signalled",
                # -sig: before the run exists, or after it completed (the handler is gone)
                (130,) if created and not done else (130, -sig, 0) if done else (130, -sig),
                keywords=("interrupted",) if run.rc == 130 else (),
            )
            st = read_json(d / "status.json")
            if sig != signal.SIGKILL and isinstance(st, dict) and st.get("phase") in ACTIVE:
                o.lost.append(
                    f"{signame} left status.json at phase {st.get('phase')!r} "
                    f"(README: recorded 'interrupted')"
                )
            if at_step and alive and isinstance(st, dict):
                done, kept = st.get("step"), st.get("latest_checkpoint")
                if done != len(metrics_steps(d)[0]):
                    o.lost.append(
                        f"status.json step {done}, metrics.jsonl has "
                        f"{len(metrics_steps(d)[0])} steps"
                    )
                if not twice and kept != done:
                    o.lost.append(
                        f"{signame} after step {done} kept checkpoint {kept}: "
                        "the stop's save lost steps"
                    )
                if twice and (kept or 0) < (done or 0) - 1 and (done or 0) > 1:
                    o.lost.append(
                        f"{signame} after step {done} kept checkpoint {kept}: "
                        "more than the step in progress lost"
                    )
        if not created:
            o.note += "; no run was created yet"
            return
        s = c.run(["status", name, "--runs-dir", str(c.runs), "-o", "json"])
        judge_into(o, s, "status", (0,))
        info = read_json_text(s.out)
        phase = info.get("phase") if isinstance(info, dict) else None
        if phase in ACTIVE:
            o.lost.append(f"status says {phase!r} for the dead process")
        o.note += f"; status after: {phase}"
        if phase == "completed":
            o.lost += check_completed(d, steps_n)
            return
        r = c.run(["resume", name, "--runs-dir", str(c.runs)], timeout=TRAIN_TIMEOUT)
        judge_into(o, r, "resume", (0,))
        if r.rc != 0:
            o.take(r)
        o.lost += check_completed(d, steps_n)
        if on_resume:
            g = diff(c.state["good"], snap(c.runs / "good"))
            if g:
                o.lost.append(f"changed the healthy run good: {g}")

    return runner


@hook("runner", factory=True)
def signal_case(sig: str, when: str, twice: bool = False, on_resume: bool = False) -> Runner:
    """``sig`` (SIGTERM, SIGINT, SIGKILL) to a 4-step train (``on_resume``: to a
    resume of dmg) at moment ``when``; then status and a resume must finish the run."""
    if sig not in ("SIGTERM", "SIGINT", "SIGKILL"):
        raise ValueError(f"no signal {sig!r} here (SIGTERM, SIGINT, SIGKILL)")
    if when not in ("random", "early", "spec", "ckpt1", "ckpt2", "step2"):
        raise ValueError(f"no moment {when!r} (random, early, spec, ckpt1, ckpt2, step2)")
    return _signal_case(signal.Signals[sig], when, twice, on_resume)


# ---------------------------------------------------------- issue #47's runners

FLAKY = 'rewards=["./r.py:flaky"]'


@hook("runner", factory=True)
def bad_then_fixed(mode: str, value: str = "") -> Runner:
    """Train 3 steps with a reward that goes bad at step 2 (checkpoint 1 exists), then
    resume with it fixed: the first stops at step 2 naming the reward, keeps only the
    finite checkpoint 1; the resume completes 3 steps."""

    def runner(c: Ctx, o: Outcome) -> None:
        write(c.p("r.py"), FLAKY_REWARD)
        d = c.runs / "nf"
        argv = c.train(
            name="nf", steps="3", rewards=FLAKY, extra=["--set", "checkpoint.interval=1"]
        )
        bad = {"BAD_AFTER": str(d / "checkpoints" / "1"), "BAD_MODE": mode, "BAD_VALUE": value}
        run = c.run(argv, bad, TRAIN_TIMEOUT)
        o.take(run)
        judge_into(o, run, "train", (2,), ("step 2", "r.py:flaky"))
        st = read_json(d / "status.json")
        if (
            not isinstance(st, dict)
            or st.get("phase") != "failed"
            or "r.py:flaky" not in str(st.get("error"))
        ):
            o.lost.append(
                f"status.json after the stop: {st!r:.200}, expected failed naming the reward"
            )
        ck = sorted(os.listdir(d / "checkpoints")) if (d / "checkpoints").is_dir() else []
        if ck != ["1"]:
            o.lost.append(f"checkpoints {ck} after the stop, expected the finite 1 alone")
        steps, _ = metrics_steps(d)
        if steps != [1]:
            o.lost.append(f"metrics steps {steps} after the stop at step 2, expected [1]")
        again = c.run(["resume", "nf", "--runs-dir", str(c.runs)], None, TRAIN_TIMEOUT)
        judge_into(o, again, "resume (reward fixed)", (0,))
        o.lost += check_completed(d, 3)

    return runner


@hook("runner")
def extend_twice(c: Ctx, o: Outcome) -> None:
    """resume --steps writes spec.yaml; a later plain resume reads it back."""
    copy_store(c)
    run = c.run(["resume", "good", "--runs-dir", str(c.runs), "--steps", "3"], None, TRAIN_TIMEOUT)
    o.take(run)
    judge_into(o, run, "resume --steps 3", (0,))
    (c.runs / "good" / "status.json").write_text(
        (c.runs / "good" / "status.json").read_text().replace('"completed"', '"interrupted"')
    )
    again = c.run(["resume", "good", "--runs-dir", str(c.runs)], None, TRAIN_TIMEOUT)
    judge_into(o, again, "resume", (0,))
    o.lost += check_completed(c.runs / "good", 3)


@hook("runner")
def stale_then_recover(c: Ctx, o: Outcome) -> None:
    """dmg stale with both checkpoints set aside: status says so and names --recover;
    a plain resume is refused (exit 4); resume --recover completes it."""
    stale_aside(c)
    shown = c.run(["status", "dmg", "--runs-dir", str(c.runs), "-o", "json"])
    o.take(shown)
    judge_into(o, shown, "status", (0,))
    info = read_json_text(shown.out)
    error = str(info.get("error")) if isinstance(info, dict) else ""
    if "damaged" not in error or "--recover" not in error:
        o.unclear.append(f"a stale run with its checkpoints set aside shows {error!r:.200}")
    refused = c.run(["resume", "dmg", "--runs-dir", str(c.runs)], None, TRAIN_TIMEOUT)
    judge_into(o, refused, "resume", (4,), ("no intact checkpoint",))
    fixed = c.run(["resume", "dmg", "--runs-dir", str(c.runs), "--recover"], None, TRAIN_TIMEOUT)
    judge_into(o, fixed, "resume --recover (the command status gave)", (0,))
    o.lost += check_completed(c.runs / "dmg", 3)


@hook("runner", factory=True)
def silent_endpoint(argv: ArgvOf) -> Runner:
    """``argv`` against a Cloud Storage endpoint that accepts and never answers: exit
    7 naming it, within 10 s."""

    def runner(c: Ctx, o: Outcome) -> None:
        with socket.socket() as silent:
            silent.bind(("127.0.0.1", 0))
            silent.listen(8)
            url = f"http://127.0.0.1:{silent.getsockname()[1]}"
            run = c.run(argv(c), {"STORAGE_EMULATOR_HOST": url})
        o.take(run)
        judge_into(o, run, "silent endpoint", (7,), (url, "no answer in time"))
        o.unclear += within(10)(c, run)

    return runner
