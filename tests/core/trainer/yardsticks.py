"""Tunix's own GRPO path: the yardstick rlctl's update and sampler are measured against.

Not used for training. test_loss.py checks rlctl's prefix-shared log-probs and
loss (``rlctl.core.trainer.algorithm.loss``) against these to float precision, and
bench/bench_train_step.py times them as the baseline: Tunix's ``grpo_loss_fn``
over full prompt+completion sequences, i.e. what a plain Tunix GRPO loop does.
Tunix's sampler (``tunix_sampler``, ``tunix_generate``) is what test_sampler.py
checks greedy tokens against and bench/bench_rollout.py times rlctl's sampler
against. Kept out of the package so ``tunix_adapter`` holds only what training calls.
"""

from __future__ import annotations

import types
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx


def algo_config(
    *,
    algorithm: str,
    beta: float,
    epsilon: float,
    epsilon_high: float,
    kl_estimator: str,
    loss_aggregation: str,
    temperature: float,
) -> Any:
    """What ``grpo_loss_fn`` reads, with names mapped from rlctl's spec.

    A namespace (not ``GRPOConfig``) because Tunix 0.1.7's config has no
    ``epsilon_high``/``temperature`` fields yet its loss function reads them.
    """
    return types.SimpleNamespace(
        beta=beta,
        epsilon=epsilon,
        epsilon_high=epsilon_high,
        loss_algo="gspo-token" if algorithm == "gspo" else "grpo",
        loss_agg_mode={"sequence-mean-token-sum": "seq-mean-token-sum"}.get(
            loss_aggregation, loss_aggregation
        ),
        kl_loss_mode={"k1": "kl", "k3": "low_var_kl"}[kl_estimator],
        kl_clamp_value=None,
        temperature=temperature,
    )


def group_advantages(rewards: np.ndarray, num_generations: int) -> np.ndarray:
    """Tunix's GRPO advantages (rlctl's own: ``loss.group_advantages``)."""
    from tunix.rl import algo_core

    return np.asarray(algo_core.compute_advantages(rewards, num_generations), np.float32)


def train_example(
    prompt_ids,
    completion_ids,
    completion_mask,
    advantages,
    pad_id,
    ref_logps=None,
    old_logps=None,
):
    """Tunix's ``TrainExample``: one row per completion, the prompt repeated in each."""
    from tunix.rl import common

    return common.TrainExample(
        prompt_ids=jnp.asarray(prompt_ids),
        prompt_mask=jnp.asarray(prompt_ids != pad_id),
        completion_ids=jnp.asarray(completion_ids),
        completion_mask=jnp.asarray(completion_mask),
        advantages=jnp.asarray(advantages),
        ref_per_token_logps=ref_logps,
        old_per_token_logps=old_logps,
    )


def policy_loss(model, example, cfg, pad_id: int, eos_id: int):
    """Tunix's loss with the model call inside (rlctl's: ``loss.policy_loss`` on log-probs)."""
    from tunix.rl import algo_core

    return algo_core.grpo_loss_fn(model, example, cfg, pad_id, eos_id)


def per_token_logps(model, prompt_ids, completion_ids, pad_id: int, eos_id: int, temperature=1.0):
    """Tunix's log-probs over full prompt+completion sequences (no shared prefix)."""
    from tunix.rl import common

    graphdef, state = nnx.split(model)
    return common.compute_per_token_logps(
        graphdef,
        state,
        prompt_tokens=jnp.asarray(prompt_ids),
        completion_tokens=jnp.asarray(completion_ids),
        pad_id=pad_id,
        eos_id=eos_id,
        stop_gradient=True,
        temperature=temperature,
    )


def assert_loss_and_gradients_match(
    model,
    info,
    prompts,
    comps,
    mask,
    adv,
    pad,
    G,
    algorithm: str = "grpo",
    remat: bool = False,
    skip_pads: bool = False,
    scaled_atol: float = 0.0,
) -> None:
    """rlctl's prefix-shared log-probs + loss against Tunix's ``grpo_loss_fn`` on the
    full sequences, with old log-probs a little off the current ones (so the ratio and
    its clipping matter): equal loss and gradients, with or without ``remat``, and
    with ``skip_pads`` given the mask (the MLPs and head on its tokens only).
    ``scaled_atol``: each gradient's absolute tolerance is also that fraction of its
    largest entry (float32 rounding of a leaf whose entries span decades)."""
    import jax
    import pytest
    from flax import nnx

    from rlctl.core.trainer import tunix_adapter as ta
    from rlctl.core.trainer.algorithm.loss import LossConfig
    from rlctl.core.trainer.algorithm.loss import policy_loss as ours_loss

    eps = (0.2, 0.28) if algorithm == "grpo" else (3e-4, 4e-4)
    cfg = LossConfig(algorithm, *eps, 0.0, "k3", "sequence-mean-token-mean")
    tcfg = algo_config(
        algorithm=algorithm,
        beta=0.0,
        epsilon=eps[0],
        epsilon_high=eps[1],
        kl_estimator="k3",
        loss_aggregation=cfg.aggregation,
        temperature=1.0,
    )
    full_prompts = np.repeat(prompts, G, 0)
    old = per_token_logps(model, full_prompts, comps, pad, 2) - 0.05 * mask
    ex = train_example(full_prompts, comps, mask, adv, pad, old_logps=old)

    def ours_fn(m):
        lp, _ = ta.shared_prefix_logps(
            m,
            prompts,
            comps,
            group=G,
            pad_id=pad,
            temperature=1.0,
            info=info,
            remat=remat,
            mask=mask if skip_pads else None,
        )
        return ours_loss(lp, mask, adv, cfg, old_logps=old)[0]

    def tunix_fn(m):
        return policy_loss(m, ex, tcfg, pad, 2)[0]

    l1, g1 = nnx.value_and_grad(ours_fn)(model)
    l2, g2 = nnx.value_and_grad(tunix_fn)(model)
    assert float(l1) == pytest.approx(float(l2), abs=1e-6)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), strict=True):
        atol = max(1e-6, scaled_atol * float(np.abs(np.asarray(b)).max(initial=0.0)))
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=atol, rtol=1e-4)


def tunix_sampler(model: Any, tokenizer: Any, info: Any, cache_size: int) -> Any:
    """Tunix's KV-cache sampler, as rlctl sampled with before ``sampler.py``."""
    from tunix.generate import sampler as sampler_lib

    cache = sampler_lib.CacheConfig(
        cache_size=cache_size,
        num_layers=info.num_layers,
        num_kv_heads=info.num_kv_heads,
        head_dim=info.head_dim,
    )
    sampler = sampler_lib.Sampler(transformer=model, tokenizer=tokenizer, cache_config=cache)
    # Pitfall: Tunix keeps a jax Array in the sampling state's pytree metadata, so
    # jit's cache lookup compares it with ``==`` from the second call on, which
    # compiles a scalar ``equal``; compiled here, it is cached before any timing.
    _ = bool(jnp.asarray(0, jnp.int32) == jnp.asarray(0, jnp.int32))
    return sampler


def tunix_generate(
    sampler: Any,
    prompts: list[str],
    *,
    max_new_tokens: int,
    max_prompt_tokens: int,
    eos_ids: list[int],
    temperature: float | None,
    top_p: float | None,
    top_k: int | None,
    seed: int,
) -> Any:
    """Sample (temperature set) or greedy decode (temperature None) with Tunix's sampler.

    Pitfall: Tunix reuses one PRNG key when ``seed`` is None, so every call would draw
    the same samples; callers pass a distinct seed per step.
    """
    greedy = temperature is None
    return sampler(
        prompts,
        max_generation_steps=max_new_tokens,
        max_prompt_length=max_prompt_tokens,
        eos_tokens=eos_ids,
        temperature=1.0 if greedy else temperature,
        top_p=None if greedy else (top_p if top_p is not None else 1.0),
        top_k=None if greedy else top_k,
        seed=seed,
        echo=False,
    )
