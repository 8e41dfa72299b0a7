"""A pipelined run's steps: the generator samples and scores ahead, the learner updates.

``rollout.placement=split`` or ``rollout.max_staleness`` >= 1 (docs/async.md). The
generator (``rollout/generator.py``) samples step ``j`` from policy version
``max(start, j - k)`` in a thread of its own (``pipeline.Pipeline``), on its own
devices when split; the learner takes the trajectory, updates, and pushes the new
version's weights to it.

**The importance correction** (``rollout.correction``). With ``k`` >= 1 a batch was
sampled by a policy up to ``k`` updates old.

* ``decoupled`` (the default; AReaL's decoupled PPO objective, Fu et al. 2025): the
  ratio and its clipping are taken against the learner's policy of now (the proximal
  one: with one update per batch the current policy, gradient stopped, as in a
  synchronous run; with several, its log-probs before the first), and each token's
  term is weighted by ``pi_now / pi_sampler``, truncated at 2 (TIS, as verl's rollout
  correction). The trust region is the learner's own, so a lag does not clip updates
  a synchronous run would take; the weight corrects the sampling.
* ``behaviour``: the generator's log-probs are the old policy's, so the ratio
  ``pi_theta / pi_sampler`` is the importance weight and its clipping bounds it
  (PipelineRL's form). It needs no extra pass either, but the clip then bounds the
  sampler's drift as well as the update, and on the default task it learned less than
  the synchronous run (docs/async.md).

Both read the generator's own log-probs of the sampled tokens, which include any
numeric difference between the sampler and the update (bfloat16 sampling), part of
the behaviour too. With ``k`` = 0 the ratio is the synchronous run's (the current
policy, gradient stopped), so its metrics are the synchronous run's exactly.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from rlctl.core.errors import ConfigError
from rlctl.core.trainer.algorithm import finite
from rlctl.core.trainer.rollout.generator import Generator, Push
from rlctl.core.trainer.rollout.rollout import Batch, Samples, Scores, score, step_seed
from rlctl.core.trainer.run.pipeline import Pipeline
from rlctl.core.trainer.runtime import stops
from rlctl.core.trainer.update.step import StepMetrics


@dataclass(frozen=True)
class Trajectory:
    """One step's batch as the generator made it."""

    out: Samples
    scores: Scores
    batch: Batch
    engine: dict[str, float] = dataclasses.field(default_factory=dict)  # its checks


class Pipelined:
    """The generator's side (``produce``) and the learner's (``step``) of one run."""

    def __init__(self, trainer: Any, generator: Any, start: int) -> None:
        """``trainer``: the run's ``loop.Trainer`` (its model, optimizer, update, data
        and rewards; typed loosely, as loop.py imports this module). ``generator``:
        the weights' other home, a ``generator.Generator`` in this process or a
        ``generator_process.GeneratorProcess``, which samples there too."""
        self.t = trainer
        self.spec = trainer.spec
        self.generator = generator
        self.lag = self.spec.rollout.max_staleness
        self.iterations = self.spec.training.num_iterations or 1  # validated: always set
        # the generator renders and samples as the learner's rollout does, on its sampler
        self.rollout = copy.copy(trainer.rollout)
        self.remote = not isinstance(generator, Generator)
        if not self.remote:
            self.rollout.sampler = generator.sampler
        steps = self.spec.training.steps
        self.last_needed = steps - 1 - self.lag  # no step samples a later version
        self.pushed: Push | None = None
        self.pipeline: Pipeline[Trajectory] = Pipeline(
            self.produce, start=start, stop=steps, lag=self.lag, say=trainer._say
        )
        self.push(start)  # the restored (or initial) policy: what was in flight is gone

    def begin(self) -> None:
        self.pipeline.begin()

    def close(self) -> None:
        self.pipeline.close()
        if self.remote:
            self.generator.close()

    def push(self, version: int) -> None:
        """Version ``version`` to the generator, when a later step samples from it."""
        if version > max(self.last_needed, self.pipeline.start):
            self.pushed = None
            return
        self.pushed = self.generator.push(version, self.t.model)
        self.pipeline.publish(version)

    # --- the generator's thread ----------------------------------------------------
    def produce(self, step: int, version: int) -> Trajectory:
        engine: dict[str, float] = {}
        if self.remote:
            out, scores, engine = self._received(step, version)
        else:
            out, scores = self._sampled(step, version)
        batch = self.rollout.batch(out, scores)
        if self.lag and self.spec.rollout.correction == "behaviour":
            # the sampler's log-probs: the ratio's denominator
            batch = dataclasses.replace(batch, old_logps=out.logps)
        elif self.lag:  # decoupled: the ratio against the learner's, weighted
            batch = dataclasses.replace(batch, behaviour_logps=out.logps)
        return Trajectory(out, scores, batch, engine)

    def _received(self, step: int, version: int) -> tuple[Samples, Scores, dict[str, float]]:
        """Sampled and scored by the generator process (``run/generate.py``)."""
        got = self.generator.sample(step, version)
        a = got.arrays
        out = Samples(
            text=[],
            tokens=[],
            prompt_ids=a["prompt_ids"],
            completion_ids=a["completion_ids"],
            lengths=a["lengths"],
            logps=a["logps"],
        )
        scores = Scores(a["reward"], a["correct"], a["formatted"], got.meta["reward_means"])
        return out, scores, got.meta["engine"]

    def _sampled(self, step: int, version: int) -> tuple[Samples, Scores]:
        s = self.spec
        problems = self.t.source.batch(step, s.training.prompts_per_step)
        prompts, width = self.rollout.render(problems)
        self.generator.use(version)
        with self.t.watch("rollout", self.rollout):
            out = self.rollout.sample(prompts, width, seed=step_seed(s.training.seed, step, 4))
        group = [p for p in problems for _ in range(s.rollout.num_generations)]
        try:
            scores = score(self.t.reward_fns, out.text, group, out.tokens, self.t._say)
        except ConfigError as e:
            raise ConfigError(
                f"step {step + 1}: {e.message}: the run stopped before its update",
                hint=f"fix the reward, then "
                f"{finite.resume_hint(self.t.run.name, self.t._latest())}",
            ) from e
        return out, scores

    # --- the learner's ---------------------------------------------------------------
    def step(self, step: int) -> StepMetrics:
        """Update on step ``step``'s trajectory, then push the new version."""
        t0 = time.perf_counter()
        got, figures = self.pipeline.take(step)
        traj = got.item
        if stops.requested() and stops.deferring():  # the model is untouched yet
            raise stops.Abandoned
        with self.t.watch("update", self.t.update):
            losses, norms, aux = self.t.update.apply(
                self.t.model, self.t.optimizer, self.t.ref_model, traj.batch, self.iterations
            )
        finite.check_update(step + 1, losses, norms, self.t.run.name, self.t._latest())
        self.push(step + 1)
        pushed = self.pushed
        return StepMetrics.measure(
            step + 1,
            losses,
            norms,
            aux,
            traj.scores,
            traj.batch.mask,
            elapsed=time.perf_counter() - t0,
            rollout_seconds=got.seconds,
            peak_device_bytes=self.t.device_peak.read(),
            engine_logp_diff=traj.engine.get("engine_logp_diff"),
            weight_push_seconds=pushed.seconds if pushed else None,
            weight_push_bytes=pushed.bytes if pushed else None,
            staleness=figures.staleness,
            dropped_samples=figures.dropped * traj.batch.mask.shape[0],
            generator_restarts=figures.restarts,
            generator_busy=figures.generator_busy,
            learner_busy=figures.learner_busy,
        )
