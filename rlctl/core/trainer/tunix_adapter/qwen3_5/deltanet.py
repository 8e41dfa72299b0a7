"""The gated delta rule and the causal depthwise conv1d of Qwen3.5's linear-attention layers
(transformers' ``Qwen3_5GatedDeltaNet``), as pure JAX functions.

The rule keeps a state ``S`` [dk, dv] per head and, for each token, decays it by
``exp(g)``, then corrects what it recalls for the key toward the value:
``S <- exp(g) S + k (beta (v - k^T exp(g) S))^T``; the output is ``q^T S``.

Two forms compute it:
  * ``chunk_gated_delta_rule`` (prefill, training): the sequence in chunks of
    ``chunk_size``; within a chunk the tokens' mutual corrections are one unit lower
    triangular solve, shared by every chunk at once, and a ``lax.scan`` carries the state
    from chunk to chunk. Work is quadratic in the chunk only, and every exponent is of a
    difference that is <= 0, so nothing overflows however strong the decay.
  * ``recurrent_gated_delta_rule`` (decode): a ``lax.scan`` over the tokens, as written.

Both mirror transformers' ``torch_chunk_gated_delta_rule`` and
``torch_recurrent_gated_delta_rule`` with ``use_qk_l2norm_in_kernel=True``: float32
throughout, q and k l2-normalised (eps 1e-6), q scaled by ``dk ** -0.5``.
Inputs are token-major as transformers': q, k [B, T, H, dk], v [B, T, H, dv],
g, beta [B, T, H] (q and k already repeated to the value heads).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

F32 = jnp.float32
# The rule's products in full float32: an accelerator's default (bf16 passes on a TPU,
# TF32 on a GPU) would compound through the recurrence over a long sequence.
PRECISION = jax.lax.Precision.HIGHEST


def l2norm(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """``x / sqrt(sum(x^2) + eps)`` over the last axis (FLA's and transformers' l2norm)."""
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def _prepare(
    q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array, use_qk_l2norm: bool
) -> tuple[jax.Array, ...]:
    """The inputs in float32, head-major ([B, H, T, ...]), q and k normalised, q scaled."""
    q, k, v, g, beta = (x.astype(F32) for x in (q, k, v, g, beta))
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    q = q * (q.shape[-1] ** -0.5)
    q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))
    g, beta = (jnp.swapaxes(x, 1, 2) for x in (g, beta))
    return q, k, v, g, beta


def _initial(initial_state: jax.Array | None, k: jax.Array, v: jax.Array) -> jax.Array:
    b, h, _, dk = k.shape
    if initial_state is None:
        return jnp.zeros((b, h, dk, v.shape[-1]), F32)
    return initial_state.astype(F32)


def recurrent_gated_delta_rule(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    initial_state: jax.Array | None = None,
    use_qk_l2norm: bool = True,
) -> tuple[jax.Array, jax.Array]:
    """The rule token by token: (output [B, T, H, dv] float32, final state [B, H, dk, dv])."""
    q, k, v, g, beta = _prepare(q, k, v, g, beta, use_qk_l2norm)
    state = _initial(initial_state, k, v)

    def step(s: jax.Array, xs: tuple[jax.Array, ...]) -> tuple[jax.Array, jax.Array]:
        q_t, k_t, v_t, g_t, b_t = xs
        s = s * jnp.exp(g_t)[..., None, None]
        recalled = jnp.einsum("bhkv,bhk->bhv", s, k_t, precision=PRECISION)
        delta = (v_t - recalled) * b_t[..., None]
        s = s + k_t[..., :, None] * delta[..., None, :]
        return s, jnp.einsum("bhkv,bhk->bhv", s, q_t, precision=PRECISION)

    # time-major for the scan: [T, B, H, ...]
    xs = tuple(jnp.moveaxis(x, 2, 0) for x in (q, k, v, g, beta))
    state, out = jax.lax.scan(step, state, xs)
    return jnp.moveaxis(out, 0, 1), state  # [B, T, H, dv]


def chunk_gated_delta_rule(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    initial_state: jax.Array | None = None,
    chunk_size: int = 64,
    use_qk_l2norm: bool = True,
) -> tuple[jax.Array, jax.Array]:
    """The rule chunk by chunk: (output [B, T, H, dv] float32, final state [B, H, dk, dv]).

    The sequence is padded at its end to a multiple of ``chunk_size`` with k = v = beta =
    g = 0: a padded token neither decays the state (g = 0) nor writes to it (k = 0), so
    the final state is the last real token's.
    """
    q, k, v, g, beta = _prepare(q, k, v, g, beta, use_qk_l2norm)
    state = _initial(initial_state, k, v)
    b, h, t, _ = k.shape
    dv = v.shape[-1]
    c = chunk_size
    pad = (-t) % c
    n = (t + pad) // c

    def chunks(x: jax.Array) -> jax.Array:
        # [B, H, T, ...] -> [N, B, H, C, ...] (chunks leading, for the scan)
        x = jnp.pad(x, [(0, 0), (0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 3))
        x = x.reshape(b, h, n, c, *x.shape[3:])
        return jnp.moveaxis(x, 2, 0)

    q, k, v, g, beta = (chunks(x) for x in (q, k, v, g, beta))
    cum = jnp.cumsum(g, axis=-1)  # [N, B, H, C]: the decay from the chunk's start
    lower = jnp.tril(jnp.ones((c, c), bool))
    strict = jnp.tril(jnp.ones((c, c), bool), -1)
    diff = cum[..., :, None] - cum[..., None, :]
    # exp(cum_i - cum_j) for j <= i; the masked exponent is 0 first, so that the upper
    # triangle's (positive, possibly huge) differences give no inf, nor a nan gradient
    decay = jnp.where(lower, jnp.exp(jnp.where(lower, diff, 0.0)), 0.0)
    k_beta = k * beta[..., None]
    v_beta = v * beta[..., None]
    # The tokens' corrections of one another within a chunk: (I + A) X = RHS with A the
    # strictly lower beta_i k_i.k_j decay_ij (transformers' row-by-row loop computes
    # (I + A)^-1 by forward substitution).
    a = jnp.einsum("...id,...jd->...ij", k_beta, k, precision=PRECISION)
    a = jnp.where(strict, a * decay, 0.0)
    rhs = jnp.concatenate([v_beta, k_beta * jnp.exp(cum)[..., None]], axis=-1)
    solved = jnp.einsum("...ij,...jd->...id", unit_lower_inverse(a), rhs, precision=PRECISION)
    u, w = solved[..., :dv], solved[..., dv:]  # the corrected values; their state reads
    qk = jnp.einsum("...id,...jd->...ij", q, k, precision=PRECISION) * decay
    q_decayed = q * jnp.exp(cum)[..., None]
    k_to_end = k * jnp.exp(cum[..., -1:] - cum)[..., None]
    chunk_decay = jnp.exp(cum[..., -1])[..., None, None]

    def step(s: jax.Array, xs: tuple[jax.Array, ...]) -> tuple[jax.Array, jax.Array]:
        qk_i, q_i, u_i, w_i, k_i, decay_i = xs
        v_new = u_i - jnp.einsum("...ck,...kv->...cv", w_i, s, precision=PRECISION)
        out = jnp.einsum("...ck,...kv->...cv", q_i, s, precision=PRECISION) + jnp.einsum(
            "...ij,...jv->...iv", qk_i, v_new, precision=PRECISION
        )
        s = s * decay_i + jnp.einsum("...ck,...cv->...kv", k_i, v_new, precision=PRECISION)
        return s, out

    state, out = jax.lax.scan(step, state, (qk, q_decayed, u, w, k_to_end, chunk_decay))
    # [N, B, H, C, dv] -> [B, T, H, dv]
    out = jnp.moveaxis(out, 0, 2).reshape(b, h, n * c, dv)[:, :, :t]
    return jnp.swapaxes(out, 1, 2), state


def unit_lower_inverse(a: jax.Array) -> jax.Array:
    """``(I + a)^-1`` of strictly lower triangular ``a`` [..., C, C], by matmuls only.

    ``a`` is nilpotent (``a^C = 0``), so ``(I + a)^-1 = sum_k (-a)^k = (I - a)(I + a^2)
    (I + a^4) ... (I + a^(2^(m-1)))`` with ``2^m >= C``: log2(C) squarings (6 for a
    chunk of 64), each a batched matmul.

    Why not ``lax.linalg.triangular_solve``: on the CPU, jaxlib's LAPACK kernel
    (``TriMatrixEquationSolver``) splits its batch over XLA's intra-op thread pool and
    waits for it (``ParallelBatchMap``); two such solves run at once by XLA:CPU's thunk
    executor (every DeltaNet layer of one program has one) each held a thread of the
    2-core machine's pool and waited for the other's: the update deadlocked, idle, in
    about 4 runs of 6 (jax 0.10.2)."""
    c = a.shape[-1]
    eye = jnp.eye(c, dtype=a.dtype)
    out = eye - a
    power = a
    span = 2
    while span < c:
        power = jnp.einsum("...ij,...jk->...ik", power, power, precision=PRECISION)
        out = jnp.einsum("...ij,...jk->...ik", out, eye + power, precision=PRECISION)
        span *= 2
    return out


def causal_conv1d(
    x: jax.Array, w: jax.Array, state: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
    """The depthwise causal conv1d then SiLU of the layer's q, k, v channels.

    ``x`` [B, T, C], ``w`` [K, C] (transformers' ``conv1d.weight`` [C, 1, K] transposed),
    ``state`` [B, K-1, C]: the K-1 inputs before ``x`` (zeros, or None, at a sequence's
    start). Returns (``silu(conv)`` [B, T, C] in x's dtype, the new state: the last K-1
    inputs of ``state ++ x``). One form for prefill and decode: with T = 1 it is
    transformers' ``causal_conv1d_update``. Sums in float32, as torch's conv accumulates.
    """
    kernel = w.shape[0]
    b, t, c = x.shape
    if state is None:
        state = jnp.zeros((b, kernel - 1, c), x.dtype)
    full = jnp.concatenate([state.astype(x.dtype), x], axis=1)  # [B, K-1+T, C]
    wf = w.astype(F32)
    out = sum(full[:, i : i + t].astype(F32) * wf[i] for i in range(kernel))
    new_state = full[:, full.shape[1] - (kernel - 1) :]
    return jax.nn.silu(jnp.asarray(out).astype(x.dtype)), new_state
