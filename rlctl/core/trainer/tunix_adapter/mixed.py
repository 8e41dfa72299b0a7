"""Matmuls whose inputs are read in the run's compute dtype and whose sums and output
are float32: rlctl's mixed precision (``model.compute_dtype``).

Why: a CPU with AVX512-BF16 (AMD Zen 4, Intel Cooper Lake and later) multiplies
bfloat16 pairs into float32 sums natively, and XLA:CPU (jax 0.10.2) hands a dot of
bfloat16 inputs with a float32 ``preferred_element_type`` to YNNPACK, which uses it.
On a 2-core Zen 4 EPYC that dot ran at about twice the float32 rate (2048^3: 361
against 189 GFLOP/s; the update's [768, 576] x [576, 1536]: 412 against 207; the
decode's [1536, 576] x [576, 16]: 0.21 against 0.32 ms).

Everything else stays float32: the weights and Adam's moments (``model.dtype``), the
residual stream, norms, softmax, the loss and every gradient's sum. The weights are
cast at each use (a transient copy of 2 bytes per parameter). That is why this learns
where ``model.dtype=bfloat16`` did not: an update of 1e-5 of a weight is below
bfloat16's resolution, not below float32's. (It learned less than float32 on the
default run, so ``auto`` keeps float32 on a CPU: precision.py.)

Pitfalls, each measured on that machine: XLA:CPU turns a bfloat16 dot back into a
float32 one, silently (the operands converted up, float32's speed or worse), when
  * the dot's output is bfloat16 too (what ``jnp`` gives two bfloat16 arrays: 147-155
    GFLOP/s, slower than float32; this was ``model.dtype=bfloat16``'s path), so a
    narrow dot here always asks for a float32 result;
  * it is compiled with ``xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_DOT``
    (the float32 update's setting): the narrow update uses ``INDIVIDUAL_DOT``
    (``compiles.update_options``);
  * an operand is an explicit transpose (``g @ w.T``); the same product spelled as one
    contraction over both operands' last axes is kept narrow (``dot_nt``);
  * its left operand contracts its leading axis, which every weight gradient does (a
    sum over the tokens): YNNPACK's dots take a left operand contracted on its last
    axis only, and no spelling, barrier or transposed copy inside the program kept one
    narrow, so those products are float32 (``_mm_backward``).
And after folding ``transpose(dot(a, b))`` into a dot of transposed operands it failed
at run time ("Unsupported element type for DotThunk::Execute: BF16 x BF16 = F32"):
``settle`` keeps such a dot as written. tests/core/trainer/test_mixed.py reads the
compiled programs to check which of their dots are narrow.

With a float32 compute dtype every function here is the plain float32 product, so
the float32 path is the one that ran before.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

F32 = jnp.float32


def dtype_of(name: str) -> jnp.dtype:
    """``"bfloat16"`` / ``"float32"`` as a JAX dtype."""
    return jnp.dtype(jnp.bfloat16 if name == "bfloat16" else jnp.float32)


def narrow(dtype: str) -> bool:
    """Whether ``dtype`` is narrower than float32 (the products take this module's path)."""
    return dtype_of(dtype) != F32


def settle(x: jax.Array, dtype: str) -> jax.Array:
    """``x`` (a narrow dot's output) kept as it is laid out before a transpose.

    Pitfall: XLA:CPU folds ``transpose(dot(a, b))`` into a dot of the transposed
    operands; for a bfloat16 dot with a float32 output that folded dot is not one
    YNNPACK takes, and XLA's fallback kernel then fails at run time ("Unsupported
    element type for DotThunk::Execute: BF16 x BF16 = F32"). An optimization barrier
    between the two keeps the dot as written. A float32 ``x`` passes unchanged."""
    return jax.lax.optimization_barrier(x) if narrow(dtype) else x


def dot(a: jax.Array, b: jax.Array, dtype: str) -> jax.Array:
    """``a @ b`` (numpy's matmul rules) with both read as ``dtype``, summed and returned
    in float32. For code that is not differentiated (the sampler)."""
    dt = dtype_of(dtype)
    return jnp.matmul(a.astype(dt), b.astype(dt), preferred_element_type=F32)


def mm(x: jax.Array, w: jax.Array, dtype: str) -> jax.Array:
    """``x [..., K] @ w [K, N]`` as ``dot`` computes it, float32 [..., N].

    Its input's gradient takes the same precision (``dot_nt``); its weight's gradient
    is a float32 product (see ``_mm_backward``). The gradients come back in ``x``'s
    and ``w``'s own dtypes. In float32 it is ``x @ w``, differentiated by JAX as
    before.
    """
    if not narrow(dtype):
        return jnp.matmul(x, w, preferred_element_type=F32)
    return _mm(x, w, dtype)


def dot_nt(a: jax.Array, b: jax.Array, dtype: str) -> jax.Array:
    """``a [..., K] @ b [N, K].T`` as ``dot`` computes it: the contraction spelled as one
    einsum over both last axes, which XLA:CPU hands to YNNPACK as it is (``a @ b.T``
    written with a transpose was converted back to float32: 8.1 ms against 4.0 ms for
    SmolLM2's [768, 1536] x [1536, 576] input gradient)."""
    if not narrow(dtype):
        return a @ b.T
    dt = dtype_of(dtype)
    return jnp.einsum("...k,nk->...n", a.astype(dt), b.astype(dt), preferred_element_type=F32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _mm(x: jax.Array, w: jax.Array, dtype: str) -> jax.Array:
    return dot(x, w, dtype)


def _mm_forward(x, w, dtype):
    return dot(x, w, dtype), (x, w)


def _mm_backward(dtype, saved, g):
    x, w = saved
    dx = dot_nt(g, w, dtype)
    # float32: a narrow product summed over the tokens is converted back to float32
    # by XLA:CPU whatever its spelling (the tokens are its first operand's leading
    # axis, which YNNPACK's dots do not contract); as mlp_grad's weight gradients
    dw = jnp.einsum("...k,...n->kn", x.astype(g.dtype), g)
    return dx.astype(x.dtype), dw.astype(w.dtype)


_mm.defvjp(_mm_forward, _mm_backward)
