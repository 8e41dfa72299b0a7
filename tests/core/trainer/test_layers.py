"""Scanned layers (``tunix_adapter/llama/layers.py``) compute what the unrolled loop does: the
update's log-probs and gradients, the sampler's tokens and log-probs, on a tiny Llama
in float32. And the accelerators' row of the numerics table as a whole (scanned, none
of the CPU's tricks) trains on the same figures as the CPU's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("tunix")
pytestmark = pytest.mark.trainer

from tests.fakes.tiny_model import write_tiny_llama  # noqa: E402


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    """A 4-layer tiny Llama (the update's int remat then splits it 3 + 1), a padded
    batch of two prompts of three completions."""
    from rlctl.core.trainer import tunix_adapter as ta

    model, info = ta.load_model(write_tiny_llama(tmp_path_factory.mktemp("m") / "l4", layers=4))
    rng = np.random.default_rng(5)
    prompts = rng.integers(3, info.vocab_size, (2, 6)).astype(np.int32)
    prompts[1, :2] = 0
    comps = rng.integers(3, info.vocab_size, (6, 8)).astype(np.int32)
    for row, n in enumerate([1, 8, 2, 5, 3, 4]):
        comps[row, n:] = 0
    mask = (comps != 0).astype(np.int32)
    adv = rng.normal(size=6).astype(np.float32)
    return model, info, prompts, comps, mask, adv


def _row(name: str, **changes):
    from rlctl.core.trainer.runtime.numerics import TABLE

    return dataclasses.replace(TABLE[name], **changes)


def _loss_and_grads(four, numerics, remat):
    """(log-probs, entropies, gradients of a masked advantage-weighted sum) under
    ``numerics``."""
    from flax import nnx

    from rlctl.core.trainer import tunix_adapter as ta

    model, info, prompts, comps, mask, adv = four
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(p):
        m = nnx.merge(graphdef, p, rest)
        lp, ent = ta.shared_prefix_logps(
            m,
            prompts,
            comps,
            group=3,
            pad_id=0,
            temperature=0.8,
            info=info,
            remat=remat,
            mask=mask,
            numerics=numerics,
        )
        return (lp * mask * adv[:, None]).sum(), (lp, ent)

    (_, (lp, ent)), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return np.asarray(lp) * mask, np.asarray(ent) * mask, jax.tree.leaves(grads)


@pytest.mark.parametrize("remat", [False, 3, True])
def test_the_scanned_update_gives_the_unrolled_figures(four, remat):
    """The CPU's row with its layers scanned: the same log-probs and gradients, with no
    layer recomputed, the first three (two scans: 3 recomputed, then 1), or all."""
    unrolled = _loss_and_grads(four, _row("cpu"), remat)
    scanned = _loss_and_grads(four, _row("cpu", scan_layers=True), remat)
    np.testing.assert_allclose(scanned[0], unrolled[0], atol=1e-6)
    np.testing.assert_allclose(scanned[1], unrolled[1], atol=1e-6)
    assert len(scanned[2]) == len(unrolled[2])
    for a, b in zip(scanned[2], unrolled[2], strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("remat", [False, True])
def test_the_accelerators_row_trains_on_the_cpus_figures(four, remat):
    """No packing, JAX's MLP gradient, scanned layers over one token stream per
    completion (``layers.stream_hidden``), recomputed or not: where the mask is set the
    same log-probs and entropies, and the same gradients (the packed rows only skip what
    nothing masked in reads)."""
    cpu = _loss_and_grads(four, _row("cpu"), False)
    gpu = _loss_and_grads(four, _row("gpu"), remat)
    np.testing.assert_allclose(gpu[0], cpu[0], atol=2e-5)
    np.testing.assert_allclose(gpu[1], cpu[1], atol=2e-5)
    for a, b in zip(gpu[2], cpu[2], strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_scanned_trunk_gives_the_unrolled_hidden_states_and_cache(four):
    import jax.numpy as jnp

    from rlctl.core.trainer import tunix_adapter as ta

    model, info, prompts, *_ = four
    P, L = prompts.shape
    S = L + 4
    pmask = jnp.asarray(prompts != 0)
    positions = jnp.maximum(jnp.cumsum(pmask, -1) - 1, 0)
    mask = jnp.pad(
        pmask[:, None, :] & jnp.tril(jnp.ones((L, L), bool))[None], ((0, 0), (0, 0), (0, 4))
    )
    h0, c0 = ta.trunk(model, prompts, positions, ta.kv_cache(info, P, S), mask)
    h1, c1 = ta.trunk(
        model, prompts, positions, ta.kv_cache(info, P, S, stacked=True), mask, scan=True
    )
    np.testing.assert_allclose(np.asarray(h1), np.asarray(h0), atol=1e-6)
    for i in range(info.num_layers):
        for key in ("k", "v", "end_index"):
            np.testing.assert_allclose(
                np.asarray(c1[key][i]), np.asarray(c0[f"layer_{i}"][key]), atol=1e-6
            )


@pytest.mark.parametrize("weights_first", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_scanned_sampler_draws_the_unrolled_tokens(four, weights_first, temperature):
    """Prefill (and, through the layers, decode) scanned: the same tokens, log-probs and
    decode iterations; weights first, the scanned prefill's cache feeds the same
    decode."""
    from rlctl.core.trainer.rollout.sampler import Sampler, sample_groups

    model, info, prompts, *_ = four
    s = Sampler(model, info, pad_id=0, eos_ids=[5], max_new_tokens=7)
    kw = dict(
        info=s.info, group=3, max_new_tokens=7, pad_id=0, eos_ids=(5,), weights_first=weights_first
    )
    args = (
        s.graphdef,
        s.state,
        prompts,
        np.uint32(3),
        np.float32(temperature),
        np.float32(1.0),
        np.int32(0),
    )
    plain = jax.device_get(sample_groups(*args, **kw, scan=False))
    scanned = jax.device_get(sample_groups(*args, **kw, scan=True))
    np.testing.assert_array_equal(scanned[0], plain[0])
    np.testing.assert_allclose(scanned[1], plain[1], atol=2e-5)
    assert int(scanned[2]) == int(plain[2])


def test_the_sampler_takes_its_choices_from_the_numerics_row(four):
    from rlctl.core.trainer.rollout.sampler import Sampler

    model, info, *_ = four
    cpu = Sampler(model, info, pad_id=0, eos_ids=[], max_new_tokens=4, numerics=_row("cpu"))
    gpu = Sampler(model, info, pad_id=0, eos_ids=[], max_new_tokens=4, numerics=_row("gpu"))
    assert (cpu.weights_first, cpu.scan) == (True, False)
    assert (gpu.weights_first, gpu.scan) == (False, True)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_accelerators_sampler_draws_the_cpus_tokens(four, temperature):
    """Every row prefilled, scanned layers, no weights-first decode: the CPU row's
    tokens and log-probs, group by group."""
    from rlctl.core.trainer.rollout.sampler import Sampler

    model, info, prompts, *_ = four

    def draw(row: str, eos: list[int]):
        return Sampler(model, info, pad_id=0, eos_ids=eos, max_new_tokens=7, numerics=_row(row))(
            prompts, group=3, seed=11, temperature=temperature
        )

    eos = [int(draw("cpu", []).tokens[1, 3])]  # a token some row draws: it stops there
    drawn = [draw(row, eos) for row in ("cpu", "gpu")]
    np.testing.assert_array_equal(drawn[1].tokens, drawn[0].tokens)
    np.testing.assert_allclose(drawn[1].logps, drawn[0].logps, atol=2e-5)
    assert drawn[1].steps == drawn[0].steps
    assert (drawn[0].lengths < 7).any()  # some row stopped


def test_the_accelerators_mlp_narrowed_before_the_scan_gives_the_same_gradients(four, monkeypatch):
    """bfloat16 products with JAX's MLP gradient (an accelerator's row): the MLP's
    matrices cast once before the scan (``layers._narrowed_mlp``) give the gradients
    that casting them inside each layer gives, bit for bit."""
    from rlctl.core.trainer.tunix_adapter.llama import layers

    model, info, prompts, comps, mask, adv = four
    narrow = (model, dataclasses.replace(info, compute_dtype="bfloat16"), prompts, comps, mask, adv)
    before = _loss_and_grads(narrow, _row("gpu"), True)
    monkeypatch.setattr(layers, "_narrowed_mlp", lambda states, dtype: states)
    inside = _loss_and_grads(narrow, _row("gpu"), True)
    np.testing.assert_array_equal(before[0], inside[0])
    for a, b in zip(before[2], inside[2], strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _one_step(path, row):
    """One whole update (loss, gradients, clipped AdamW) of a fresh 4-layer tiny Llama
    under ``row``: (its grad norm, the new parameters' leaves, the gradients' norm taken
    of the gradients the optimizer got, the norm the update took apart or None)."""
    from flax import nnx

    from rlctl.core.config.models import RunSpec
    from rlctl.core.trainer import tunix_adapter as ta
    from rlctl.core.trainer.rollout.rollout import Batch
    from rlctl.core.trainer.update.optimizer import global_norm
    from rlctl.core.trainer.update.step import Update, make_optimizer

    model, info = ta.load_model(path)
    spec = RunSpec(
        rollout={"num_generations": 3, "max_new_tokens": 8},
        training={"prompts_per_step": 2, "learning_rate": 1e-3, "max_grad_norm": 0.05},
    )
    rng = np.random.default_rng(7)
    prompts = rng.integers(3, info.vocab_size, (2, 6)).astype(np.int32)
    comps = rng.integers(3, info.vocab_size, (6, 8)).astype(np.int32)
    for r, n in enumerate([1, 8, 2, 5, 3, 4]):
        comps[r, n:] = 0
    batch = Batch(
        prompt_ids=prompts,
        completion_ids=comps,
        mask=(comps != 0).astype(np.int32),
        advantages=rng.normal(size=6).astype(np.float32),
    )
    u = Update(spec, pad_id=0, info=info, numerics=row)
    mdef, params, rest = nnx.split(model, nnx.Param, ...)
    _, grads, taken = jax.jit(lambda p, r, b: u._grads_and_norm(p, mdef, r, b, 6, True))(
        params, rest, batch
    )
    optimizer = make_optimizer(model, spec.training)
    _, _, gnorm = u.train_step(model, optimizer, batch)
    new = [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]
    return float(gnorm), new, float(global_norm(grads)), taken


def test_the_accelerators_update_steps_as_the_cpus(tmp_path):
    """The accelerators' update takes the gradients' norm of the stacked gradients
    (``Update._grads_and_norm``: one reduction per kind of array, not one per layer's
    row) and clips and steps with it: the norm is the per-layer gradients' (float32,
    summed in another order), and the step (clipped: the norm is over max_grad_norm)
    moves every parameter as the CPU's update does (to 1% of the learning rate: Adam's
    first step is about lr x sign(g), so a gradient element near zero whose last bits
    differ moves its parameter by a visibly different fraction of lr)."""
    path = write_tiny_llama(tmp_path / "l4", layers=4)
    cpu_norm, cpu_new, _, cpu_taken = _one_step(path, _row("cpu"))
    gpu_norm, gpu_new, of_rows, gpu_taken = _one_step(path, _row("gpu"))
    assert cpu_taken is None  # the CPU's optimizer takes it, behind its barrier
    assert gpu_taken is not None
    np.testing.assert_allclose(float(gpu_taken), of_rows, rtol=1e-6)
    assert gpu_norm == pytest.approx(float(gpu_taken), rel=1e-7)
    assert gpu_norm > 0.05  # clipped: the norm scales every step
    assert gpu_norm == pytest.approx(cpu_norm, rel=1e-4)
    for a, b in zip(gpu_new, cpu_new, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
