"""Qwen3.5's NNX text model (``tunix_adapter/qwen3_5``) computes what transformers'
``Qwen3_5ForCausalLM`` does: logits (tied and untied heads, left-padded batches), greedy
decoding through its cache, a prefill continued through the cache; its two forms of the
delta rule agree; it is differentiable. A tiny random model, float32, on the CPU."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.trainer

import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from rlctl.core import families  # noqa: E402
from rlctl.core.trainer.tunix_adapter.qwen3_5 import deltanet  # noqa: E402
from rlctl.core.trainer.tunix_adapter.qwen3_5.model import (  # noqa: E402
    ModelConfig,
    Qwen3_5,
    apply_partial_rope,
    inverse_frequencies,
)

TINY = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [1, 1, 0],
        "mrope_interleaved": True,
    },
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "rms_norm_eps": 1e-6,
}
TOL = 1e-5


def _close(ours, theirs) -> None:
    """Equal to TOL, absolute or (for the tied head's logits, of tens) relative: float32
    carries 7 digits, and transformers' own float32 logits are as far from its float64
    ones as these are from its float32 ones."""
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=TOL, atol=TOL)


def _hf_model(tied: bool, seed: int = 0):
    """A tiny transformers Qwen3.5 with every parameter random (norms, A_log, dt_bias too:
    their zeros and ones would hide a misplaced ``1 +`` or a missing bias)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(**TINY, tie_word_embeddings=tied)
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(config).float().eval()
    model.set_attn_implementation("eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(0.05, 4.0).log())
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn_like(p) * 0.5)
            elif name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + torch.randn_like(p) * 0.2)
            elif name.endswith("embed_tokens.weight"):  # the tied head's too
                p.copy_(torch.randn_like(p) * 0.5)
            else:  # small, so that float32's roundoff (either side's) stays below TOL
                p.copy_(torch.randn_like(p) * 0.07)
    return model


def _hf_weights(hf, config: ModelConfig) -> dict[str, np.ndarray]:
    """The NNX parameter paths and values of ``hf``'s state dict (the converter's mapping:
    linear weights transposed, attention ones split by head, the conv's [C, 1, K] to
    [K, C]; norms' raw values)."""
    sd = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    d, h, kv, hd = config.embed_dim, config.num_heads, config.num_kv_heads, config.head_dim
    out = {
        "embedder.input_embedding": sd["model.embed_tokens.weight"],
        "final_norm.w": sd["model.norm.weight"],
    }
    if not config.use_tied_embedding:
        out["lm_head.w"] = sd["lm_head.weight"].T
    for i, kind in enumerate(config.layer_types):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        for name in ("input_layernorm", "post_attention_layernorm"):
            out[f"{dst}{name}.w"] = sd[f"{src}{name}.weight"]
        for name in ("gate_proj", "up_proj", "down_proj"):
            out[f"{dst}mlp.{name}.kernel"] = sd[f"{src}mlp.{name}.weight"].T
        if kind == "full_attention":
            a, b = f"{src}self_attn.", f"{dst}attn."
            out[b + "q_proj.w"] = sd[a + "q_proj.weight"].T.reshape(d, h, 2 * hd)
            out[b + "k_proj.w"] = sd[a + "k_proj.weight"].T.reshape(d, kv, hd)
            out[b + "v_proj.w"] = sd[a + "v_proj.weight"].T.reshape(d, kv, hd)
            out[b + "o_proj.w"] = sd[a + "o_proj.weight"].T.reshape(h, hd, d)
            out[b + "q_norm.w"] = sd[a + "q_norm.weight"]
            out[b + "k_norm.w"] = sd[a + "k_norm.weight"]
        else:
            a, b = f"{src}linear_attn.", f"{dst}linear_attn."
            for name in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"):
                out[f"{b}{name}.w"] = sd[f"{a}{name}.weight"].T
            out[b + "conv1d.w"] = sd[a + "conv1d.weight"][:, 0, :].T
            out[b + "dt_bias"] = sd[a + "dt_bias"]
            out[b + "A_log"] = sd[a + "A_log"]
            out[b + "norm.w"] = sd[a + "norm.weight"]
    return out


def _paths(tree, prefix: str = "") -> dict[str, tuple]:
    """A pure dict's leaves by dotted path, with the keys that reach them."""
    found = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            for sub, keys in _paths(value, path + ".").items():
                found[sub] = (key, *keys)
        else:
            found[path] = (key,)
    return found


def _nnx_model(hf, **overrides) -> Qwen3_5:
    """The NNX model with ``hf``'s weights, loaded by pure-dict path: every parameter the
    model has is one the mapping names, and the other way round."""
    config = ModelConfig(
        **families.family("qwen3_5_text").config_fields(hf.config.to_dict()), **overrides
    )
    model = Qwen3_5(config, rngs=nnx.Rngs(0))
    weights = _hf_weights(hf, config)
    state = nnx.state(model, nnx.Param)
    pure = nnx.to_pure_dict(state)
    paths = _paths(pure)
    assert set(paths) == set(weights)
    for path, keys in paths.items():
        node = pure
        for key in keys[:-1]:
            node = node[key]
        assert node[keys[-1]].shape == weights[path].shape, path
        node[keys[-1]] = jnp.asarray(weights[path])
    nnx.replace_by_pure_dict(state, pure)
    nnx.update(model, state)
    return model


def _batch(lengths: list[int], width: int, seed: int = 1):
    """Left-padded token rows: (tokens [B, width], real [B, width], positions [B, width])."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, TINY["vocab_size"], (len(lengths), width)).astype(np.int32)
    real = np.zeros((len(lengths), width), bool)
    for row, n in enumerate(lengths):
        real[row, width - n :] = True
    tokens[~real] = 0
    positions = np.maximum(np.cumsum(real, axis=1) - 1, 0).astype(np.int32)
    return tokens, real, positions


def _mask(real: np.ndarray, size: int | None = None, start: int = 0) -> np.ndarray:
    """Tunix's attention mask for queries ``start..start+L`` over ``size`` slots:
    causal & real[j]; ``real`` covers the slots written so far (the rest are unwritten)."""
    b, written = real.shape
    size = size or written
    length = written - start
    slots = np.zeros((b, size), bool)
    slots[:, :written] = real
    causal = np.arange(size)[None, :] <= (start + np.arange(length))[:, None]
    return causal[None] & slots[:, None, :]


def _hf_logits(hf, tokens, real, positions) -> np.ndarray:
    with torch.no_grad():
        out = hf(
            input_ids=torch.from_numpy(tokens).long(),
            attention_mask=torch.from_numpy(real).long(),
            position_ids=torch.from_numpy(positions).long(),
            use_cache=False,
        )
    return out.logits.numpy()


def _forward(model: Qwen3_5):
    """The model's call, jitted (the weights an argument): (logits, cache, the sown
    final-norm output)."""
    graphdef, state = nnx.split(model)

    @jax.jit
    def call(state, tokens, positions, cache, mask):
        inner = nnx.merge(graphdef, state)
        logits, cache = inner(tokens, positions, cache, mask, output_hidden_states=True)
        (hidden,) = nnx.pop(inner, nnx.Intermediate)["all_hidden_states"]
        return logits, cache, hidden

    return lambda *args: call(state, *args)


@pytest.fixture(scope="module")
def untied():
    hf = _hf_model(tied=False)
    return hf, _nnx_model(hf)


@pytest.mark.parametrize("tied", [False, True])
def test_logits_equal_transformers(tied, untied):
    """Every position's logits, an unpadded batch, both heads; and the sown hidden
    states are transformers' final-norm output."""
    hf, model = untied if not tied else (lambda h: (h, _nnx_model(h)))(_hf_model(tied=True))
    assert hasattr(model, "lm_head") != tied
    tokens, real, positions = _batch([19, 19], 19)
    ours, _, hidden = _forward(model)(tokens, positions, None, _mask(real))
    _close(ours, _hf_logits(hf, tokens, real, positions))
    with torch.no_grad():
        theirs = hf.model(input_ids=torch.from_numpy(tokens).long(), use_cache=False)
    _close(hidden, theirs.last_hidden_state.numpy())


def test_left_padding_equals_transformers(untied):
    """A batch of two, the second left-padded by 3: the real positions' logits are
    transformers' with its attention mask (the DeltaNet zeroes its pads' inputs)."""
    hf, model = untied
    tokens, real, positions = _batch([17, 14], 17)
    ours, _, _ = _forward(model)(tokens, positions, None, _mask(real))
    theirs = _hf_logits(hf, tokens, real, positions)
    _close(np.asarray(ours)[real], theirs[real])
    # the padded row equals itself unpadded
    alone = _hf_logits(hf, tokens[1:, 3:], real[1:, 3:], positions[1:, 3:])
    _close(np.asarray(ours)[1, 3:], alone[0])


def test_chunked_equals_recurrent():
    """The chunked delta rule is the recurrent one: a length not a multiple of the chunk,
    an initial state; chunks of 4 and 64 agree, outputs and final states."""
    rng = np.random.default_rng(3)
    b, t, h, dk, dv = 2, 37, 3, 8, 6

    def normal(*shape):
        return rng.normal(size=shape).astype(np.float32)

    q, k, v = normal(b, t, h, dk), normal(b, t, h, dk), normal(b, t, h, dv)
    g = -np.abs(normal(b, t, h)) * 0.5
    beta = 1 / (1 + np.exp(-normal(b, t, h)))
    s0 = normal(b, h, dk, dv)
    recurrent = jax.jit(deltanet.recurrent_gated_delta_rule)
    chunked = jax.jit(deltanet.chunk_gated_delta_rule, static_argnames="chunk_size")
    ref_out, ref_state = recurrent(q, k, v, g, beta, initial_state=s0)
    for chunk in (4, 64):
        out, state = chunked(q, k, v, g, beta, initial_state=s0, chunk_size=chunk)
        np.testing.assert_allclose(np.asarray(out), np.asarray(ref_out), rtol=0, atol=TOL)
        np.testing.assert_allclose(np.asarray(state), np.asarray(ref_state), rtol=0, atol=TOL)
    # and both are transformers' kernels
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    t_ = torch.from_numpy
    theirs, their_state = hf.torch_chunk_gated_delta_rule(
        t_(q), t_(k), t_(v), t_(g), t_(beta), chunk_size=16, initial_state=t_(s0),
        output_final_state=True, use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    np.testing.assert_allclose(np.asarray(ref_out), theirs.numpy(), rtol=0, atol=TOL)
    np.testing.assert_allclose(np.asarray(ref_state), their_state.numpy(), rtol=0, atol=TOL)


def test_rope_is_transformers_mrope_for_text():
    """Transformers' interleaved multimodal rope, given text's position ids (the same in
    all three sections), is 1-D rope over the rotary dims: a real model's head (256 dims,
    a quarter rotating, sections 11/11/10) at positions to 30,000. Its frequencies are
    transformers' to an ulp (its float32 ``pow`` and numpy's round a few differently; at
    position 30,000 an ulp is 4e-3 of angle), so the rotation is compared on ours."""
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import (
        Qwen3_5TextRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    theta = 10_000_000.0
    config = Qwen3_5TextConfig(
        head_dim=256,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": theta,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
    )
    rotary = Qwen3_5TextRotaryEmbedding(config)
    inv = inverse_frequencies(64, theta)
    np.testing.assert_allclose(inv, rotary.inv_freq.numpy(), rtol=2.5e-7, atol=0)
    rotary.inv_freq = torch.from_numpy(inv)
    rng = np.random.default_rng(4)
    positions = np.stack([np.arange(6), rng.integers(0, 30_000, 6)]).astype(np.int32)
    x = rng.normal(size=(2, 6, 3, 256)).astype(np.float32)
    xt = torch.from_numpy(x).transpose(1, 2)
    cos, sin = rotary(xt, torch.from_numpy(positions).long())
    theirs, _ = apply_rotary_pos_emb(xt, xt, cos, sin)
    ours = apply_partial_rope(jnp.asarray(x), jnp.asarray(positions), 64, theta)
    np.testing.assert_allclose(np.asarray(ours), theirs.transpose(1, 2).numpy(), rtol=0, atol=TOL)
    np.testing.assert_array_equal(np.asarray(ours)[..., 64:], x[..., 64:])


def test_greedy_decode_equals_generate(untied):
    """32 greedy tokens through the cache (a prefill gives the first, then 31 one-token
    steps: the recurrent delta rule and the conv's update) are transformers'
    ``generate(do_sample=False)`` on the same left-padded batch."""
    hf, model = untied
    new = 32
    tokens, real, positions = _batch([9, 6], 9, seed=2)
    with torch.no_grad():
        theirs = hf.generate(
            input_ids=torch.from_numpy(tokens).long(),
            attention_mask=torch.from_numpy(real).long(),
            do_sample=False,
            max_new_tokens=new,
            min_new_tokens=new,
            pad_token_id=0,
        )[:, tokens.shape[1] :].numpy()
    forward = _forward(model)
    width = tokens.shape[1]
    size = width + new
    cache = model.init_cache(2, size, jnp.float32)
    logits, cache, _ = forward(tokens, positions, cache, _mask(real, size))
    ours = [np.asarray(jnp.argmax(logits[:, -1], -1))]
    seen = real
    pos = positions[:, -1:]
    for step in range(new - 1):
        seen = np.concatenate([seen, np.ones((2, 1), bool)], axis=1)
        pos = pos + 1
        mask = _mask(seen, size, start=width + step)
        logits, cache, _ = forward(ours[-1][:, None].astype(np.int32), pos, cache, mask)
        ours.append(np.asarray(jnp.argmax(logits[:, -1], -1)))
    np.testing.assert_array_equal(np.stack(ours, 1), theirs)


def test_prefill_continued_through_cache_equals_one_call(untied):
    """A left-padded prompt prefilled into the cache, then 9 more tokens in one call, gives
    the logits and DeltaNet states of one call over the whole (chunks of 4: the second
    call starts mid-chunk from the cached state and conv context)."""
    hf, _ = untied
    model = _nnx_model(hf, chunk_size=4)
    forward = _forward(model)
    tokens, real, positions = _batch([14, 11], 14, seed=6)
    prompt = 5
    size = 16
    whole, whole_cache, _ = forward(
        tokens, positions, model.init_cache(2, size, jnp.float32), _mask(real, size)
    )
    first, cache, _ = forward(
        tokens[:, :prompt], positions[:, :prompt], model.init_cache(2, size, jnp.float32),
        _mask(real[:, :prompt], size),
    )  # fmt: skip
    rest, cache, _ = forward(
        tokens[:, prompt:], positions[:, prompt:], cache, _mask(real, size, start=prompt)
    )
    both = np.concatenate([np.asarray(first), np.asarray(rest)], axis=1)
    _close(both[real], np.asarray(whole)[real])
    for name, layer in cache.items():
        for key, value in layer.items():
            ours, theirs = np.asarray(value), np.asarray(whole_cache[name][key])
            if key in ("k", "v"):  # a pad's slot is never read
                ours, theirs = ours[:, : real.shape[1]][real], theirs[:, : real.shape[1]][real]
            np.testing.assert_allclose(ours, theirs, rtol=0, atol=TOL, err_msg=f"{name}.{key}")
    # and the whole call is transformers'
    theirs = _hf_logits(hf, tokens, real, positions)
    _close(np.asarray(whole)[real], theirs[real])


def test_differentiable(untied):
    """``jax.grad`` of the tokens' summed log-probs, jitted: finite for every parameter,
    and not zero for the DeltaNet's own (A_log, dt_bias, the conv, the gated norm)."""
    _, model = untied
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tokens, real, positions = _batch([12, 9], 12, seed=7)
    mask = _mask(real)

    @jax.jit
    def grads(params):
        def loss(params):
            logits, _ = nnx.merge(graphdef, params, rest)(tokens, positions, None, mask)
            logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
            picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
            return jnp.sum(picked * real[:, 1:])

        return jax.grad(loss)(params)

    tree = nnx.to_pure_dict(grads(params))
    own = ("conv1d.w", "norm.w", "A_log", "dt_bias")
    for path, keys in _paths(tree).items():
        node = tree
        for key in keys:
            node = node[key]
        value = np.asarray(node)
        assert np.all(np.isfinite(value)), path
        if "linear_attn" in path and path.endswith(own):
            assert np.any(value != 0), path


def test_the_familys_mapping_builds_its_config():
    """The family's mapping (what load_model builds the model from) reads transformers'
    fields: a ``text_config`` nested in a Qwen3_5Config dict, legacy top-level rope
    fields, and layer types from ``full_attention_interval``."""
    fields = families.family("qwen3_5_text").config_fields(
        {
            "model_type": "qwen3_5",
            "tie_word_embeddings": True,
            "text_config": {
                **{k: v for k, v in TINY.items() if k not in ("layer_types", "rope_parameters")},
                "num_hidden_layers": 6,
                "full_attention_interval": 3,
                "rope_theta": 5e6,
                "partial_rotary_factor": 0.5,
            },
        }
    )
    config = ModelConfig(**fields)
    assert config.layer_types == ("linear_attention", "linear_attention", "full_attention") * 2
    assert (config.rope_theta, config.rotary_dim, config.use_tied_embedding) == (5e6, 8, True)
    assert dataclasses.replace(config, chunk_size=8) != config
    hash(config)


@pytest.mark.parametrize("c", [1, 4, 48, 64])
def test_the_chunks_inverse_is_by_matmuls_and_exact(c):
    """``(I + a)^-1`` of a strictly lower ``a`` as the chunked rule builds it (entries up
    to 1: l2-normed keys, beta and decay at most 1), without a triangular solve (jaxlib's
    CPU solve deadlocked two concurrent solves on a 2-thread pool)."""
    rng = np.random.default_rng(c)
    a = np.tril(rng.uniform(-1, 1, (3, c, c)), -1).astype(np.float32)
    inv = np.asarray(deltanet.unit_lower_inverse(jnp.asarray(a)))
    eye = np.broadcast_to(np.eye(c, dtype=np.float32), a.shape)
    want = np.linalg.inv((eye + a).astype(np.float64))
    np.testing.assert_allclose(inv, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
