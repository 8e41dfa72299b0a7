"""Kill a tiny training run at random moments, resume it, and compare with a run that
was never interrupted (issue #16's acceptance: 20 SIGKILLs and 20 SIGTERMs).

Each trial starts ``rlctl train`` as its own process, sends SIGKILL or SIGTERM at a
moment drawn uniformly over the uninterrupted run's wall time (model load, baseline
eval, steps, saves, final eval), then checks ``rlctl status`` (a dead process must
never show as ``running``) and runs ``rlctl resume`` until the run completes. A
trial passes when its metrics equal the uninterrupted run's: same steps, every value
within 1e-4 relative. A kill before the run's spec.yaml was written leaves no run: that
trial trains again under the same name (nothing existed to lose).

    .venv/bin/python -m bench.kill_resume [--kills 20] [--terms 20] [--seed 0]

Prints one line per trial and a table; exit 1 if any trial lost or changed data.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from importlib.util import find_spec
from pathlib import Path

if __name__ == "__main__" and find_spec("bench") is None:  # by path: bench/_by_path.py
    import _by_path

    _by_path.rerun_as_module(__file__)

REPO = Path(__file__).resolve().parents[1]
TIMING = {"step_seconds", "rollout_seconds", "tokens_per_s"}


def rlctl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlctl", *args], env=env, capture_output=True, text=True, timeout=900
    )


def metrics(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def close(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-7)
    return a == b


def same(a: list[dict], b: list[dict]) -> bool:
    return [r["step"] for r in a] == [r["step"] for r in b] and all(
        r.keys() == s.keys() and all(close(r[k], s[k]) for k in r) for r, s in zip(a, b)
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--terms", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=6)
    opts = ap.parse_args()

    from tests.fakes.tiny_model import write_tiny_llama

    work = Path(tempfile.mkdtemp(prefix="rlctl-kill-"))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    model = write_tiny_llama(work / "model")
    data = work / "train.jsonl"
    data.write_text(
        "".join(
            json.dumps({"question": f"What is {a} + 1?", "answer": a + 1}) + "\n" for a in range(16)
        )
    )

    def train_args(root: Path, name: str) -> list[str]:
        return [
            "train",
            "grpo",
            "--name",
            name,
            "--runs-dir",
            str(root),
            "--model",
            str(model),
            "--dataset",
            "jsonl",
            "--data-path",
            str(data),
            "--prompts-per-step",
            "1",
            "-G",
            "2",
            "--max-new-tokens",
            "6",
            "--eval-size",
            "2",
            "--lr",
            "3e-3",
            "--steps",
            str(opts.steps),
            "--set",
            "checkpoint.interval=2",
            "--set",
            "eval.batch_size=2",
            "--set",
            'rewards=["tests.fakes.rewards.digit_count"]',
        ]

    t0 = time.monotonic()
    r = rlctl(*train_args(work / "whole", "whole"), env=env)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        print(r.stderr, file=sys.stderr)
        return 1
    whole = metrics(work / "whole" / "whole")
    print(f"uninterrupted run: {wall:.1f} s, {len(whole)} steps")

    rng = random.Random(opts.seed)
    trials = [signal.SIGKILL] * opts.kills + [signal.SIGTERM] * opts.terms
    rng.shuffle(trials)
    results: dict[str, dict[str, int]] = {}
    failures = []
    for i, sig in enumerate(trials, 1):
        root = work / f"t{i}"
        at = rng.uniform(0.2, wall)
        p = subprocess.Popen(
            [sys.executable, "-m", "rlctl", *train_args(root, "k")],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(at)
        p.send_signal(sig)
        _, err = p.communicate(timeout=300)
        run = root / "k"
        notes = []
        if "Traceback" in err:
            notes.append("traceback")
        late = False
        if sig == signal.SIGTERM and p.returncode not in (0, 130):
            st = (
                json.loads((run / "status.json").read_text())
                if (run / "status.json").exists()
                else {}
            )
            # after the run completed and the handler was gone: the default action
            late = p.returncode == -signal.SIGTERM and st.get("phase") == "completed"
            if not late:
                notes.append(f"SIGTERM exit {p.returncode}")
        phase = "-"
        resumes = 0
        if not (run / "spec.yaml").exists():
            phase = "no run yet"
            shutil.rmtree(root, ignore_errors=True)
            rr = rlctl(*train_args(root, "k"), env=env)
            if rr.returncode != 0:
                notes.append(f"train again exit {rr.returncode}")
        else:
            st = rlctl("status", "k", "--runs-dir", str(root), "-o", "json", env=env)
            phase = (
                json.loads(st.stdout)["phase"] if st.returncode == 0 else f"exit {st.returncode}"
            )
            if phase == "running":
                notes.append("status says running for a dead process")
            while phase != "completed" and resumes < 3:
                rr = rlctl("resume", "k", "--runs-dir", str(root), env=env)
                resumes += 1
                if "Traceback" in rr.stderr:
                    notes.append("resume traceback")
                if rr.returncode == 0:
                    break
                notes.append(f"resume exit {rr.returncode}: {rr.stderr.strip()[-120:]}")
        ok = (run / "metrics.jsonl").exists() and same(metrics(run), whole)
        if not ok:
            notes.append("metrics differ from the uninterrupted run")
        name = signal.Signals(sig).name
        row = results.setdefault(
            name, {"trials": 0, "equal": 0, "shown running": 0, "tracebacks": 0}
        )
        row["trials"] += 1
        row["equal"] += ok and not [n for n in notes if "exit" in n]
        row["shown running"] += phase == "running"
        row["tracebacks"] += any("traceback" in n for n in notes)
        verdict = "; ".join(notes) or "ok"
        if late:
            verdict += " (the signal came after the run completed: default action, -15)"
        print(
            f"{i:3d} {name:7s} at {at:5.1f} s  status after: {phase:12s} resumes {resumes}  "
            f"{verdict}",
            flush=True,
        )
        if notes:
            failures.append(i)
        shutil.rmtree(root, ignore_errors=True)

    print(
        f"\n{'signal':8s} {'trials':>6s} {'equal metrics':>14s} {'shown running':>14s} "
        f"{'tracebacks':>10s}"
    )
    for name, row in sorted(results.items()):
        print(
            f"{name:8s} {row['trials']:6d} {row['equal']:14d} {row['shown running']:14d} "
            f"{row['tracebacks']:10d}"
        )
    print(f"total wall {time.monotonic() - t0:.0f} s; trials with a problem: {failures or 'none'}")
    shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
