"""Mixed precision (tunix_adapter/mixed.py): bfloat16 inputs, float32 sums, outputs and
weights. Checked against float32 to bfloat16's tolerance, and in the compiled programs
themselves: XLA:CPU silently turns a bfloat16 dot it cannot hand to YNNPACK back into a
float32 one (or, after folding a transpose, fails at run time), so the tests read which
dots of the sampler and the update really take bfloat16 inputs."""

from __future__ import annotations

import re

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("tunix")
pytestmark = pytest.mark.trainer

import jax.numpy as jnp  # noqa: E402

BF16 = "bfloat16"


def narrow_dots(compiled_text: str) -> tuple[int, int]:
    """(dots with bfloat16 inputs, all dots) of a compiled program's HLO: a dot's
    operands are the parameters of the fused computation that holds it."""
    narrow = total = 0
    params: dict[str, str] = {}
    for line in compiled_text.splitlines():
        if re.match(r"^\S.*\{$", line):  # a new computation
            params = {}
        p = re.match(r"\s*%(\S+) = (\w+)\[[\d,]*\]\S* parameter\(", line)
        if p:
            params[p.group(1)] = p.group(2)
        d = re.search(r"= \w+\[[\d,]*\]\S* dot\(%([^,\s]+), %([^,\s)]+)", line)
        if d:
            total += 1
            narrow += all(params.get(op) == "bf16" for op in d.groups())
    return narrow, total


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_mm_is_float32_out_and_its_gradients_keep_their_dtypes():
    from rlctl.core.trainer.tunix_adapter.mixed import mm

    k = jax.random.split(jax.random.PRNGKey(0), 3)
    x = jax.random.normal(k[0], (3, 40, 64))
    w = jax.random.normal(k[1], (64, 96)) * 0.1
    dy = jax.random.normal(k[2], (3, 40, 96))

    def loss(x, w, dtype):
        return (mm(x, w, dtype) * dy).sum()

    y = mm(x, w, BF16)
    assert y.dtype == jnp.float32
    # the product of the bfloat16-rounded inputs, summed in float32
    exact = x.astype(jnp.bfloat16).astype(jnp.float32) @ w.astype(jnp.bfloat16).astype(jnp.float32)
    np.testing.assert_allclose(y, exact, rtol=1e-5, atol=1e-5)
    assert 1e-4 < rel(y, x @ w) < 1e-2  # narrow, not float32, and close to it
    g32 = jax.grad(loss, argnums=(0, 1))(x, w, "float32")
    g16 = jax.grad(loss, argnums=(0, 1))(x, w, BF16)
    assert [g.dtype for g in g16] == [jnp.float32, jnp.float32]
    assert rel(g16[0], g32[0]) < 1e-2
    np.testing.assert_allclose(g16[1], g32[1], rtol=1e-4, atol=1e-4)  # the weight's: float32
    # float32 is exactly x @ w, differentiated by JAX
    np.testing.assert_array_equal(mm(x, w, "float32"), x @ w)


def test_the_update_in_bfloat16_is_float32s_within_its_precision(tiny_model_dir):
    """Log-probs and the gradient of their sum over a prompt group, both precisions."""
    import dataclasses

    from flax import nnx

    from rlctl.core.trainer import tunix_adapter as ta

    model, info = ta.load_model(tiny_model_dir)
    rng = np.random.default_rng(0)
    prompts = rng.integers(3, info.vocab_size, (2, 7)).astype(np.int32)
    comps = rng.integers(3, info.vocab_size, (6, 5)).astype(np.int32)
    mask = np.ones(comps.shape, bool)
    graphdef, state = nnx.split(model)

    def run(dtype, remat):
        i = dataclasses.replace(info, compute_dtype=dtype)

        def f(state):
            lp, _ = ta.shared_prefix_logps(
                nnx.merge(graphdef, state),
                prompts,
                comps,
                group=3,
                pad_id=0,
                temperature=1.0,
                info=i,
                remat=remat,
                mask=mask,
            )
            return lp.sum(), lp

        return jax.jit(jax.value_and_grad(f, has_aux=True))(state)

    (_, lp32), g32 = run("float32", False)
    for remat in (False, True):
        (_, lp16), g16 = run(BF16, remat)
        assert np.abs(np.asarray(lp16) - np.asarray(lp32)).max() < 0.05
        a, b = (np.concatenate([np.ravel(x) for x in jax.tree.leaves(g)]) for g in (g16, g32))
        assert a.dtype == np.float32
        assert float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) > 0.999


def test_the_sampler_decodes_in_bfloat16_with_the_trainers_log_probs(tiny_model_dir):
    """Its log-probs of the tokens it drew agree with the update's own (both bfloat16),
    for several groups and a tied head; one prompt of one row too (a matrix-vector
    product, which YNNPACK does not take)."""
    import dataclasses

    from rlctl.core.trainer import tunix_adapter as ta
    from rlctl.core.trainer.rollout.sampler import Sampler
    from tests.fakes.tiny_model import write_tiny_llama

    for folder in (tiny_model_dir, write_tiny_llama(tiny_model_dir.parent / "tied", tie=True)):
        model, info = ta.load_model(folder, compute_dtype=BF16)
        assert info.compute_dtype == BF16
        s = Sampler(model, info, pad_id=0, eos_ids=[], max_new_tokens=6)
        rng = np.random.default_rng(1)
        for P, G in ((2, 4), (1, 1)):
            prompts = rng.integers(3, info.vocab_size, (P, 5)).astype(np.int32)
            drawn = s(prompts, group=G, seed=3, temperature=1.0)
            lp, _ = ta.shared_prefix_logps(
                model, prompts, drawn.tokens, group=G, pad_id=0, temperature=1.0, info=info
            )
            assert np.abs(np.asarray(lp) - drawn.logps).max() < 0.02
        f32 = dataclasses.replace(info, compute_dtype="float32")
        lp32, _ = ta.shared_prefix_logps(
            model, prompts, drawn.tokens, group=G, pad_id=0, temperature=1.0, info=f32
        )
        assert np.abs(np.asarray(lp32) - drawn.logps).max() > 1e-6  # it did read bfloat16


def test_a_float32_policy_samples_in_bfloat16_near_its_float32_log_probs(tiny_model_dir):
    """``rollout.compute_dtype=bfloat16`` beside a float32 update (the default on a CPU
    with native bfloat16): the sampler reads bfloat16 from the float32 weights, and
    the log-probs of what it drew stay within bfloat16's precision of the update's
    float32 ones, which are what the loss reads."""
    from rlctl.core.trainer import tunix_adapter as ta
    from rlctl.core.trainer.rollout.sampler import Sampler

    model, info = ta.load_model(tiny_model_dir)
    assert info.compute_dtype == "float32"
    s = Sampler(model, info, pad_id=0, eos_ids=[], max_new_tokens=6, compute_dtype=BF16)
    assert s.info.compute_dtype == BF16 and info.compute_dtype == "float32"
    prompts = np.random.default_rng(2).integers(3, info.vocab_size, (2, 5)).astype(np.int32)
    drawn = s(prompts, group=4, seed=5, temperature=1.0)
    lp32, _ = ta.shared_prefix_logps(
        model, prompts, drawn.tokens, group=4, pad_id=0, temperature=1.0, info=info
    )
    gap = np.abs(np.asarray(lp32) - drawn.logps)
    assert gap.max() < 0.05 and gap.max() > 1e-6, gap.max()  # near, and it did read bfloat16
    same = Sampler(model, info, pad_id=0, eos_ids=[], max_new_tokens=6)(
        prompts, group=4, seed=5, temperature=1.0
    )
    assert np.abs(np.asarray(lp32) - same.logps).max() < 1e-4


def test_the_compiled_programs_multiply_in_bfloat16(tiny_model_dir):
    """The sampler's decode and the update's forward and input-gradient products take
    bfloat16 inputs after XLA's passes; float32 has none."""
    import dataclasses

    from flax import nnx

    from rlctl.core.trainer import tunix_adapter as ta
    from rlctl.core.trainer.rollout.sampler import sample_groups
    from rlctl.core.trainer.runtime import compiles

    model, info = ta.load_model(tiny_model_dir)
    graphdef, state = nnx.split(model)
    prompts = np.full((2, 8), 5, np.int32)
    comps = np.full((8, 6), 7, np.int32)
    for dtype in ("float32", BF16):
        i = dataclasses.replace(info, compute_dtype=dtype)
        sampler = (
            sample_groups.lower(
                graphdef,
                state,
                prompts,
                np.uint32(0),
                np.float32(1),
                np.float32(1),
                np.int32(0),
                info=i,
                group=4,
                max_new_tokens=6,
                pad_id=0,
                eos_ids=(1,),
            )
            .compile()
            .as_text()
        )

        def loss(state, i=i):
            return ta.shared_prefix_logps(
                nnx.merge(graphdef, state),
                prompts,
                comps,
                group=4,
                pad_id=0,
                temperature=1.0,
                info=i,
                remat=True,
                mask=comps > 0,
            )[0].sum()

        update = (
            jax.jit(jax.grad(loss))
            .lower(state)
            .compile(compiler_options=compiles.update_options(dtype))
            .as_text()
        )
        (sn, st), (un, ut) = narrow_dots(sampler), narrow_dots(update)
        if dtype == "float32":
            assert sn == un == 0 and st > 0 and ut > 0
        else:
            # decode: qkv, o, gate+up, down per layer and the head; the prefill runs
            # Tunix's layers in float32
            assert sn >= 4 * info.num_layers + 1
            # each layer's 7 projections forward, again recomputed, and their 7 input
            # gradients; the head's logits and input gradient
            assert un >= 21 * info.num_layers + 2
            assert un < ut  # the weights' gradients stay float32 (mixed._mm_backward)
