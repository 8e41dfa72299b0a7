"""GRPO/GSPO math on hand-computed numbers, and parity with Tunix's own loss."""

from __future__ import annotations

import math

import numpy as np
import pytest

# builds a model, compiles or trains: out of the fast loop (tests/test_marks.py)
pytestmark = pytest.mark.slow

jax = pytest.importorskip("jax")
jnp = jax.numpy

from rlctl.core.trainer.algorithm.loss import (  # noqa: E402
    LossConfig,
    aggregate,
    group_advantages,
    kl_divergence,
    policy_loss,
    sequence_log_ratio,
)

GRPO = LossConfig("grpo", 0.2, 0.2, 0.0, "k3", "sequence-mean-token-mean")
GSPO = LossConfig("gspo", 3e-4, 4e-4, 0.0, "k3", "sequence-mean-token-mean")


class TestGroupAdvantages:
    def test_hand_computed(self):
        # group 1: rewards 1, 0, 0, 1 -> mean 0.5, sample std sqrt(1/3)
        adv = group_advantages(np.array([1, 0, 0, 1, 2, 2, 2, 2], np.float32), 4)
        s = math.sqrt(1 / 3)
        np.testing.assert_allclose(adv[:4], [0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s], rtol=1e-5)
        np.testing.assert_allclose(adv[4:], 0.0, atol=1e-6)  # no variance, no signal

    def test_matches_tunix(self):
        from tests.core.trainer import yardsticks

        r = np.random.default_rng(0).random(16).astype(np.float32)
        np.testing.assert_allclose(
            group_advantages(r, 8), yardsticks.group_advantages(r, 8), rtol=1e-5
        )


class TestSequenceRatio:
    def test_gspo_ratio_is_length_normalized_geometric_mean(self):
        logps = jnp.array([[-1.0, -2.0, -3.0], [-1.0, -1.0, 0.0]])
        old = jnp.array([[-1.5, -2.0, -2.0], [-2.0, -1.5, 0.0]])
        mask = jnp.array([[1, 1, 1], [1, 1, 0]])
        # row 0: (0.5 + 0 - 1) / 3; row 1: (1 + 0.5) / 2 (padding ignored)
        np.testing.assert_allclose(sequence_log_ratio(logps, old, mask), [-0.5 / 3, 0.75])


class TestPolicyLoss:
    def test_on_policy_value_is_minus_mean_advantage(self):
        logps = jnp.array([[-1.0, -2.0], [-0.5, -0.1]])
        mask = jnp.ones((2, 2))
        adv = jnp.array([1.0, -3.0])
        loss, _ = policy_loss(logps, mask, adv, GRPO)
        assert float(loss) == pytest.approx(1.0)  # -(1 - 3)/2

    def test_grpo_clips_token_ratios(self):
        logps = jnp.log(jnp.array([[0.5, 0.5]]))
        old = jnp.log(jnp.array([[0.25, 0.5]]))  # ratios 2.0 and 1.0
        loss, aux = policy_loss(logps, jnp.ones((1, 2)), jnp.array([1.0]), GRPO, old_logps=old)
        # positive advantage: min(r, 1.2) per token -> (1.2 + 1.0) / 2, negated
        assert float(loss) == pytest.approx(-1.1, rel=1e-5)
        assert float(aux["clip_fraction"]) == pytest.approx(0.5)

    def test_gspo_uses_one_ratio_per_sequence(self):
        logps = jnp.log(jnp.array([[0.5, 0.5]]))
        old = jnp.log(jnp.array([[0.25, 0.5]]))
        loss, _ = policy_loss(logps, jnp.ones((1, 2)), jnp.array([1.0]), GSPO, old_logps=old)
        seq_ratio = math.exp(math.log(2.0) / 2)  # geometric mean of 2.0 and 1.0 = 1.414
        assert seq_ratio > 1 + GSPO.epsilon_high
        assert float(loss) == pytest.approx(-(1 + GSPO.epsilon_high), rel=1e-6)

    def test_gspo_equals_grpo_on_policy_and_differs_off_policy(self):
        rng = np.random.default_rng(1)
        logps = jnp.asarray(-rng.random((4, 5)), jnp.float32)
        old = logps + jnp.asarray(rng.normal(0, 0.1, (4, 5)), jnp.float32)
        mask = jnp.ones((4, 5))
        adv = jnp.asarray(rng.normal(size=4), jnp.float32)
        same = [policy_loss(logps, mask, adv, c)[0] for c in (GRPO, GSPO)]
        assert float(same[0]) == pytest.approx(float(same[1]))
        diff = [policy_loss(logps, mask, adv, c, old_logps=old)[0] for c in (GRPO, GSPO)]
        assert abs(float(diff[0]) - float(diff[1])) > 1e-3

    def test_decoupled_weights_each_token_by_the_learners_over_the_samplers(self):
        """AReaL's decoupled objective with one update a batch: the ratio is 1 (the
        learner's own policy), each token's term is weighted by pi_now / pi_sampler,
        truncated at IMPORTANCE_CAP, and the weight carries no gradient."""
        from rlctl.core.trainer.algorithm.loss import IMPORTANCE_CAP

        logps = jnp.log(jnp.array([[0.5, 0.5, 0.5]]))
        sampler = jnp.log(jnp.array([[0.25, 0.5, 0.05]]))  # weights 2, 1, 10 -> cap
        mask, adv = jnp.ones((1, 3)), jnp.array([1.0])

        def loss_of(lp):
            return policy_loss(lp, mask, adv, GRPO, behaviour_logps=sampler)

        (loss, aux), grad = jax.value_and_grad(loss_of, has_aux=True)(logps)
        w = [2.0, 1.0, IMPORTANCE_CAP]
        assert float(loss) == pytest.approx(-sum(w) / 3, rel=1e-5)
        assert float(aux["clip_fraction"]) == 0.0
        assert float(aux["importance_weight"]) == pytest.approx(sum(w) / 3, rel=1e-5)
        np.testing.assert_allclose(grad, [[-x / 3 for x in w]], rtol=1e-5)
        # no drift: the synchronous loss exactly
        same, _ = policy_loss(logps, mask, adv, GRPO, behaviour_logps=logps)
        assert float(same) == float(policy_loss(logps, mask, adv, GRPO)[0])

    def test_decoupled_gspo_weights_each_sequence(self):
        logps = jnp.log(jnp.array([[0.5, 0.5]]))
        sampler = jnp.log(jnp.array([[0.25, 0.5]]))  # sequence weight sqrt(2)
        loss, aux = policy_loss(
            logps, jnp.ones((1, 2)), jnp.array([1.0]), GSPO, behaviour_logps=sampler
        )
        assert float(loss) == pytest.approx(-math.sqrt(2), rel=1e-5)
        assert float(aux["importance_weight"]) == pytest.approx(math.sqrt(2), rel=1e-5)

    def test_kl_estimators(self):
        p, q = jnp.array([-1.0]), jnp.array([-1.5])
        assert float(kl_divergence(p, q, "k1")[0]) == pytest.approx(0.5)
        assert float(kl_divergence(p, q, "k3")[0]) == pytest.approx(math.exp(-0.5) + 0.5 - 1)

    def test_beta_adds_kl(self):
        logps, ref = jnp.array([[-1.0, -1.0]]), jnp.array([[-2.0, -2.0]])
        cfg = LossConfig("grpo", 0.2, 0.2, 0.5, "k1", "token-mean")
        loss, aux = policy_loss(logps, jnp.ones((1, 2)), jnp.array([0.0]), cfg, ref_logps=ref)
        assert float(aux["kl"]) == pytest.approx(1.0)
        assert float(loss) == pytest.approx(0.5)

    @pytest.mark.parametrize(
        ("mode", "want"),
        [
            ("token-mean", 6 / 3),
            ("sequence-mean-token-mean", (1.5 + 3) / 2),
            ("sequence-mean-token-sum", (3 + 3) / 2),
        ],
    )
    def test_aggregation(self, mode, want):
        per_token = jnp.array([[1.0, 2.0], [3.0, 9.0]])
        mask = jnp.array([[1, 1], [1, 0]])
        assert float(aggregate(per_token, mask, mode)) == pytest.approx(want)


@pytest.mark.trainer
class TestParityWithTunix:
    """Prefix-shared log-probs + rlctl's loss == Tunix's grpo_loss_fn on full sequences."""

    @pytest.fixture(scope="class")
    def setup(self, tiny_model_dir):
        from rlctl.core.trainer import tunix_adapter as ta

        model, info = ta.load_model(tiny_model_dir)
        rng = np.random.default_rng(0)
        pad, G = 0, 3
        prompts = rng.integers(3, info.vocab_size, (2, 8)).astype(np.int32)
        prompts[0, :3] = pad  # left padding
        comps = rng.integers(3, info.vocab_size, (6, 5)).astype(np.int32)
        comps[1, 3:] = pad  # right padding
        mask = (comps != pad).astype(np.int32)
        adv = rng.normal(size=6).astype(np.float32)
        return model, info, prompts, comps, mask, adv, pad, G

    def test_log_probs_match_full_sequence(self, setup):
        from rlctl.core.trainer import tunix_adapter as ta
        from tests.core.trainer import yardsticks

        model, info, prompts, comps, mask, _, pad, G = setup
        ours, _ = ta.shared_prefix_logps(
            model, prompts, comps, group=G, pad_id=pad, temperature=0.7, info=info
        )
        full = yardsticks.per_token_logps(model, np.repeat(prompts, G, 0), comps, pad, 2, 0.7)
        np.testing.assert_allclose(np.asarray(ours) * mask, np.asarray(full) * mask, atol=2e-5)

    @pytest.mark.parametrize("algorithm", ["grpo", "gspo"])
    def test_loss_and_gradient_match(self, setup, algorithm):
        from tests.core.trainer import yardsticks

        yardsticks.assert_loss_and_gradients_match(*setup, algorithm=algorithm)

    def test_recomputed_layers_give_the_same_gradients(self, setup):
        """training.remat: each layer recomputed in the backward pass, same figures."""
        from tests.core.trainer import yardsticks

        yardsticks.assert_loss_and_gradients_match(*setup, algorithm="grpo", remat=True)


@pytest.mark.trainer
def test_qwen2_prefix_sharing_matches_full_sequence(tmp_path):
    """The prefix-shared update also holds for another Tunix family (Qwen2, with biases)."""
    from rlctl.core.trainer import tunix_adapter as ta
    from tests.core.trainer import yardsticks
    from tests.fakes.tiny_model import write_tiny_llama

    folder = write_tiny_llama(tmp_path / "qwen", family="qwen2", rope_theta=1e6)
    model, info = ta.load_model(folder)
    assert info.family == "qwen2"
    rng = np.random.default_rng(2)
    prompts = rng.integers(3, info.vocab_size, (2, 6)).astype(np.int32)
    prompts[1, :2] = 0
    comps = rng.integers(3, info.vocab_size, (4, 4)).astype(np.int32)
    ours, _ = ta.shared_prefix_logps(
        model, prompts, comps, group=2, pad_id=0, temperature=1.0, info=info
    )
    full = yardsticks.per_token_logps(model, np.repeat(prompts, 2, 0), comps, 0, 2)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(full), atol=2e-5)
