"""The generator process of a ``rollout.placement=process`` run.

    python -m rlctl.core.trainer.run.generate --root RUNS_DIR --name RUN [--pod]

Started by the learner on its own machine (``rollout/generator_process.py``), or, with
``--pod``, as the generator pods of a cluster workload. It sets up the run's model,
tokenizer, data and rewards as the trainer does (``loop.Trainer``'s own steps, on this
process's devices), then serves the learner's requests in order: load the version a
request names (``exchange.load_flat``), sample the step with the step's seed, score
it, and write the trajectory (``exchange.Exchange.answer``). A reward's error is
written back for the learner to raise; anything else ends the process, and the
learner (or, for a pod, its Job) starts another.

A local generator stops when the learner says so, when another attempt of the run
began, or when the learner is gone. A pod has no parent to watch and may start
before its learner: it waits for an attempt, follows a new one (a learner pod
restarted), and stops only when the attempt it served is over; its lines also go to
the run store's ``generator.log`` (``rlctl logs RUN --generator``).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import numpy as np

from rlctl.core.store.base import GENERATOR_LOG as LOG
from rlctl.core.trainer.rollout.exchange import Trajectory


class _Say:
    """The generator's lines: on stdout (the learner's ``generator.log`` for a local
    generator, the pod's log for a pod) and, for a pod, appended to the run store's
    ``generator.log`` in ``train.log``'s form (a UTC time, two spaces, the line),
    uploaded with each trajectory."""

    def __init__(self) -> None:
        self.run: Any = None  # set by ``keep``: a pod's run, whose store keeps the lines
        self.path: Any = None

    def keep(self, run: Any) -> None:
        from pathlib import Path

        run.pull(LOG)  # a gs:// store: continue what earlier pods wrote
        self.run, self.path = run, Path(run.path_for(LOG))

    def __call__(self, line: str) -> None:
        import datetime as dt

        print(f"generator: {line}", flush=True)
        if self.path is not None:
            stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(f"{stamp}  {line}\n")

    def upload(self) -> None:
        if self.run is not None:
            self.run.push(LOG)

    def event(self, event: dict[str, Any]) -> None:
        if event.get("event") == "message":
            self(event["message"])


say = _Say()


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
    trainer = Trainer(spec, run, progress=say.event)
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


def serve(trainer: Any, parent: int | None) -> int:
    """Answer the learner's requests until its attempt is over. ``parent`` is the
    learner's pid for a local generator, None for a pod (``--pod``)."""
    import time

    from rlctl.core.errors import ConfigError
    from rlctl.core.trainer.rollout.exchange import Exchange, load_flat

    exchange = Exchange(trainer.run)
    attempt = exchange.attempt()
    live = False  # a pod: whether it saw this attempt before it was over
    loaded: int | None = None
    while True:
        now = exchange.attempt()
        if parent is not None:
            if exchange.stopped() is not None or now != attempt or os.getppid() != parent:
                return 0
        else:
            if now != attempt:  # the learner (re)started: follow its new attempt
                attempt, live, loaded = now, False, None
                if now is not None:
                    say(f"serving attempt {now[:8]}")
            over = attempt is None or exchange.stopped() == attempt
            if over and live:
                say("the learner is done: stopping")
                say.upload()
                return 0
            if over:  # none yet, or one that ended before this pod came: wait for the next
                time.sleep(exchange.poll)
                continue
            live = True
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
            t0 = time.perf_counter()
            try:
                trajectory = sample(trainer, request["step"])
            except ConfigError as e:
                exchange.refuse(request, e.message, e.hint)
                say(f"step {request['step'] + 1}: refused: {e.message}")
                say.upload()
                continue
            exchange.answer(request, trajectory)
            say(
                f"step {request['step'] + 1} sampled from version {version} in "
                f"{time.perf_counter() - t0:.1f} s"
            )
            say.upload()
        if not pending:
            time.sleep(exchange.poll)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlctl.core.trainer.run.generate")
    parser.add_argument("--root", required=True, help="the run store's root")
    parser.add_argument("--name", required=True, help="the run's name")
    parser.add_argument(
        "--pod", action="store_true", help="a cluster's generator pod (no learner to watch)"
    )
    args = parser.parse_args(argv)
    parent = None if args.pod else os.getppid()
    from rlctl.core.errors import RlctlError

    try:
        if args.pod:
            from rlctl.core.store import open_store

            say.keep(open_store(args.root).existing(args.name))
        trainer = setup(args.root, args.name)
    except RlctlError as e:  # the run's own problem: the pod's Job does not retry it
        print(f"error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    say(f"ready (pid {os.getpid()})")
    say.upload()
    return serve(trainer, parent)


if __name__ == "__main__":
    sys.exit(main())
