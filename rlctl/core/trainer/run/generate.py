"""The generator process of a ``rollout.placement=process`` run.

    python -m rlctl.core.trainer.run.generate --root RUNS_DIR --name RUN

Started by the learner (``rollout/generator_process.py``). It sets up the run's model,
tokenizer, data and rewards as the trainer does (``loop.Trainer``'s own steps, on this
process's devices), then serves the learner's requests in order: load the version a
request names (``exchange.load_flat``), sample the step with the step's seed, score
it, and write the trajectory (``exchange.Exchange.answer``). A reward's error is
written back for the learner to raise; anything else ends the process, and the
learner starts another.

It stops when the learner says so, when another attempt of the run began, or when
the learner is gone.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np

from rlctl.core.trainer.rollout.exchange import Trajectory

POLL = 0.02  # seconds between looks for a request


def _say(event: dict[str, Any]) -> None:
    if event.get("event") == "message":
        print(f"generator: {event['message']}", flush=True)


def setup(root: str, name: str) -> Any:
    """The run's trainer, set up to sample only: its own spec's model and data, one
    process, synchronous (this process is the generator; it pipelines nothing)."""
    from rlctl.core.store import open_store
    from rlctl.core.store.base import SPEC
    from rlctl.core.store.records import read_spec
    from rlctl.core.trainer.run.loop import Trainer

    run = open_store(root).existing(name)
    spec = read_spec(run.read_text(SPEC), f"{run.uri}/{SPEC}")
    spec = spec.model_copy(deep=True)
    spec.rollout.placement = "colocated"
    spec.rollout.max_staleness = 0
    spec.training.beta = 0.0  # no reference model: nothing here computes a loss
    trainer = Trainer(spec, run, progress=_say)
    trainer.create_model()
    trainer.create_data()
    return trainer


def sample(trainer: Any, step: int) -> Trajectory:
    """Step ``step``'s batch sampled and scored by the weights the trainer holds, as
    the arrays the learner rebuilds it from."""
    from rlctl.core.trainer.rollout.rollout import score, step_seed

    s = trainer.spec
    problems = trainer.source.batch(step, s.training.prompts_per_step)
    prompts, width = trainer.rollout.render(problems)
    out = trainer.rollout.sample(prompts, width, seed=step_seed(s.training.seed, step, 4))
    group = [p for p in problems for _ in range(s.rollout.num_generations)]
    scores = score(trainer.reward_fns, out.text, group, out.tokens, trainer._say)
    # what the engine checks of its samples (vLLM: that it sampled the version it was
    # given, against the trainer's log-probs of the same weights, here)
    engine = trainer.rollout.sampler.checks(
        trainer.model, out.prompt_ids, out.completion_ids, out.logps, out.mask(), step + 1
    )
    arrays = {
        "prompt_ids": out.prompt_ids,
        "completion_ids": out.completion_ids,
        "lengths": out.lengths,
        "logps": out.logps,
        "reward": scores.reward,
        "correct": scores.correct,
        "formatted": scores.formatted,
    }
    return Trajectory(
        {k: np.ascontiguousarray(v) for k, v in arrays.items()},
        {"reward_means": scores.reward_means, "engine": engine},
    )


def serve(trainer: Any, parent: int) -> int:
    from rlctl.core.errors import ConfigError
    from rlctl.core.trainer.rollout.exchange import Exchange, load_flat

    exchange = Exchange(trainer.run)
    attempt = exchange.attempt()
    loaded: int | None = None
    while True:
        if exchange.stopped() or exchange.attempt() != attempt or os.getppid() != parent:
            return 0
        pending = exchange.pending()
        for request in pending:
            version = request["version"]
            if version != loaded:
                flat = exchange.weights(version)
                if flat is None:  # not written yet: never asked before it is
                    break
                load_flat(trainer.model, flat)
                trainer.rollout.sync(trainer.model)
                loaded = version
            try:
                trajectory = sample(trainer, request["step"])
            except ConfigError as e:
                exchange.refuse(request, e.message, e.hint)
                continue
            exchange.answer(request, trajectory)
        if not pending:
            time.sleep(POLL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlctl.core.trainer.run.generate")
    parser.add_argument("--root", required=True, help="the run store's root")
    parser.add_argument("--name", required=True, help="the run's name")
    args = parser.parse_args(argv)
    parent = os.getppid()
    trainer = setup(args.root, args.name)
    print(f"generator: ready (pid {os.getpid()})", flush=True)
    return serve(trainer, parent)


if __name__ == "__main__":
    sys.exit(main())
