"""rlctl's rollout sampler: each group's prompt prefilled once, its completions
decoded together from the shared KV cache, and decoding stopped as soon as every
row has emitted a stop token.

A GRPO step samples G completions of each of P prompts. Tunix's sampler runs
the P*G repeated prompts through the model and projects every prompt position
onto the vocabulary; here the P prompts go through the model once (as the
update does: ``tunix_adapter.shared_prefix_logps``), only their last position is
projected, and the cache is repeated G times for the decode loop.

One jitted program (``sample_groups``) covers prefill and decode. Temperature,
top-p and top-k are traced values, so greedy evaluation and sampled training
share a program whenever their shapes agree; the weights are its arguments,
never constants baked into it.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlctl.core.trainer import tunix_adapter as ta
from rlctl.core.trainer.rollout.rollout_engine import Drawn  # what a call returns, every engine's
from rlctl.core.trainer.runtime.numerics import Numerics
from rlctl.core.trainer.tunix_adapter.kv_cache import repeat_rows
from rlctl.core.trainer.tunix_adapter.llama import decode
from rlctl.core.trainer.tunix_adapter.llama import layers as layers_lib
from rlctl.core.trainer.tunix_adapter.logprobs import softcapped
from rlctl.core.trainer.tunix_adapter.mixed import dot, dot_nt

if TYPE_CHECKING:
    from rlctl.core.trainer.rollout.rollout_engine import EngineSetup


def _logits(model: Any, hidden: jax.Array, dtype: str, cap: float | None = None) -> jax.Array:
    """Float32 logits of the last position of ``hidden`` [B, L, D], computed like
    ``tunix_adapter.token_logps`` (its inputs read as ``dtype``, soft-capped by
    ``cap``) so the log-probs of both agree."""
    return softcapped(dot(hidden[:, -1, :], ta.head_weight(model), dtype), cap)


DRAW_BLOCK = 256  # vocabulary entries per block of ``_draw``'s two-level search


def _draw(key: jax.Array, scaled: jax.Array) -> jax.Array:
    """A token of each row drawn from softmax(``scaled``) by inverting its CDF with one
    uniform per row: ``jax.random.categorical`` draws a Gumbel per vocabulary entry,
    16 ms a step for 16 x 49152 on CPU (a sixth of SmolLM2's decode step).

    The CDF is searched in two levels: the mass of each block of ``DRAW_BLOCK``
    entries and their running sum pick the block, then a running sum inside that one
    block picks the token. A running sum over the whole vocabulary is what XLA:CPU
    does slowly (a reduce-window: 3.5 ms for 16 x 49152 against 0.6 ms this way,
    a 2-core Zen 4 EPYC; the same tokens in 800 draws). The token picked never lies
    past its block's last entry of positive probability, nor the block past the last
    block of positive mass, so rounding between the two sums never draws a masked
    (-inf) token."""
    B, V = scaled.shape
    W = DRAW_BLOCK
    n = -(-V // W)
    p = jax.nn.softmax(scaled, axis=-1)
    blocks = jnp.pad(p, ((0, 0), (0, n * W - V))).reshape(B, n, W)
    mass = blocks.sum(-1)  # [B, n]
    cum = jnp.cumsum(mass, axis=-1)
    u = jax.random.uniform(key, (B, 1)) * cum[:, -1:]
    last_block = jnp.max(jnp.where(mass > 0, jnp.arange(n), 0), axis=-1)
    block = jnp.minimum((cum <= u).sum(-1), last_block)
    inside = jnp.take_along_axis(blocks, block[:, None, None], axis=1)[:, 0]  # [B, W]
    rest = u[:, 0] - jnp.take_along_axis(cum - mass, block[:, None], axis=1)[:, 0]
    last = jnp.max(jnp.where(inside > 0, jnp.arange(W), 0), axis=-1)
    offset = jnp.minimum((jnp.cumsum(inside, axis=-1) <= rest[:, None]).sum(-1), last)
    return block * W + offset


def _filtered(key: jax.Array, scaled: jax.Array, top_p: jax.Array, top_k: jax.Array) -> jax.Array:
    """A token from the top-k tokens (k <= 0: all), then the smallest set of those
    whose probability reaches ``top_p`` (Tunix's rule: a token stays while the mass
    before it is at most top_p). Sorting the vocabulary costs a few ms per step on
    CPU, so only this branch of the switch in ``_choose`` pays it."""
    V = scaled.shape[-1]
    ranked = -jnp.sort(-scaled, axis=-1)  # descending
    rank = jnp.arange(V)[None, :]
    k = jnp.where(top_k > 0, jnp.minimum(top_k, V), V)
    in_k = rank < k
    probs = jax.nn.softmax(jnp.where(in_k, ranked, -jnp.inf), axis=-1)
    kept = in_k & (jnp.cumsum(probs, axis=-1) - probs <= top_p)
    last = jnp.maximum(kept.sum(-1, keepdims=True) - 1, 0)
    threshold = jnp.take_along_axis(ranked, last, axis=-1)
    return _draw(key, jnp.where(scaled >= threshold, scaled, -jnp.inf))


def _choose(
    key: jax.Array,
    logits: jax.Array,
    temperature: jax.Array,
    top_p: jax.Array,
    top_k: jax.Array,
    filtering: bool = True,
) -> tuple[jax.Array, jax.Array]:
    """The next token of each row [B] and its log-prob under ``temperature``
    (1 when greedy, as ``shared_prefix_logps`` computes it), unfiltered by top-p/k.

    temperature 0 is greedy (argmax); the mode is a traced ``switch``, so one
    program serves every sampling setting and runs only the branch it needs.
    ``filtering`` (static): whether top-p/top-k can be asked of the program at all. A
    run that never filters (top_p 1, no top_k: the default) compiles no filtering
    branch: its sort over the vocabulary was 40% of the sampler's compile for an H200
    (16.4 s against 9.8 s, a 2-layer model of SmolLM2's width, compiled without the
    GPU; bench/bench_compile.py), every branch of a switch being compiled."""
    greedy = temperature <= 0
    t = jnp.where(greedy, 1.0, temperature)
    scaled = logits / t
    branches = [
        lambda: jnp.argmax(logits, axis=-1).astype(jnp.int32),
        lambda: _draw(key, scaled).astype(jnp.int32),
    ]
    mode = jnp.where(greedy, 0, 1)
    if filtering:
        branches.append(lambda: _filtered(key, scaled, top_p, top_k).astype(jnp.int32))
        mode = jnp.where(greedy, 0, jnp.where((top_p < 1.0) | (top_k > 0), 2, 1))
    token = jax.lax.switch(mode, branches)
    logp = jnp.take_along_axis(jax.nn.log_softmax(scaled, axis=-1), token[:, None], -1)[:, 0]
    return token, logp


@partial(
    jax.jit,
    static_argnames=(
        "graphdef",
        "info",
        "group",
        "max_new_tokens",
        "pad_id",
        "eos_ids",
        "weights_first",
        "scan",
        "filtering",
    ),
)
def sample_groups(
    graphdef: Any,
    state: Any,
    prompt_ids: jax.Array,
    seed: jax.Array,
    temperature: jax.Array,
    top_p: jax.Array,
    top_k: jax.Array,
    *,
    info: ta.ModelInfo,
    group: int,
    max_new_tokens: int,
    pad_id: int,
    eos_ids: tuple[int, ...],
    weights_first: bool = True,
    scan: bool = False,
    filtering: bool = True,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``group`` completions of each left-padded prompt of ``prompt_ids`` [P, Lp].

    Llama-family models decode through ``tunix_adapter.llama.decode`` (its weights laid
    out for a few rows: about 2x faster on CPU) where ``weights_first`` (the numerics
    table's CPU choice) and the model has no LoRA adapters; else through the model's
    layers. Both draw the same tokens (tested). ``scan``: a plain Llama's layers run
    as one scanned body in the prefill and that decode (``tunix_adapter.llama.layers``),
    so the program holds one layer whatever the depth, the decode's products reading
    the sampler's compute dtype; unrolled, they are Tunix's own layers. ``filtering``:
    whether the program can filter by top-p/top-k (``_choose``).

    Returns (tokens [P*G, N], log-probs [P*G, N], decode iterations run). A row's
    stop token is kept; after it come ``pad_id`` and log-prob 0. The PRNG key of
    token j is ``fold_in(PRNGKey(seed), j)``: the same seed draws the same tokens.
    """
    P, Lp = prompt_ids.shape
    B, N, S = P * group, max_new_tokens, prompt_ids.shape[1] + max_new_tokens
    key = jax.random.PRNGKey(seed)
    eos = jnp.asarray(eos_ids, jnp.int32)
    pmask = prompt_ids != pad_id
    model = nnx.merge(graphdef, state)
    # positions count real tokens only; a query sees the real keys up to itself
    positions = jnp.maximum(jnp.cumsum(pmask, axis=-1) - 1, 0)
    causal = jnp.tril(jnp.ones((Lp, Lp), jnp.bool_))
    mask = jnp.pad(pmask[:, None, :] & causal[None], ((0, 0), (0, 0), (0, N)))
    scanning = scan and layers_lib.scans(model, info)
    hidden, cache = ta.trunk(
        model,
        prompt_ids,
        positions,
        ta.kv_cache(info, P, S, stacked=scanning, model=model),
        mask,
        scan=scanning,
    )
    decodes = weights_first and decode.fits(model, info)  # Llama: weights first (decode.py)
    # laid out once per call; the prompts' first tokens are projected by the same head
    # (converting the 49152 x 576 embedding to bfloat16 twice cost 30-75 ms a call)
    weights = decode.weights(model, info.compute_dtype) if decodes else None
    # the prompt's next-token distribution is the same for its G rows: projected once
    first_logits = (
        _logits(model, hidden, info.compute_dtype, info.logit_softcap)
        if weights is None
        else dot_nt(hidden[:, -1, :], weights["head"], info.compute_dtype)
    )
    logits = jnp.repeat(first_logits, group, axis=0)
    pmask = jnp.repeat(pmask, group, axis=0)
    start = pmask.sum(-1).astype(jnp.int32)  # each row's first completion position

    first, logp = _choose(jax.random.fold_in(key, 0), logits, temperature, top_p, top_k, filtering)
    tokens = jnp.full((B, N), pad_id, jnp.int32).at[:, 0].set(first)
    logps = jnp.zeros((B, N), jnp.float32).at[:, 0].set(logp)
    done = jnp.isin(first, eos)

    def more(carry):
        t, done = carry[0], carry[3]
        return (t < N) & ~jnp.all(done)

    def attends(t):
        """[B, S]: the prompt's real slots and the t completion slots written so far."""
        slots = jnp.arange(S)[None, :]
        return jnp.concatenate([pmask, jnp.zeros((B, N), jnp.bool_)], axis=-1) | (
            (slots >= Lp) & (slots < Lp + t)
        )

    def record(t, tokens, logps, done, logits):
        """Token t of each row drawn from ``logits``; pad and log-prob 0 once stopped."""
        token, logp = _choose(
            jax.random.fold_in(key, t), logits, temperature, top_p, top_k, filtering
        )
        token = jnp.where(done, pad_id, token)
        logp = jnp.where(done, 0.0, logp)
        tokens = jax.lax.dynamic_update_slice_in_dim(tokens, token[:, None], t, axis=1)
        logps = jax.lax.dynamic_update_slice_in_dim(logps, logp[:, None], t, axis=1)
        return tokens, logps, done | jnp.isin(token, eos)

    # t tokens are out; the last one goes into cache slot Lp + t - 1 (the attention
    # layers write at the cache's end_index, as Tunix's decode does), or, weights
    # first, into the row's own slot t - 1 after the prompt's shared slots
    if weights is not None:
        # the prompt's keys and values once per group; each row its completion's
        prefix = decode.prefix_layout(cache, info.num_layers, Lp)

        def step(carry):
            t, tokens, logps, done, (keys, values) = carry
            last = jax.lax.dynamic_slice_in_dim(tokens, t - 1, 1, axis=1)[:, 0]
            logits, keys, values = decode.step(
                weights,
                model.config,
                last,
                start + t - 1,
                prefix,
                keys,
                values,
                t - 1,
                pmask,
                jnp.broadcast_to(jnp.arange(N) < t, (B, N)),
                info.compute_dtype,
            )
            return (t + 1, *record(t, tokens, logps, done, logits), (keys, values))

        cache = decode.row_cache(prefix[0], B, N)
    else:
        cache = repeat_rows(cache, group, stacked=scanning)
        # scanned: the layers stacked once, outside the loop, their matrices narrow
        stacked = None
        if scanning:
            layer_def, states = layers_lib.stack(model.layers)
            stacked = (layer_def, layers_lib.narrowed(states, info.compute_dtype))

        def step(carry):
            t, tokens, logps, done, cache = carry
            last = jax.lax.dynamic_slice_in_dim(tokens, t - 1, 1, axis=1)
            m = nnx.merge(graphdef, state)  # in the loop's trace: Qwen/Gemma sow into it
            hidden, cache = ta.trunk(
                m,
                last,
                (start + t - 1)[:, None],
                cache,
                attends(t)[:, None, :],
                scan=scanning,
                dtype=info.compute_dtype,
                stacked=stacked,
            )
            logits = _logits(m, hidden, info.compute_dtype, info.logit_softcap)
            return (t + 1, *record(t, tokens, logps, done, logits), cache)

    t, tokens, logps, _, _ = jax.lax.while_loop(
        more, step, (jnp.int32(1), tokens, logps, done, cache)
    )
    return tokens, logps, t - 1


class Sampler:
    """The policy's weights as the sampler holds them, and the call that decodes.

    With ``replicate_over`` (a mesh), the weights are one whole copy per device,
    gathered once per ``sync``: decoding then needs no collective per token
    (``rollout.sampler_mesh`` decides when that pays).

    ``compute_dtype`` (``rollout.compute_dtype`` resolved), when given, replaces what
    ``info`` says the matmuls read: a float32 update can sample in bfloat16. The
    weights stay the policy's; the decode casts them once per call.

    ``numerics`` (the backend's row of ``numerics.TABLE``; this backend's when None)
    says how it decodes: weights first (the CPU's) or through the layers, unrolled or
    scanned."""

    def __init__(
        self,
        model: nnx.Module,
        info: ta.ModelInfo,
        *,
        pad_id: int,
        eos_ids: list[int],
        max_new_tokens: int,
        replicate_over: Any = None,
        compute_dtype: str | None = None,
        numerics: Numerics | None = None,
        filtering: bool = True,
    ) -> None:
        from rlctl.core.trainer.runtime import numerics as numerics_lib

        if compute_dtype is not None and info.dtype != "bfloat16":
            info = dataclasses.replace(info, compute_dtype=compute_dtype)
        self.info = info
        self.pad_id = pad_id
        self.eos_ids = tuple(int(i) for i in eos_ids)
        self.max_new_tokens = max_new_tokens
        self.replicate_over = replicate_over
        row = numerics or numerics_lib.current()  # the backend's row of the numerics table
        # weights first: the CPU's decode; False: through the layers (a benchmark sets it)
        self.weights_first = row.weights_first_decode
        self.scan = row.scan_layers  # a plain Llama's layers as one scanned body
        # False: every row prefilled (its prompt repeated), as an eval's rows are, so the
        # rollout and an eval batch of as many rows share one program
        self.prefill_once_per_group = row.prefill_once_per_group
        # whether a call may ask for top-p/top-k (its program then holds the filtering)
        self.filtering = filtering
        self._compiled: dict[Any, Any] = {}  # (prompts' shape, group) -> program (precompile)
        self.sync(model)

    @classmethod
    def for_run(cls, setup: EngineSetup) -> Sampler:
        """``rollout.engine=vanilla``'s engine (``engines.start``)."""
        return cls(
            setup.model,
            setup.info,
            pad_id=setup.tokenizer.pad_id(),
            eos_ids=setup.tokenizer.eos_ids,
            max_new_tokens=setup.spec.rollout.max_new_tokens,
            replicate_over=setup.replicate_over,
            compute_dtype=setup.sampling_dtype,
            numerics=setup.numerics,
            filtering=filters(setup.spec.rollout),
        )

    @property
    def sampling_dtype(self) -> str | None:
        return self.info.compute_dtype

    def checks(
        self,
        model: nnx.Module,
        prompt_ids: np.ndarray,
        completion_ids: np.ndarray,
        logps: np.ndarray,
        mask: np.ndarray,
        step: int,
    ) -> dict[str, float]:
        """Nothing to check: it samples from the policy's own weights."""
        return {}

    def sync(self, model: nnx.Module) -> None:
        """Take the policy's current weights (no copy on one device, no recompile)."""
        self.load(*nnx.split(model))

    def load(self, graphdef: Any, state: Any) -> None:
        """Take weights given as ``nnx.split`` gives them: a pipelined run's generator
        loads a pushed version this way (``generator.Generator.use``)."""
        self.graphdef = graphdef
        self.state = (
            state if self.replicate_over is None else ta.whole_weights(state, self.replicate_over)
        )

    def _layout(self, prompts: int, group: int) -> tuple[int, int]:
        """(rows, group) of the program for ``prompts`` prompts of ``group`` completions:
        each prompt once, or each row its own (``prefill_once_per_group`` off)."""
        if not self.prefill_once_per_group and group > 1:
            return prompts * group, 1
        return prompts, group

    def precompile(self, prompts: int, width: int, group: int) -> Any:
        """``sample_groups`` for ``prompts`` prompts of ``width`` tokens, ``group``
        completions each, compiled ahead of its first call, which then runs it: on an
        accelerator the trainer compiles the rollout's and the eval's this way before
        the first step, so their device memory is known before anything samples
        (``loop.Trainer.check_device_memory``). One device only (the weights as the
        model holds them)."""
        rows, group = self._layout(prompts, group)
        key = ((rows, width), group)
        if key not in self._compiled:
            self._compiled[key] = (
                sample_groups.trace(
                    self.graphdef,
                    self.state,
                    jax.ShapeDtypeStruct((rows, width), np.int32),
                    np.uint32(0),
                    np.float32(1.0),
                    np.float32(1.0),
                    np.int32(0),
                    info=self.info,
                    group=group,
                    max_new_tokens=self.max_new_tokens,
                    pad_id=self.pad_id,
                    eos_ids=self.eos_ids,
                    weights_first=self.weights_first,
                    scan=self.scan,
                    filtering=self.filtering,
                )
                .lower()
                .compile()
            )
        return self._compiled[key]

    def __call__(
        self,
        prompt_ids: np.ndarray,
        *,
        group: int,
        seed: int,
        temperature: float,
        top_p: float = 1.0,
        top_k: int | None = None,
    ) -> Drawn:
        """``group`` completions of each row of ``prompt_ids`` [P, Lp] (left-padded);
        ``temperature`` 0 decodes greedily. The rows are grouped by prompt either way:
        prefilled once per group, or each its own (the same tokens: a row's draws
        depend on its place and the seed alone)."""
        if not self.filtering and (top_p < 1.0 or top_k):
            raise ValueError("this sampler was made without top-p/top-k filtering")
        prompt_ids = np.asarray(prompt_ids, np.int32)
        if not self.prefill_once_per_group and group > 1:
            prompt_ids, group = np.repeat(prompt_ids, group, axis=0), 1
        args = (
            self.graphdef,
            self.state,
            prompt_ids,
            np.uint32(seed),
            np.float32(temperature),
            np.float32(top_p),
            np.int32(top_k or 0),
        )
        compiled = self._compiled.get((prompt_ids.shape, group))
        if compiled is not None:  # precompiled for these shapes (the graph is baked in)
            tokens, logps, steps = compiled(*args[1:])
        else:
            tokens, logps, steps = sample_groups(
                *args,
                info=self.info,
                group=group,
                max_new_tokens=self.max_new_tokens,
                pad_id=self.pad_id,
                eos_ids=self.eos_ids,
                weights_first=self.weights_first,
                scan=self.scan,
                filtering=self.filtering,
            )
        tokens, logps, steps = _to_host((tokens, logps, steps))
        stopped = np.isin(tokens, self.eos_ids)
        lengths = np.where(stopped.any(-1), stopped.argmax(-1), tokens.shape[1])
        return Drawn(tokens=tokens, logps=logps, lengths=lengths.astype(np.int32), steps=int(steps))


def filters(spec: Any) -> bool:
    """Whether a run's rollout filters its draws (``rollout.top_p`` below 1 or a
    ``rollout.top_k``): only then does its sampler compile the filtering branch."""
    return spec.top_p < 1.0 or spec.top_k is not None


def _to_host(tree: Any) -> Any:
    """Whole numpy arrays; an output sharded over several processes is gathered (a
    collective: every process decodes the same batch, so every one gets here)."""
    leaves = jax.tree.leaves(tree)
    if all(x.is_fully_addressable for x in leaves):
        return jax.device_get(tree)
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)


def left_pad(rows: list[list[int]], width: int, pad_id: int) -> np.ndarray:
    """Token rows right-aligned in a [len(rows), width] array of ``pad_id``."""
    out = np.full((len(rows), width), pad_id, np.int32)
    for i, r in enumerate(rows):
        if len(r) > width:
            raise ValueError(f"a prompt of {len(r)} tokens does not fit width {width}")
        if r:
            out[i, width - len(r) :] = r
    return out
