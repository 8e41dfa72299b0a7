"""Step time and throughput of the default local configuration, against a baseline.

Runs N training steps of the default spec (SmolLM2-135M, 2 prompts x 8 samples,
48 new tokens) twice in this process: once with rlctl's prefix-shared update and
once with the baseline update (Tunix's ``grpo_loss_fn`` over full prompt+completion
sequences, i.e. what a plain Tunix GRPO loop does). Same rollouts, same seeds.
Prints seconds per step, completion tokens/s and the ratio to the baseline.
``--against no-remat`` makes the baseline rlctl's own update without layer
recomputation (``training.remat=false``: micro-batches where the whole batch does
not fit) instead.

    python -m bench.bench_train_step --steps 4
    python -m bench.bench_train_step --steps 5 --against no-remat
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import time
from importlib.util import find_spec

if __name__ == "__main__" and find_spec("bench") is None:  # by path: bench/_by_path.py
    import _by_path

    _by_path.rerun_as_module(__file__)


def run(steps: int, baseline: bool, remat: bool | None = None) -> dict:
    import numpy as np

    from rlctl.core.config.models import RunSpec
    from rlctl.core.store.local import LocalRunStore
    from rlctl.core.trainer.run.loop import Trainer
    from rlctl.core.trainer.run.metrics import MetricsWriter
    from tests.core.trainer import yardsticks

    spec = RunSpec(
        name="bench",
        output={"root": tempfile.mkdtemp(), "tensorboard": False},
        eval={"size": 0},
        training={"remat": remat},
    )
    run_dir = LocalRunStore(spec.output.root).run("bench")
    t = Trainer(spec, run_dir)
    t.create_model()
    t.create_data()
    t.create_optimizer()
    t.create_steps()
    t.metrics = MetricsWriter(run_dir, tensorboard=False)
    if baseline:  # swap in Tunix's full-sequence loss for the update
        import optax
        from flax import nnx

        cfg = yardsticks.algo_config(
            algorithm="grpo",
            beta=0.0,
            epsilon=0.2,
            epsilon_high=0.2,
            kl_estimator="k3",
            loss_aggregation="sequence-mean-token-mean",
            temperature=1.0,
        )
        pad, eos, G = t.tokenizer.pad_id(), t.tokenizer.eos_id(), 8

        @nnx.jit
        def step(model, optimizer, batch):
            ex = yardsticks.train_example(
                jnp_repeat(batch.prompt_ids, G),
                batch.completion_ids,
                batch.mask,
                batch.advantages,
                pad,
            )
            (loss, aux), grads = nnx.value_and_grad(
                lambda m: yardsticks.policy_loss(m, ex, cfg, pad, eos), has_aux=True
            )(model)
            optimizer.update(model, grads)
            return (
                loss,
                {"kl": aux["kl"], "entropy": aux["entropy"], "clip_fraction": aux["pg_clipfrac"]},
                optax.global_norm(grads),
            )

        def jnp_repeat(x, g):
            import jax.numpy as jnp

            return jnp.repeat(x, g, axis=0)

        t.update.train_step = step  # Update.apply calls it for each iteration
    rows = [t.step(i) for i in range(steps)]
    warm = rows[1:] if len(rows) > 1 else rows  # the first step compiles
    return {
        "step_seconds": statistics.mean(r.step_seconds for r in warm),
        "update_seconds": statistics.mean(r.step_seconds - r.rollout_seconds for r in warm),
        "rollout_seconds": statistics.mean(r.rollout_seconds for r in warm),
        "tokens_per_s": statistics.mean(r.tokens_per_s for r in warm),
        "reward_mean": float(np.mean([r.reward_mean for r in rows])),
        # ru_maxrss is the process high-water mark: only the first run's figure is its own
        "process_peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument(
        "--against",
        choices=["tunix", "no-remat"],
        default="tunix",
        help="the baseline: Tunix's full-sequence loss, or rlctl without remat",
    )
    args = ap.parse_args()
    t0 = time.perf_counter()
    ours = run(args.steps, baseline=False)
    if args.against == "tunix":
        base, name = run(args.steps, baseline=True), "baseline_tunix_full_sequence"
    else:
        base, name = run(args.steps, baseline=False, remat=False), "baseline_no_remat"
    out = {
        "rlctl": ours,
        name: base,
        "update_speedup": base["update_seconds"] / ours["update_seconds"],
        "step_speedup": base["step_seconds"] / ours["step_seconds"],
        "wall_seconds": time.perf_counter() - t0,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
