"""Peak memory of a resumed run against a fresh one, on the default model (#45 point 3).

Three runs of ``rlctl train grpo`` (the default model and data, ``eval.size=0`` so that
the evals' own programs do not set the peak), each in its own process with the
compilation cache off, peak RSS from the kernel (``wait4``'s ``ru_maxrss``):

1. fresh: STEPS steps, a checkpoint every STEPS/2;
2. halted: STEPS/2 steps (its last step checkpointed);
3. resumed: ``rlctl resume`` of 2 up to STEPS steps.

It prints the three peaks and resumed / fresh. The test suite bounds the same ratio on
the tiny model (``tests/faults/test_resume_memory.py``), whose state is too small
beside the libraries to show what the default model's does.

    python -m bench.bench_resume_memory                 # 4 steps, about 8 minutes
    python -m bench.bench_resume_memory --steps 6 --json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def peak(args: list[str]) -> int:
    """Run ``rlctl ARGS`` to its end; its peak RSS in bytes."""
    env = {**os.environ, "RLCTL_COMPILE_CACHE": "off", "PYTHONPATH": str(REPO)}
    p = subprocess.Popen(
        [sys.executable, "-m", "rlctl", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, status, usage = os.wait4(p.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        err = p.stderr.read().decode() if p.stderr else ""
        sys.exit(f"rlctl {' '.join(args)} failed:\n{err[-2000:]}")
    return usage.ru_maxrss * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=4, help="steps of the fresh run (even)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    half = max(1, a.steps // 2)
    with tempfile.TemporaryDirectory() as root:
        common = [
            "--runs-dir",
            root,
            "--set",
            "eval.size=0",
            "--set",
            f"checkpoint.interval={half}",
            "--yes",
        ]
        fresh = peak(["train", "grpo", "--name", "fresh", "--steps", str(a.steps), *common])
        halted = peak(["train", "grpo", "--name", "halted", "--steps", str(half), *common])
        resumed = peak(["resume", "halted", "--runs-dir", root, "--steps", str(a.steps)])
    doc = {
        "fresh_bytes": fresh,
        "halted_bytes": halted,
        "resumed_bytes": resumed,
        "resumed_over_fresh": round(resumed / fresh, 3),
    }
    if a.json:
        print(json.dumps(doc))
        return
    gib = 2**30
    print(f"fresh   {a.steps} steps      peak {fresh / gib:.2f} GiB")
    print(f"halted  {half} steps      peak {halted / gib:.2f} GiB")
    print(f"resumed {half} -> {a.steps} steps peak {resumed / gib:.2f} GiB")
    print(f"resumed / fresh = {resumed / fresh:.3f}")


if __name__ == "__main__":
    main()
