"""Where the default run's peak memory goes, phase by phase.

Runs ``rlctl train grpo`` in this process (the README's default run, fewer steps
and eval prompts unless told otherwise) with a thread sampling the resident set
every 10 ms, and prints, per phase: the resident memory when it starts, the most
it reaches, and what JAX holds in arrays at that point (weights and Adam moments);
for the update also XLA's own analysis of its temporaries. The rows show which
part of the peak is the training state, which the update's working memory, and
which the runtime (Python, JAX/XLA, compiled programs, the allocator's slack).

    python -m bench.bench_memory_breakdown                 # 3 steps, 16 eval prompts
    python -m bench.bench_memory_breakdown --steps 20 --eval-size 64

Each phase is measured through the trainer's own hook (``api.train(watch=...)``), not
by rebinding its methods; the held-out evals have their own row.
"""

from __future__ import annotations

import argparse
import threading
import time
from importlib.util import find_spec

if __name__ == "__main__" and find_spec("bench") is None:  # by path: bench/_by_path.py
    import _by_path

    _by_path.rerun_as_module(__file__)


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
    import contextlib
    import tempfile

    import jax

    from rlctl.cli._logging import configure_library_logging
    from rlctl.core.config.load import build
    from rlctl.core.config.models import RunSpec
    from rlctl.core.store.local import LocalRunStore
    from rlctl.core.trainer import api

    configure_library_logging(0)  # the libraries' chatter off, as under ``rlctl train``
    api.load_libraries(lambda event: None)
    rows: list[tuple[str, int, int, int, int]] = [
        ("python + rlctl + JAX imported", t0, rss(), 0, 0)
    ]

    def arrays() -> int:
        return sum(x.nbytes for x in jax.live_arrays())

    def update_temp(u) -> int:
        return max(
            (c.memory_analysis().temp_size_in_bytes for c, _ in u._compiled.values()), default=0
        )

    labels = {
        "rollout": "rollout (sampler)",
        "eval": "eval (sampler)",
        "update": "update",
        "checkpoint save": "checkpoint save",
    }

    @contextlib.contextmanager
    def measured(phase: str, doer):
        """The trainer's own hook around each phase (api.train's ``watch``)."""
        start = watch.reset()
        held = arrays()
        yield
        temp = update_temp(doer) if phase == "update" else 0
        rows.append((labels.get(phase, phase), start, watch.peak, held, temp))

    with tempfile.TemporaryDirectory() as root:
        # the README's default run (``rlctl train grpo``), fewer steps and eval prompts
        spec = build(
            RunSpec,
            {
                "name": "breakdown",
                "output": {"root": root},
                "training": {"steps": a.steps},
                "eval": {"size": a.eval_size},
            },
            a.set,
        )
        api.train(
            spec,
            LocalRunStore(root).run("breakdown"),
            progress=None,
            on_status=lambda update: None,
            watch=measured,
        )
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
