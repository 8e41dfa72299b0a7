"""The fused clipped AdamW: optax's numbers and state layout, without optax's copy of
the model in the update."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("optax")
pytestmark = pytest.mark.trainer

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from rlctl.core.trainer.update.optimizer import clipped_adamw, global_norm  # noqa: E402


def optax_reference(lr, weight_decay: float, max_norm: float):
    """What rlctl used before: optax's chain on float32 copies of everything."""
    tx = optax.chain(
        optax.clip_by_global_norm(max_norm),
        optax.adamw(lr, b1=0.9, b2=0.99, weight_decay=weight_decay),
    )
    f32 = lambda t: jax.tree.map(lambda x: x.astype(jnp.float32), t)  # noqa: E731
    return optax.GradientTransformation(
        lambda p: tx.init(f32(p)), lambda g, s, p: tx.update(f32(g), s, f32(p))
    )


@pytest.mark.parametrize(
    "lr", [1e-2, optax.linear_schedule(0.0, 1e-2, 3)], ids=["constant", "warmup"]
)
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_four_steps_equal_optax_with_and_without_clipping(lr, weight_decay):
    rng = np.random.default_rng(0)
    params = {
        "w": jnp.asarray(rng.normal(size=(5, 7)), jnp.float32),
        "b": jnp.asarray(rng.normal(size=(3,)), jnp.float32),
    }
    ref, new = (
        optax_reference(lr, weight_decay, 1.0),
        clipped_adamw(lr, b1=0.9, b2=0.99, weight_decay=weight_decay, max_norm=1.0),
    )
    s_ref, s_new = ref.init(params), new.init(params)
    assert jax.tree.structure(s_ref) == jax.tree.structure(s_new)  # checkpoints load
    p_ref = p_new = params
    for k in range(4):  # norms of about 0.5 (kept) and 15 (clipped), alternately
        size = 3.0 if k % 2 else 0.1
        g = {
            name: jnp.asarray(rng.normal(size=x.shape) * size, jnp.float32)
            for name, x in params.items()
        }
        u, s_ref = ref.update(g, s_ref, p_ref)
        p_ref = optax.apply_updates(p_ref, u)
        u, s_new = new.update(g, s_new, p_new)
        p_new = optax.apply_updates(p_new, u)
    for a, b in zip(jax.tree.leaves((p_ref, s_ref)), jax.tree.leaves((p_new, s_new)), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_bfloat16_parameters_keep_float32_moments_and_get_bfloat16_updates():
    params = {"w": jnp.ones((4, 4), jnp.bfloat16)}
    tx = clipped_adamw(1e-3, b1=0.9, b2=0.99, max_norm=1.0)
    state = tx.init(params)
    assert {x.dtype for x in jax.tree.leaves(state) if x.ndim} == {jnp.dtype(jnp.float32)}
    updates, _ = tx.update({"w": jnp.full((4, 4), 0.5, jnp.bfloat16)}, state, params)
    assert updates["w"].dtype == jnp.bfloat16


def test_the_norm_is_float32_for_bfloat16_gradients():
    g = {"a": jnp.full((300, 300), 3.0, jnp.bfloat16), "b": jnp.full((4,), 4.0)}
    assert float(global_norm(g)) == pytest.approx(np.sqrt(9 * 300 * 300 + 16 * 4))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_update_holds_no_float32_copy_of_the_gradients(dtype):
    """XLA's memory analysis of a whole optimizer step: optax's chain stored the
    clipped gradients (one float32 copy of the model); with bfloat16 parameters, the
    norm and the moments shared one float32 conversion, which XLA:CPU stored whole."""
    params = {f"w{i}": jax.ShapeDtypeStruct((1024, 1024), dtype) for i in range(8)}
    float32_copy = 8 * 1024 * 1024 * 4

    def temporaries(tx) -> int:
        state = jax.eval_shape(tx.init, params)

        def step(p, s, g):
            u, s = tx.update(g, s, p)
            return optax.apply_updates(p, u), s

        compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, params).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    assert temporaries(optax_reference(1e-3, 0.0, 1.0)) >= float32_copy
    assert temporaries(clipped_adamw(1e-3, b1=0.9, b2=0.99, max_norm=1.0)) < float32_copy / 16
    # and the trainer's step (``apply``: the updates added in the same expression)
    tx = clipped_adamw(1e-3, b1=0.9, b2=0.99, max_norm=1.0)
    state = jax.eval_shape(tx.init, params)
    # (donated as the trainer's update donates its state: outputs in the inputs' order)
    step = jax.jit(lambda p, s, g: tx.apply(g, s, p), donate_argnums=(0, 1))
    compiled = step.lower(params, state, params).compile()
    assert compiled.memory_analysis().temp_size_in_bytes < float32_copy / 16


def test_a_layers_arrays_are_one_unit_and_other_arrays_their_own():
    from rlctl.core.trainer.update.optimizer import units

    tree = {
        "embed": jnp.zeros(2),
        "layers": {i: {"a": jnp.zeros(3), "b": {"c": jnp.zeros(4)}} for i in range(3)},
        "norm": jnp.zeros(2),
    }
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    got = [[jax.tree_util.keystr(leaves[i][0]) for i in u] for u in units(tree)]
    assert got == [
        ["['embed']"],
        ["['layers'][0]['a']", "['layers'][0]['b']['c']"],
        ["['layers'][1]['a']", "['layers'][1]['b']['c']"],
        ["['layers'][2]['a']", "['layers'][2]['b']['c']"],
        ["['norm']"],
    ]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_apply_is_update_then_optax_apply_updates_on_layered_parameters(dtype):
    """``apply`` (the trainer's step: units of a layer, updates added in the same
    expression) gives what ``update`` and ``optax.apply_updates`` give (to an ulp: XLA
    may fuse the addition)."""
    rng = np.random.default_rng(1)

    def tree(scale):
        return {
            "e": jnp.asarray(rng.normal(size=(6, 4)) * scale, dtype),
            "layers": {
                i: {"w": jnp.asarray(rng.normal(size=(4, 4)) * scale, dtype)} for i in range(3)
            },
        }

    params = tree(1.0)
    tx = clipped_adamw(optax.linear_schedule(0.0, 1e-2, 3), b1=0.9, b2=0.99, max_norm=1.0)
    s1 = s2 = tx.init(params)
    p1 = p2 = params
    for k in range(3):
        g = tree(3.0 if k % 2 else 0.1)
        u, s1 = tx.update(g, s1, p1)
        p1 = optax.apply_updates(p1, u)
        p2, s2, norm = jax.jit(tx.apply)(g, s2, p2)
        assert float(norm) == pytest.approx(float(global_norm(g)), rel=1e-6)
    for a, b in zip(jax.tree.leaves((p1, s1)), jax.tree.leaves((p2, s2)), strict=True):
        np.testing.assert_allclose(
            np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-6, atol=1e-8
        )
