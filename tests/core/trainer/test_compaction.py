"""compaction: the update's MLPs on the completions' real tokens only give the figures
of the whole padded grid, and really skip the pads."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.trainer


def test_packed_sizes_step_up_to_the_grid():
    from rlctl.core.trainer.tunix_adapter.llama.compaction import sizes

    assert sizes(768) == [128, 256, 384, 512, 640, 768]
    assert sizes(30) == [8, 16, 24, 30]
    assert sizes(3) == [3]
    assert sizes(768, 12) == list(range(64, 769, 64))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_packed_head_gives_the_whole_heads_figures_where_kept(temperature):
    """``head_logps``: log-probs, entropies and both gradients of the kept positions
    are the unpacked head's; the others are 0, and the products ran on the smallest
    packed size that holds the kept positions."""
    import jax
    import jax.numpy as jnp

    from rlctl.core.trainer.tunix_adapter.llama import compaction
    from rlctl.core.trainer.tunix_adapter.logprobs import token_logps

    k = jax.random.split(jax.random.PRNGKey(0), 4)
    h = jax.random.normal(k[0], (4, 12, 16))
    w = jax.random.normal(k[1], (16, 50)) * 0.3
    t = jax.random.randint(k[2], (4, 12), 0, 50)
    g = jax.random.normal(k[3], (4, 12))
    keep = jnp.asarray(np.random.default_rng(0).random((4, 12)) < 0.4)
    assert 0 < int(keep.sum()) <= 24  # so the packed size is at most half the grid
    plan = compaction.plan(keep.reshape(-1), compaction.HEAD_BUCKETS)
    assert compaction.sizes(48, compaction.HEAD_BUCKETS)[int(plan.branch)] <= 24

    def loss(h, w, packs):
        lp, ent = token_logps(h, t, w, temperature, 10**6, keep=keep if packs else None)
        return (lp * g * keep).sum(), (lp, ent)

    (a, (lp_a, ent_a)), grads_a = jax.value_and_grad(loss, (0, 1), has_aux=True)(h, w, True)
    (b, (lp_b, ent_b)), grads_b = jax.value_and_grad(loss, (0, 1), has_aux=True)(h, w, False)
    kept = np.asarray(keep)
    assert float(a) == pytest.approx(float(b), rel=1e-5)
    np.testing.assert_allclose(np.asarray(lp_a)[kept], np.asarray(lp_b)[kept], atol=1e-5)
    np.testing.assert_allclose(np.asarray(ent_a)[kept], np.asarray(ent_b)[kept], atol=1e-5)
    assert not np.asarray(lp_a)[~kept].any() and not np.asarray(ent_a)[~kept].any()
    for x, y in zip(grads_a, grads_b, strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-6)


def test_needed_positions_are_those_before_a_masked_target():
    import jax.numpy as jnp

    from rlctl.core.trainer.tunix_adapter.llama.compaction import needed_positions

    mask = jnp.array([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [0, 0, 1, 0, 0]])
    assert needed_positions(mask).astype(int).tolist() == [
        [1, 1, 0, 0, 0],
        [0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 0, 0, 0],
    ]


def test_packed_runs_the_kept_rows_only_with_their_gradients():
    import jax
    import jax.numpy as jnp

    from rlctl.core.trainer.tunix_adapter.llama.compaction import packed, plan

    keep = jnp.array([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]] * 4, bool)  # 24 of 48 kept
    x = jax.random.normal(jax.random.PRNGKey(0), (48, 5))
    w = jax.random.normal(jax.random.PRNGKey(1), (5, 3))
    p = plan(keep)
    seen = []

    def fn(rows):
        seen.append(rows.shape[0])
        return jnp.tanh(rows @ w)

    out = packed(fn, x, p)
    flat = np.asarray(keep).reshape(-1)
    np.testing.assert_allclose(np.asarray(out)[flat], np.tanh(np.asarray(x @ w))[flat], rtol=1e-6)
    assert int(p.branch) == 2 and sorted(set(seen)) == [8, 16, 24, 32, 40, 48]
    assert np.count_nonzero(np.abs(np.asarray(out)).sum(-1)) == 24  # only 24 computed

    def loss(w, x, packs):
        y = packed(lambda r: jnp.tanh(r @ w), x, p) if packs else jnp.tanh(x @ w)
        return (y * keep.reshape(-1, 1)).sum()

    for a, b in zip(
        jax.grad(loss, (0, 1))(w, x, True), jax.grad(loss, (0, 1))(w, x, False), strict=True
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def padded(tiny_model_dir):
    """Completions of lengths 1..6 of 8 (most of the grid pads), two prompts of three."""
    from rlctl.core.trainer import tunix_adapter as ta

    model, info = ta.load_model(tiny_model_dir)
    rng = np.random.default_rng(3)
    pad, G = 0, 3
    prompts = rng.integers(3, info.vocab_size, (2, 6)).astype(np.int32)
    prompts[1, :2] = pad
    comps = rng.integers(3, info.vocab_size, (6, 8)).astype(np.int32)
    for row, n in enumerate([1, 6, 2, 3, 1, 4]):
        comps[row, n:] = pad
    mask = (comps != pad).astype(np.int32)
    adv = rng.normal(size=6).astype(np.float32)
    return model, info, prompts, comps, mask, adv, pad, G


def test_the_log_probs_are_the_whole_grids_where_the_mask_is_set(padded):
    from rlctl.core.trainer import tunix_adapter as ta
    from rlctl.core.trainer.tunix_adapter.llama import compaction

    model, info, prompts, comps, mask, _, pad, G = padded
    assert int(compaction.plan(compaction.needed_positions(mask)).branch) < 5  # skips
    whole, went = ta.shared_prefix_logps(
        model, prompts, comps, group=G, pad_id=pad, temperature=0.7, info=info
    )
    skips, ent = ta.shared_prefix_logps(
        model, prompts, comps, group=G, pad_id=pad, temperature=0.7, info=info, mask=mask
    )
    np.testing.assert_allclose(np.asarray(skips) * mask, np.asarray(whole) * mask, atol=2e-5)
    np.testing.assert_allclose(np.asarray(ent) * mask, np.asarray(went) * mask, atol=2e-5)
    # where nothing reads them the MLPs and the head were skipped: those log-probs differ
    assert not np.allclose(np.asarray(skips)[mask == 0], np.asarray(whole)[mask == 0])


@pytest.mark.parametrize("remat", [False, True])
def test_loss_and_gradients_are_tunixs_with_the_pads_skipped(padded, remat):
    from tests.core.trainer import yardsticks

    yardsticks.assert_loss_and_gradients_match(
        *padded, algorithm="grpo", remat=remat, skip_pads=True
    )


def test_the_update_skips_the_pads_and_its_yardstick_does_not(padded, monkeypatch):
    """The update passes the batch's mask; with the CPU's row of the numerics table the
    completions' MLPs and the head run packed, with packing off (the whole-grid
    yardstick, and the accelerators' row) the whole grid."""
    import dataclasses

    from rlctl.core.trainer.runtime.numerics import TABLE
    from rlctl.core.trainer.tunix_adapter import logprobs
    from rlctl.core.trainer.update import step

    model, info, prompts, comps, mask, *_ = padded
    from rlctl.core.trainer.tunix_adapter.llama import layers as layers_lib

    seen = []
    real = logprobs.decoder_layer
    for module in (logprobs, layers_lib):  # the pair's layer, the stream's
        monkeypatch.setattr(
            module,
            "decoder_layer",
            lambda *a, **k: seen.append(len(a) >= 6 and a[5] is not None) or real(*a, **k),
        )
    heads = []
    real_head = logprobs.head_logps
    monkeypatch.setattr(logprobs, "head_logps", lambda *a: heads.append(1) or real_head(*a))
    u = object.__new__(step.Update)
    u.pad_id, u.temperature, u.info = 0, 1.0, info
    layers = len(model.layers)
    whole = dataclasses.replace(TABLE["cpu"], pack_mlp_rows=False, pack_head=False)
    for row in (TABLE["cpu"], whole, TABLE["gpu"]):
        u.numerics = row
        u._logps_fn(model, prompts, comps, 3, False, mask)
    # the accelerators' row scans its layers over one token stream per completion
    # (layers.stream_hidden): one layer body traced, unpacked
    assert seen == [False, True] * layers + [False, False] * layers + [False]
    assert heads == [1]  # the head packed once: with the CPU's row only
