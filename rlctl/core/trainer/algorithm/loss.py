"""GRPO / GSPO policy loss as pure JAX functions of per-token log-probs.

Same formulas as Tunix's ``algo_core.grpo_loss_fn`` (``loss_algo`` ``grpo`` and
``gspo-token``), which ``tests/core/trainer/test_loss.py`` checks to float
precision; split from the model call so the trainer can compute log-probs its
own (prefix-shared) way and so the math is testable on hand-made numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np


@dataclass(frozen=True)
class LossConfig:
    algorithm: str  # "grpo" | "gspo"
    epsilon: float
    epsilon_high: float
    beta: float
    kl_estimator: str  # "k1" | "k3"
    aggregation: str  # "token-mean" | "sequence-mean-token-mean" | "sequence-mean-token-sum"


# the decoupled objective's importance weight pi_prox / pi_behaviour is cut at this
# (truncated importance sampling: Yao et al. 2025's TIS and verl's rollout correction
# use 2): one token (or, for GSPO, one sequence) sampled far more rarely than the
# learner would sample it now cannot take over the batch's gradient
IMPORTANCE_CAP = 2.0


def group_advantages(rewards: np.ndarray, num_generations: int) -> np.ndarray:
    """(r - mean(group)) / (std(group, ddof=1) + 1e-6): the GRPO paper's outcome advantage."""
    r = np.asarray(rewards, np.float64).reshape(-1, num_generations)
    mean = r.mean(axis=1, keepdims=True)
    std = r.std(axis=1, ddof=1, keepdims=True)
    return ((r - mean) / (std + 1e-6)).reshape(-1).astype(np.float32)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Norm:
    """The denominators of every mean over a batch: its completion tokens and its rows
    with at least one token.

    A micro-batch divides by the *whole* batch's ``Norm``, so the sum of its
    micro-batches' losses and gradients is the whole batch's, exactly.
    """

    tokens: jax.Array  # float32 scalar, at least 1
    rows: jax.Array  # float32 scalar, at least 1

    @classmethod
    def of(cls, mask: jax.Array) -> Norm:
        m = mask.astype(jnp.float32)
        return cls(
            tokens=jnp.clip(m.sum(), min=1),
            rows=jnp.clip((m.sum(-1) > 0).sum().astype(jnp.float32), min=1),
        )


def aggregate(
    per_token: jax.Array, mask: jax.Array, mode: str, norm: Norm | None = None
) -> jax.Array:
    norm = Norm.of(mask) if norm is None else norm
    mask = mask.astype(jnp.float32)
    per_seq = (per_token * mask).sum(axis=-1)
    counts = mask.sum(axis=-1)
    if mode == "token-mean":
        return per_seq.sum() / norm.tokens
    if mode == "sequence-mean-token-mean":
        return (per_seq / jnp.clip(counts, min=1)).sum() / norm.rows
    if mode == "sequence-mean-token-sum":
        return per_seq.sum() / norm.rows
    raise ValueError(f"unknown loss aggregation {mode!r}")


def kl_divergence(logps: jax.Array, ref_logps: jax.Array, estimator: str) -> jax.Array:
    """k1 = log p - log q; k3 = exp(q - p) - (q - p) - 1 (non-negative, low variance)."""
    if estimator == "k1":
        return logps - ref_logps
    diff = ref_logps - logps
    return jnp.exp(diff) - diff - 1


def sequence_log_ratio(logps: jax.Array, old_logps: jax.Array, mask: jax.Array) -> jax.Array:
    """GSPO's ratio: the length-normalized sequence log-likelihood ratio, per sequence."""
    token = jnp.clip(logps - old_logps, -20.0, 20.0)
    mask = mask.astype(jnp.float32)
    return (token * mask).sum(-1) / jnp.clip(mask.sum(-1), min=1)


def policy_loss(
    logps: jax.Array,
    mask: jax.Array,
    advantages: jax.Array,
    cfg: LossConfig,
    old_logps: jax.Array | None = None,
    ref_logps: jax.Array | None = None,
    norm: Norm | None = None,
    behaviour_logps: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped surrogate loss. With ``old_logps`` None the rollout policy *is* the
    current one (one update per batch): the ratio is 1 but its gradient is not.

    ``behaviour_logps`` (a pipelined run's decoupled correction): the log-probs of the
    older policy that sampled the batch. The ratio and its clipping stay against
    ``old`` (the learner's proximal policy), and each token's term is weighted by
    ``pi_old / pi_behaviour``, truncated at ``IMPORTANCE_CAP`` (per sequence for
    GSPO, whose ratio is a sequence's): AReaL's decoupled PPO objective.

    Every figure is a sum divided by ``norm`` (default: this batch's own), so the
    figures of micro-batches add up to the whole batch's.
    """
    norm = Norm.of(mask) if norm is None else norm
    old = jax.lax.stop_gradient(logps) if old_logps is None else old_logps
    log_ratio = jnp.clip(logps - old, -20.0, 20.0)
    if cfg.algorithm == "gspo":
        seq = sequence_log_ratio(logps, old, mask)
        # token-level form: value = the sequence ratio, gradient = each token's log-prob
        log_ratio = logps - jax.lax.stop_gradient(logps) + jax.lax.stop_gradient(seq)[:, None]
        log_ratio = jnp.clip(log_ratio, max=10.0)
    ratio = jnp.exp(log_ratio)
    adv = advantages[:, None]
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1 - cfg.epsilon, 1 + cfg.epsilon_high)
    per_token = jnp.maximum(unclipped, clipped)
    fmask = mask.astype(jnp.float32)
    denom = norm.tokens
    weight = None
    if behaviour_logps is not None:
        prox = jax.lax.stop_gradient(old)
        if cfg.algorithm == "gspo":
            log_w = sequence_log_ratio(prox, behaviour_logps, mask)[:, None]
        else:
            log_w = jnp.clip(prox - behaviour_logps, -20.0, 20.0)
        weight = jnp.minimum(jnp.exp(log_w), IMPORTANCE_CAP)
        per_token = per_token * weight
    loss = aggregate(per_token, mask, cfg.aggregation, norm)
    aux = {
        "clip_fraction": ((clipped > unclipped) * fmask).sum() / denom,
        "ratio_mean": (ratio * fmask).sum() / denom,
        "kl": jnp.float32(0.0),
    }
    if weight is not None:
        aux["importance_weight"] = (jnp.broadcast_to(weight, fmask.shape) * fmask).sum() / denom
    if ref_logps is not None:
        kl = kl_divergence(logps, ref_logps, cfg.kl_estimator)
        aux["kl"] = (kl * fmask).sum() / denom
        if cfg.beta:
            loss = loss + cfg.beta * aggregate(kl, mask, cfg.aggregation, norm)
    return loss, aux
