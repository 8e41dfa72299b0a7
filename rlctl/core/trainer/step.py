"""One optimizer step on a rollout's ``Batch``: the jitted update over prefix-shared
forwards, and the ``StepMetrics`` row it yields.

The update is built once per run (``Update.create``) and compiled once per batch
shape; which optional log-probs the batch carries is fixed for the whole run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlctl.core.config.models import RunSpec, TrainingSpec
from rlctl.core.trainer.loss import LossConfig, policy_loss
from rlctl.core.trainer.rollout import Batch, Scores


def make_optimizer(model: Any, t: TrainingSpec) -> Any:
    """AdamW behind global-norm clipping, with an optional linear warmup."""
    import optax
    from flax import nnx

    lr: Any = t.learning_rate
    if t.warmup_steps:
        lr = optax.linear_schedule(0.0, t.learning_rate, t.warmup_steps)
    tx = optax.chain(
        optax.clip_by_global_norm(t.max_grad_norm),
        optax.adamw(lr, b1=0.9, b2=0.99, weight_decay=t.weight_decay),
    )
    return nnx.Optimizer(model, tx, wrt=nnx.Param)


def loss_config(spec: RunSpec) -> LossConfig:
    t = spec.training
    return LossConfig(
        algorithm=spec.algorithm,
        epsilon=t.epsilon,
        epsilon_high=t.epsilon_high,
        beta=t.beta,
        kl_estimator=t.kl_estimator,
        aggregation=t.loss_aggregation,
    )


@dataclass(frozen=True)
class Update:
    """The run's jitted functions; a field each so a benchmark can swap the update."""

    train_step: Callable[..., Any]  # (model, optimizer, batch) -> (loss, aux, grad norm)
    logps: Callable[..., Any]  # (model, prompt_ids, completion_ids) -> per-token log-probs

    @classmethod
    def create(cls, spec: RunSpec, pad_id: int, info: Any) -> Update:
        import optax
        from flax import nnx

        from rlctl.core.trainer import tunix_adapter as ta

        cfg = loss_config(spec)
        r = spec.rollout

        def logps_fn(model, prompt_ids, completion_ids):
            return ta.shared_prefix_logps(
                model, prompt_ids, completion_ids, group=r.num_generations,
                pad_id=pad_id, temperature=r.temperature, info=info,
            )

        # Donating model and optimizer lets XLA update parameters and Adam moments in
        # place instead of holding old and new copies (~1.6 GB less for SmolLM2-135M).
        @nnx.jit(donate_argnums=(0, 1))
        def train_step(model, optimizer, batch: Batch):
            def loss_fn(m):
                logps, entropy = logps_fn(m, batch.prompt_ids, batch.completion_ids)
                loss, aux = policy_loss(
                    logps, batch.mask, batch.advantages, cfg,
                    old_logps=batch.old_logps, ref_logps=batch.ref_logps,
                )
                return loss, {**aux, "entropy": entropy}

            (loss, aux), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
            optimizer.update(model, grads)
            return loss, aux, optax.global_norm(grads)

        @nnx.jit
        def logps(model, prompt_ids, completion_ids):
            return logps_fn(model, prompt_ids, completion_ids)[0]

        return cls(train_step=train_step, logps=logps)

    def apply(self, model: Any, optimizer: Any, ref_model: Any, batch: Batch,
              iterations: int) -> tuple[list[float], list[float], dict[str, Any]]:
        """``iterations`` updates on ``batch``: their losses, gradient norms, and the
        last one's auxiliary figures (kl, entropy, clip fraction)."""
        if ref_model is not None:
            batch = dataclasses.replace(
                batch, ref_logps=self.logps(ref_model, batch.prompt_ids, batch.completion_ids))
        if iterations > 1:  # the rollout policy, frozen for all iterations
            batch = dataclasses.replace(
                batch, old_logps=self.logps(model, batch.prompt_ids, batch.completion_ids))
        losses, norms, auxes = [], [], []
        for _ in range(iterations):
            loss, aux, gnorm = self.train_step(model, optimizer, batch)
            losses.append(float(loss))
            norms.append(float(gnorm))
            auxes.append(aux)
        return losses, norms, auxes[-1]


@dataclass(frozen=True)
class StepMetrics:
    """One row of metrics.jsonl (the field order is the row's key order)."""

    step: int  # 1-based: the number of steps done
    loss: float
    reward_mean: float
    reward_min: float
    reward_max: float
    reward_std: float
    accuracy: float
    format_rate: float
    kl: float
    entropy: float
    clip_fraction: float
    grad_norm: float
    completion_length: float
    completion_tokens: int
    step_seconds: float
    rollout_seconds: float
    tokens_per_s: float

    @classmethod
    def measure(cls, step: int, losses: list[float], norms: list[float],
                aux: dict[str, Any], scores: Scores, mask: np.ndarray, elapsed: float,
                rollout_seconds: float) -> StepMetrics:
        comp_tokens = int(mask.sum())
        rewards = scores.reward
        return cls(
            step=step,
            loss=float(np.mean(losses)),
            reward_mean=float(rewards.mean()),
            reward_min=float(rewards.min()),
            reward_max=float(rewards.max()),
            reward_std=float(rewards.std()),
            accuracy=float(scores.correct.mean()),
            format_rate=float(scores.formatted.mean()),
            kl=float(aux["kl"]),
            entropy=float(aux["entropy"]),
            clip_fraction=float(aux["clip_fraction"]),
            grad_norm=float(np.mean(norms)),
            completion_length=float(mask.sum(axis=1).mean()),
            completion_tokens=comp_tokens,
            step_seconds=round(elapsed, 3),
            rollout_seconds=round(rollout_seconds, 3),
            tokens_per_s=round(comp_tokens / elapsed, 2) if elapsed else 0.0,
        )

    def row(self) -> dict[str, Any]:
        """The metrics.jsonl row, and the ``metrics`` of the progress ``step`` event."""
        return dataclasses.asdict(self)
