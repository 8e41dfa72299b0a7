"""Where the default run's peak memory goes, phase by phase.

Runs ``rlctl train grpo`` in this process (the README's default run, fewer steps
and eval prompts unless told otherwise) with a thread sampling the resident set
every 10 ms, and prints, per phase: the resident memory when it starts, the most
it reaches, and what JAX holds in arrays at that point (weights and Adam moments);
for the update also XLA's own analysis of its temporaries. The rows show which
part of the peak is the training state, which the update's working memory, and
which the runtime (Python, JAX/XLA, compiled programs, the allocator's slack).

    python bench/bench_memory_breakdown.py                 # 3 steps, 16 eval prompts
    python bench/bench_memory_breakdown.py --steps 20 --eval-size 64
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


class Watch:
    """The resident set's maximum since the last ``reset``, sampled every 10 ms."""

    def __init__(self) -> None:
        self.peak = 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            self.peak = max(self.peak, rss())
            time.sleep(0.01)

    def reset(self) -> int:
        now = rss()
        self.peak = now
        return now


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--eval-size", type=int, default=16)
    p.add_argument("--set", action="append", default=[], help="extra --set")
    p.add_argument("--every", action="store_true", help="also one row per call")
    a = p.parse_args()

    t0 = rss()
    watch = Watch()
    import tempfile

    import jax

    from rlctl.cli.app import main as rlctl
    from rlctl.core.trainer import checkpointing, rollout, step, tunix_adapter  # noqa: F401

    rows: list[tuple[str, int, int, int, int]] = [
        ("python + rlctl + JAX imported", t0, rss(), 0, 0)
    ]

    def arrays() -> int:
        return sum(x.nbytes for x in jax.live_arrays())

    def wrap(cls: type, name: str, label: str, temp_of=None) -> None:
        f = getattr(cls, name)

        def g(self, *args, **kw):
            start = watch.reset()
            held = arrays()
            out = f(self, *args, **kw)
            temp = temp_of(self) if temp_of else 0
            rows.append((label, start, watch.peak, held, temp))
            return out

        setattr(cls, name, g)

    def update_temp(u) -> int:
        return max(
            (c.memory_analysis().temp_size_in_bytes for c, _ in u._compiled.values()), default=0
        )

    wrap(rollout.Rollout, "sample", "rollout (sampler)")
    wrap(step.Update, "apply", "update", update_temp)
    wrap(checkpointing.Checkpoints, "save", "checkpoint save")
    with tempfile.TemporaryDirectory() as root:
        sys.argv = [
            "rlctl",
            "train",
            "grpo",
            "--runs-dir",
            root,
            "--name",
            "breakdown",
            "--steps",
            str(a.steps),
            "--eval-size",
            str(a.eval_size),
            *[x for s in a.set for x in ("--set", s)],
        ]
        try:
            rlctl()
        except SystemExit as e:
            if e.code:
                raise
    gb = 1e9
    print(
        f"{'phase':34} {'n':>3} {'start GB':>9} {'peak GB':>8} {'arrays GB':>10} "
        f"{'XLA temp GB':>12}"
    )
    seen: dict[str, list] = {}
    for label, start, peak, held, temp in rows:
        seen.setdefault(label, []).append((start, peak, held, temp))
    for label, xs in seen.items():
        start = xs[-1][0] if len(xs) > 1 else xs[0][0]
        peak = max(x[1] for x in xs)
        print(
            f"{label:34} {len(xs):3} {start / gb:9.2f} {peak / gb:8.2f} "
            f"{max(x[2] for x in xs) / gb:10.2f} {max(x[3] for x in xs) / gb:12.2f}"
        )
    if a.every:
        for label, start, peak, held, _temp in rows:
            print(f"  {label:32} {start / gb:9.2f} {peak / gb:8.2f} {held / gb:10.2f}")
    print(f"peak of the whole run: {max(r[2] for r in rows) / gb:.2f} GB")


if __name__ == "__main__":
    main()
