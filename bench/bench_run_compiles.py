"""Whole-run time and XLA compile time of the default local run, against a baseline.

A compiled step is worth nothing if the run stops to compile again and again, so
this bench times whole runs, not the best step. It runs ``rlctl train grpo`` (the
README's default run unless told otherwise) in a subprocess with a JAX monitoring
listener, and prints for each run: wall seconds, each step's seconds, the
largest step after the first as a multiple of the median step, and the number and
seconds of XLA compilations (and persistent-cache hits).

Runs, in one invocation:
  baseline  the checkout at ``--baseline-rev`` (a git worktree), when given
  cold      this checkout, with an empty compilation cache
  warm      this checkout again, same cache: what a second run or a resume pays

    python -m bench.bench_run_compiles --baseline-rev 2ae84ea
    python -m bench.bench_run_compiles --steps 6 --eval-size 0 --set rollout.max_new_tokens=16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Runs inside the measured process: counts compilations until the process exits.
_PROBE = r"""
import atexit, json, os, runpy, sys
import jax.monitoring as mon
seen = {"compiles": 0, "compile_s": 0.0, "cache_hits": 0}
def on_duration(event, duration, **kw):
    if event == "/jax/core/compile/backend_compile_duration":
        seen["compiles"] += 1
        seen["compile_s"] += duration
def on_event(event, **kw):
    if event == "/jax/compilation_cache/cache_hits":
        seen["cache_hits"] += 1
mon.register_event_duration_secs_listener(on_duration)
mon.register_event_listener(on_event)
import resource
def dump():
    seen["peak_rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    open(os.environ["BENCH_OUT"], "w").write(json.dumps(seen))
atexit.register(dump)
sys.argv = ["rlctl", *json.loads(os.environ["BENCH_ARGS"])]
runpy.run_module("rlctl", run_name="__main__")
"""


def run_once(repo: Path, args: list[str], cache: Path, label: str) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"bench-{label}-"))
    out = work / "compiles.json"
    name = f"bench-{label}"
    env = {
        **os.environ,
        "PYTHONPATH": str(repo),
        "RLCTL_CACHE": str(cache),
        "BENCH_OUT": str(out),
        "BENCH_ARGS": json.dumps(["train", "grpo", "--runs-dir", str(work), "--name", name, *args]),
    }
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=repo, env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{label}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    rows = [json.loads(line) for line in (work / name / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step_seconds"] for r in rows]
    compiles = json.loads(out.read_text()) if out.exists() else {}
    median = statistics.median(steps)
    evals = {}
    for which in ("baseline", "final"):
        f = work / name / "eval" / f"{which}.json"
        if f.exists():
            evals[f"{which}_accuracy"] = json.loads(f.read_text())["accuracy"]
    return {
        "label": label,
        "wall_s": round(wall, 1),
        "steps": steps,
        **evals,
        "median_step_s": round(median, 2),
        "worst_after_first_x_median": round(max(steps[1:], default=0) / median, 2),
        "first_step_s": steps[0],
        **compiles,
    }


def worktree(rev: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix="bench-baseline-")) / "repo"
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), rev],
        check=True,
        capture_output=True,
    )
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline-rev", help="git revision to run first as the baseline")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--eval-size", type=int, default=64)
    p.add_argument("--set", action="append", default=[], help="extra --set for every run")
    p.add_argument("--json", action="store_true", help="print the results as JSON only")
    a = p.parse_args()
    args = ["--steps", str(a.steps), "--eval-size", str(a.eval_size)]
    for s in a.set:
        args += ["--set", s]
    results = []
    if a.baseline_rev:
        base = worktree(a.baseline_rev)
        try:
            results.append(run_once(base, args, Path(tempfile.mkdtemp()), "baseline"))
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)],
                capture_output=True,
            )
    cache = Path(tempfile.mkdtemp(prefix="bench-cache-"))
    results.append(run_once(REPO, args, cache, "cold"))
    results.append(run_once(REPO, args, cache, "warm"))
    if a.json:
        print(json.dumps(results, indent=1))
        return
    ref = results[0]
    print(
        f"{'run':9} {'wall s':>7} {'x ref':>6} {'step1 s':>8} {'median s':>9} "
        f"{'worst/med':>9} {'compiles':>8} {'compile s':>9} {'cache hits':>10} "
        f"{'peak GB':>8} {'accuracy':>11}"
    )
    for r in results:
        acc = (
            f"{r['baseline_accuracy']:.2f}->{r['final_accuracy']:.2f}"
            if "final_accuracy" in r
            else "-"
        )
        print(
            f"{r['label']:9} {r['wall_s']:7.1f} {r['wall_s'] / ref['wall_s']:6.2f} "
            f"{r['first_step_s']:8.1f} {r['median_step_s']:9.2f} "
            f"{r['worst_after_first_x_median']:9.2f} {r.get('compiles', 0):8d} "
            f"{r.get('compile_s', 0.0):9.1f} {r.get('cache_hits', 0):10d} "
            f"{r.get('peak_rss_gb', 0):8.2f} {acc:>11}"
        )
    for r in results:
        print(f"{r['label']} steps (s): {' '.join(f'{s:.1f}' for s in r['steps'])}")


if __name__ == "__main__":
    main()
