"""mlp_grad: the MLP's spelled-out gradient is JAX's, and the decoder layer built on it
is Tunix's layer, forward and backward."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.trainer


def mlp_case(seed: int, d: int, f: int, rows: tuple[int, int], scale: float):
    """(wg, wu, wd, x, dy) of a random gated MLP [d -> f -> d] over rows x d inputs."""
    import jax

    k = jax.random.split(jax.random.PRNGKey(seed), 5)
    wg, wu = (jax.random.normal(k[i], (d, f)) * scale for i in (0, 1))
    wd = jax.random.normal(k[2], (f, d)) * scale
    return (wg, wu, wd, jax.random.normal(k[3], (*rows, d)), jax.random.normal(k[4], (*rows, d)))


def test_the_gated_mlps_gradients_are_jaxs():
    import jax
    import jax.numpy as jnp

    from rlctl.core.trainer.tunix_adapter.llama.mlp_grad import gated_mlp

    wg, wu, wd, x, dy = mlp_case(0, 8, 24, (3, 5), 0.3)

    def plain(wg, wu, wd, x):
        return (jax.nn.silu(x @ wg) * (x @ wu)) @ wd

    ours = jax.grad(lambda *a: (gated_mlp("float32", *a) * dy).sum(), argnums=(0, 1, 2, 3))
    theirs = jax.grad(lambda *a: (plain(*a) * dy).sum(), argnums=(0, 1, 2, 3))
    np.testing.assert_allclose(gated_mlp("float32", wg, wu, wd, x), plain(wg, wu, wd, x), rtol=1e-6)
    for a, b in zip(ours(wg, wu, wd, x), theirs(wg, wu, wd, x), strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert not jnp.allclose(ours(wg, wu, wd, x)[0], 0)


def test_in_bfloat16_it_is_float32s_within_bfloat16s_precision():
    """Mixed precision (tunix_adapter/mixed.py): bfloat16 inputs, float32 sums, and
    every gradient back in float32."""
    import jax
    import jax.numpy as jnp

    from rlctl.core.trainer.tunix_adapter.llama.mlp_grad import gated_mlp

    wg, wu, wd, x, dy = mlp_case(1, 32, 80, (4, 9), 0.2)

    def rel(a, b):
        return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))

    def grads(dtype):
        return jax.grad(lambda *a: (gated_mlp(dtype, *a) * dy).sum(), argnums=(0, 1, 2, 3))(
            wg, wu, wd, x
        )

    narrow, wide = (gated_mlp(dt, wg, wu, wd, x) for dt in ("bfloat16", "float32"))
    assert 1e-4 < rel(narrow, wide) < 1e-2  # read narrow, and close
    for a, b in zip(grads("bfloat16"), grads("float32"), strict=True):
        assert a.dtype == b.dtype == jnp.float32
        assert rel(a, b) < 2e-2


def test_the_decoder_layer_is_tunixs_forward_and_backward(tiny_model_dir):
    import jax
    from flax import nnx

    from rlctl.core.trainer import tunix_adapter as ta
    from rlctl.core.trainer.tunix_adapter.llama.mlp_grad import decoder_layer

    model, _ = ta.load_model(tiny_model_dir)
    layer = model.layers[0]
    B, L, D = 2, 6, model.config.embed_dim
    x = jax.random.normal(jax.random.PRNGKey(1), (B, L, D))
    positions = jax.numpy.broadcast_to(jax.numpy.arange(L), (B, L))
    mask = jax.numpy.tril(jax.numpy.ones((L, L), bool))[None].repeat(B, 0)
    dy = jax.random.normal(jax.random.PRNGKey(2), (B, L, D))
    graphdef, state = nnx.split(layer)

    def loss(state, x, own):
        m = nnx.merge(graphdef, state)
        out = (
            decoder_layer(m, x, positions, None, mask)[1] if own else m(x, positions, None, mask)[1]
        )
        return (out * dy).sum()

    (l1, g1), (l2, g2) = (
        jax.value_and_grad(loss, argnums=(0, 1))(state, x, own) for own in (True, False)
    )
    assert float(l1) == pytest.approx(float(l2), rel=1e-6)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_the_update_takes_it_for_plain_llama_and_not_with_lora(tiny_model_dir, monkeypatch):
    """LoRA's adapters are added by qwix inside the layer's own projections, which the
    spelled-out MLP would skip: a LoRA model's update runs Tunix's layer."""
    from types import SimpleNamespace

    from rlctl.core.trainer import tunix_adapter as ta
    from rlctl.core.trainer.tunix_adapter import logprobs
    from rlctl.core.trainer.tunix_adapter.lora import apply_lora

    calls = []
    real = logprobs.decoder_layer
    monkeypatch.setattr(logprobs, "decoder_layer", lambda *a, **k: calls.append(1) or real(*a, **k))
    prompts = np.full((1, 4), 5, np.int32)
    comps = np.full((2, 3), 7, np.int32)

    def logps(model, info):
        calls.clear()
        ta.shared_prefix_logps(model, prompts, comps, group=2, pad_id=0, temperature=1.0, info=info)
        return len(calls)

    model, info = ta.load_model(tiny_model_dir)
    assert logps(model, info) == 2 * info.num_layers  # prompts, then completions
    lora = apply_lora(
        ta.load_model(tiny_model_dir)[0],
        "llama",
        SimpleNamespace(lora_rank=4, lora_alpha=8.0, lora_target_modules=["gate_proj", "up_proj"]),
    )
    assert logps(lora, info) == 0
