"""Multi-host overhead: the same run on one JAX process vs N processes joined over
127.0.0.1 (CPU, the tiny test model), the pod entrypoint both times.

Prints the median step and rollout time of each (compile steps dropped) and their
ratio to one process, with the sampler on whole weights (the default across hosts)
and on the model's FSDP shards. On
one machine the N processes share its cores and talk over loopback (gloo), so
the ratio is what sharding + collectives cost here, not a multi-host speed-up.

    python -m bench.bench_distributed [--processes 2] [--steps 6]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from importlib.util import find_spec
from pathlib import Path

if __name__ == "__main__" and find_spec("bench") is None:  # by path: bench/_by_path.py
    import _by_path

    _by_path.rerun_as_module(__file__)

from tests.fakes.jax_processes import finish, new_run, start


def _make_run(root: Path, name: str, model: Path, steps: int, *extra: str) -> Path:
    return new_run(
        root,
        name,
        model,
        "eval.size=0",
        "training.prompts_per_step=2",
        "rollout.num_generations=8",
        "rollout.max_new_tokens=32",
        f"training.steps={steps}",
        f"checkpoint.interval={steps}",
        *extra,
    )


def _run(run: Path, processes: int) -> tuple[float, float]:
    """Median (step, rollout) seconds, the first two (compiling) steps dropped."""
    finish(start(run, processes))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return (
        statistics.median(r["step_seconds"] for r in rows[2:]),
        statistics.median(r["rollout_seconds"] for r in rows[2:]),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    from tests.fakes.tiny_model import write_tiny_llama

    n = args.processes
    with tempfile.TemporaryDirectory() as tmp:
        model = write_tiny_llama(Path(tmp) / "model", layers=4, hidden=128, ffn=256)
        runs = Path(tmp) / "runs"
        results = {
            "1 process": _run(_make_run(runs, "one", model, args.steps), 1),
            f"{n} processes, sampler on whole weights (default)": _run(
                _make_run(runs, "whole", model, args.steps), n
            ),
            f"{n} processes, sampler on FSDP shards": _run(
                _make_run(runs, "sharded", model, args.steps, "rollout.sampler_weights=sharded"), n
            ),
        }
    base_step, base_roll = results["1 process"]
    print("median after 2 compile steps; ratios against 1 process")
    for label, (step, roll) in results.items():
        print(
            f"{label:<48} step {step:.3f} s ({step / base_step:.2f}x)  "
            f"rollout {roll:.3f} s ({roll / base_roll:.2f}x)"
        )


if __name__ == "__main__":
    main()
