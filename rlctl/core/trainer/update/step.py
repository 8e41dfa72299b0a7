"""One optimizer step on a rollout's ``Batch``: the jitted update over prefix-shared
forwards, and the ``StepMetrics`` row it yields.

The update is built once per run (``Update.create``) and compiled ahead of time
once per batch shape, which the rollout fixes for the whole run; which optional
log-probs the batch carries is fixed for the whole run too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlctl.core.config.models import RunSpec, TrainingSpec
from rlctl.core.trainer.algorithm.loss import LossConfig, policy_loss
from rlctl.core.trainer.rollout.rollout import Batch, Scores
from rlctl.core.units import human_bytes


def make_optimizer(model: Any, t: TrainingSpec) -> Any:
    """AdamW behind global-norm clipping, with an optional linear warmup, fused so the
    update holds no copy of the model, its moments float32 whatever the parameters'
    dtype (``optimizer.clipped_adamw``)."""
    import optax
    from flax import nnx

    from rlctl.core.trainer.tunix_adapter.lora import trainable
    from rlctl.core.trainer.update.optimizer import clipped_adamw

    lr: Any = t.learning_rate
    if t.warmup_steps:
        lr = optax.linear_schedule(0.0, t.learning_rate, t.warmup_steps)
    tx = clipped_adamw(lr, b1=0.9, b2=0.99, weight_decay=t.weight_decay, max_norm=t.max_grad_norm)
    # with LoRA only the adapters: no gradient nor moment of the frozen base exists
    return nnx.Optimizer(model, tx, wrt=trainable(t))


def loss_config(spec: RunSpec) -> LossConfig:
    t = spec.training
    if t.epsilon is None or t.epsilon_high is None:  # RunSpec's validator fills both
        raise ValueError("training.epsilon and epsilon_high are unset: not a RunSpec's")
    return LossConfig(
        algorithm=spec.algorithm,
        epsilon=t.epsilon,
        epsilon_high=t.epsilon_high,
        beta=t.beta,
        kl_estimator=t.kl_estimator,
        aggregation=t.loss_aggregation,
    )


def micro_batches(batch: Batch, size: int, group: int) -> tuple[Batch, int]:
    """``batch`` cut into micro-batches of ``size`` sequences, stacked on a new leading
    axis, and the group size within each (``size`` itself when it cuts groups).

    A micro-batch holds whole groups (its prompts once each) or an equal part of
    one group (its prompt repeated for each part), so the prefix is still shared.
    """
    import jax
    import jax.numpy as jnp

    rows = batch.completion_ids.shape[0]
    parts = rows // size
    if size % group == 0:
        prompts = batch.prompt_ids
        inner = group
    else:  # size divides group: each part gets its group's prompt
        prompts = jnp.repeat(batch.prompt_ids, group // size, axis=0)
        inner = size
    stacked = jax.tree.map(
        lambda x: x.reshape(parts, -1, *x.shape[1:]), dataclasses.replace(batch, prompt_ids=prompts)
    )
    return stacked, inner


def batch_shape(spec: RunSpec, prompt_len: int, ref: bool, sharding: Any = None) -> Batch:
    """The ``Batch`` every step of ``spec`` gives the update, as ``jax.ShapeDtypeStruct``:
    its prompts ``prompt_len`` wide, the reference's log-probs when ``ref``, the rollout
    policy's when the run iterates on a batch (``Update.apply`` adds both) or samples
    ahead of its learner (``rollout.max_staleness``: its generator's). ``sharding``:
    where its arrays are (the fit check's compile-only devices)."""
    import jax

    r, t = spec.rollout, spec.training
    rows, n = t.prompts_per_step * r.num_generations, r.max_new_tokens

    def shape(*dims: int, dtype: Any = np.int32) -> Any:
        return jax.ShapeDtypeStruct(dims, dtype, sharding=sharding)

    iterations = t.num_iterations
    if iterations is None:
        raise ValueError("training.num_iterations is unset: not a validated RunSpec")
    logps = shape(rows, n, dtype=np.float32)
    behaviour = r.correction == "behaviour"  # the sampler's log-probs as pi_old
    return Batch(
        prompt_ids=shape(t.prompts_per_step, prompt_len),
        completion_ids=shape(rows, n),
        mask=shape(rows, n),
        advantages=shape(rows, dtype=np.float32),
        ref_logps=logps if ref else None,
        old_logps=logps if iterations > 1 or (r.max_staleness > 0 and behaviour) else None,
        behaviour_logps=logps if r.max_staleness > 0 and not behaviour else None,
    )


def split_rows(batch: Batch, mesh: Any) -> Batch:
    """``batch``'s sequences split among the devices of ``mesh``'s ``fsdp`` axis: data
    parallelism inside FSDP (MaxText shards its batch over its data and fsdp axes), so
    each device computes the forward and backward of its own rows and XLA sums the
    gradients across devices. Without it every device computed every row: the weights
    sharded, but the activations of the whole batch on each chip and no speed-up from
    more chips (a 135M model's update on 32 v6e chips: 4.6 GiB of temporaries on every
    one). An array whose rows do not divide among the devices (2 prompts on 8 chips)
    stays whole on each. ``mesh`` None (one device): ``batch`` as it is."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    if mesh is None:
        return batch
    n = mesh.shape["fsdp"]

    def split(x: Any) -> Any:
        if x is None or x.shape[0] % n:
            return x
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec("fsdp")))

    return jax.tree.map(split, batch, is_leaf=lambda x: x is None)


def tree_bytes(tree: Any) -> int:
    """Bytes of the arrays of ``tree`` (abstract ones too)."""
    import jax

    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def device_bytes(tree: Any) -> int:
    """Bytes of ``tree`` on one device: each array's shard where it is sharded (what a
    compiled program's memory analysis counts), the whole array where it is not."""
    import jax

    total = 0
    for x in jax.tree.leaves(tree):
        sharding = getattr(x, "sharding", None)
        shape = sharding.shard_shape(x.shape) if sharding is not None else x.shape
        total += int(np.prod(shape, dtype=np.int64)) * x.dtype.itemsize
    return total


class Update:
    """The run's update, compiled ahead of time once per batch shape.

    A pure ``jax.jit`` over the split (model, optimizer) state, donated so XLA
    updates parameters and Adam moments in place (~1.6 GB less for SmolLM2-135M).
    Compiling ahead of time gives XLA's memory analysis before anything runs: the
    micro-batch size is the largest that fits (``training.micro_batch_size`` or
    found), and a batch that cannot fit is one line, not an allocator dump.
    """

    def __init__(
        self,
        spec: RunSpec,
        pad_id: int,
        info: Any,
        warn: Callable[[str], None] | None = None,
        topology: Any = None,
        numerics: Any = None,
        budget: tuple[int, str] | None = None,
    ) -> None:
        from rlctl.core.trainer.runtime import numerics as numerics_lib

        # the backend's row of the numerics table (a benchmark passes a variant)
        self.numerics: numerics_lib.Numerics = numerics or numerics_lib.current()
        self.cfg = loss_config(spec)
        self.group = spec.rollout.num_generations
        self.temperature = spec.rollout.temperature
        self.micro = spec.training.micro_batch_size  # None: the largest that fits
        self.pad_id = pad_id
        self.info = info
        self.warn = warn or (lambda message: None)
        self.topology = topology  # several processes agree on one micro-batch size
        # (bytes, what they are) the update may use; None: what is free on this device
        # (``memory.update_budget``). The fit check's: a chip that is not here.
        self.budget = budget
        self.remat = spec.training.remat
        self.lora = spec.training.lora_rank is not None  # train the adapters alone
        if self.remat and not info.capabilities.recomputation:
            self.warn(
                f"training.remat applies to Llama-family models; this {info.family} "
                "model runs without it"
            )
        self._compiled: dict[Any, tuple[Any, int]] = {}  # batch signature -> (program, size)
        self._logps: Any = None

    @classmethod
    def create(
        cls,
        spec: RunSpec,
        pad_id: int,
        info: Any,
        warn: Callable[[str], None] | None = None,
        topology: Any = None,
        numerics: Any = None,
        budget: tuple[int, str] | None = None,
    ) -> Update:
        return cls(spec, pad_id, info, warn, topology, numerics, budget)

    # --- the traced functions ------------------------------------------------------
    def _wrt(self) -> Any:
        """What gets gradients: the LoRA adapters, or every parameter."""
        from flax import nnx

        return nnx.LoRAParam if self.lora else nnx.Param

    def _logps_fn(
        self,
        model: Any,
        prompt_ids: Any,
        completion_ids: Any,
        group: int,
        remat: bool | int = False,
        mask: Any = None,
        stacked: Any = None,
    ):
        from rlctl.core.trainer import tunix_adapter as ta

        return ta.shared_prefix_logps(
            model,
            prompt_ids,
            completion_ids,
            group=group,
            pad_id=self.pad_id,
            temperature=self.temperature,
            info=self.info,
            remat=remat,
            mask=mask,
            numerics=self.numerics,
            stacked=stacked,
        )

    def _remat_levels(self, sharded: bool = False) -> list[bool | int]:
        """The recomputations to try, in order (``logprobs.recomputed``): the first
        whose update fits the budget is compiled.

        ``training.remat`` when set. By default all on an accelerator (the numerics
        table's ``partial_remat`` off): its scanned layer body under ``jax.checkpoint``
        keeps one array per layer where it kept ~10 residuals, each a stacked array and
        a distinct fusion for the GPU compiler to compile (``layers.stream_hidden``; the
        default update for an H200: temporaries 3.37 -> 1.13 GB, docs/benchmarks.md), for a
        second forward of each layer, cheap beside a GPU's compile. On the CPU
        (``partial_remat``), first all
        layers but a quarter, then all: on the default update (SmolLM2, a 2-core Zen 4
        EPYC, float32) XLA's temporaries are 0.70 GiB with every layer recomputed,
        +0.08 GiB for each layer kept (3.12 GiB with none), and its time 6.27 s with
        every layer recomputed, 5.84 s with 20 of 30, 5.74 s with none; so the layers
        kept save most of the recomputation's cost for a part of its memory
        (bench/bench_update.py --against remat-all).
        A workload whose first try does not fit compiles once more, every layer
        recomputed, before its batch is cut into micro-batches.

        ``sharded`` (the update runs over a mesh of several devices, FSDP): every layer
        recomputed, whatever the backend. Without it the backward pass keeps, for each
        layer, the weights the forward all-gathered from their shards: a 1B-parameter
        Llama's update over 8 v6e chips held 4.4 GiB of temporaries per chip (0.26 GiB
        a layer, one layer's float32 weights), and a 4-layer model of its width needed
        1/4.4 of its one-chip memory per chip where FSDP should give 1/8. Recomputed,
        the backward gathers each layer again: 0.51 GiB of temporaries against 1.23,
        1/7.6 of one chip (the fit check's compile for v6e-8, bench/bench_compile.py).
        MaxText's default (``remat_policy: full``) is the same."""
        if not self.info.capabilities.recomputation:  # the family's (core/families)
            return [False]
        if self.remat is not None:
            return [self.remat]
        if sharded:
            return [True]
        if not self.numerics.partial_remat:
            return [True]
        layers = self.info.num_layers
        return [layers - layers // 4, True] if layers >= 4 else [True]

    def _budget_bytes(self, model: Any, state: Any) -> int:
        """The state the update's memory budget is measured against on a CPU
        (``memory.update_budget``): the weights and optimizer state it updates, and for
        LoRA the two float32 Adam moments a full fine-tune would hold for the frozen base.

        Why: a LoRA update reads the whole base and keeps a full fine-tune's activations,
        but its own state is the base and a few adapters. Measured against that alone it
        got the 1 GiB floor, its first program (SmolLM2, 23 of 30 layers recomputed) did
        not fit, and a second compiled after it: 1167 s then 972 s on a loaded 2-core
        machine (#53). Counted this way a LoRA run may use what the same model's full
        fine-tune may, and its peak stays below that run's, which holds those moments."""
        import jax
        from flax import nnx

        total = tree_bytes(state)
        if self.lora:
            weights = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
            adapters = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam)))
            total += 2 * 4 * (weights - adapters)
        return total

    def _described(self, level: bool | int, size: int, rows: int) -> str:
        """``with 23 of 30 layers recomputed`` (and ``, in micro-batches of 4``)."""
        from rlctl.core.trainer.tunix_adapter.logprobs import recomputed

        layers = self.info.num_layers
        done = recomputed(level, layers)
        what = (
            "with every layer recomputed"
            if done == layers
            else f"with {done} of {layers} layers recomputed"
            if done
            else "with no layer recomputed"
        )
        return what + (f", in micro-batches of {size}" if size < rows else "")

    def _remat(self) -> bool | int:
        """The recomputation the update tries first (``_remat_levels``)."""
        return self._remat_levels()[0]

    def _loss_and_grads(
        self,
        params: Any,
        mdef: Any,
        rest: Any,
        batch: Batch,
        size: int,
        remat: bool | int | None = None,
        mesh: Any = None,
    ) -> tuple[tuple[Any, dict[str, Any]], Any]:
        """((loss, aux), gradients) of ``batch``, ``size`` sequences at a time with the
        gradients summed: each micro-batch divides by the whole batch's ``Norm``, so
        the sums are the whole batch's figures (traced; see ``loss_and_grads``).
        Over a ``mesh`` each micro-batch's sequences are split among its devices
        (``split_rows``)."""
        value, grads, _ = self._grads_and_norm(params, mdef, rest, batch, size, remat, mesh)
        return value, grads

    def _grads_and_norm(
        self,
        params: Any,
        mdef: Any,
        rest: Any,
        batch: Batch,
        size: int,
        remat: bool | int | None = None,
        mesh: Any = None,
    ) -> tuple[tuple[Any, dict[str, Any]], Any, Any]:
        """``_loss_and_grads``'s ((loss, aux), gradients) and, where the layers are
        differentiated stacked (``_stacks``), the gradients' float32 global norm taken
        of the stacked gradients (else None: the optimizer takes it).

        Why of the stacked ones: taken by the optimizer, it reads every layer's row of
        each stacked gradient apart (``optimizer.layer_rows``), one reduction per row,
        and XLA's sibling fusion merges those into reductions of varying size, each a
        distinct kernel for the GPU compiler. Taken here it is one reduction per kind
        of array: fewer distinct fusions, a faster GPU compile (docs/decisions/trainer.md);
        the same float32 sum of squares added in another order."""
        import jax
        import jax.numpy as jnp
        from flax import nnx

        from rlctl.core.trainer.algorithm.loss import Norm

        cfg = self.cfg
        norm = Norm.of(batch.mask)
        remat = self._remat() if remat is None else remat
        stacks = self._stacks(nnx.merge(mdef, params, rest))
        if stacks:  # the layers' gradients stacked (``_stacked_params``)
            params, layers, merged = self._stacked_params(params, mdef, rest)
        else:

            def merged(p):
                return nnx.merge(mdef, p, rest), None

        def loss_fn(p, mb: Batch, group: int):
            mb = split_rows(mb, mesh)
            m, stacked = merged(p)
            # given the mask, the completions' MLPs skip their pads
            logps, ent = self._logps_fn(
                m, mb.prompt_ids, mb.completion_ids, group, remat, mb.mask, stacked
            )
            loss, aux = policy_loss(
                logps,
                mb.mask,
                mb.advantages,
                cfg,
                old_logps=mb.old_logps,
                ref_logps=mb.ref_logps,
                norm=norm,
                behaviour_logps=mb.behaviour_logps,
            )
            aux["entropy"] = (ent * mb.mask).sum() / norm.tokens
            return loss, aux

        if size >= batch.completion_ids.shape[0]:
            total = jax.value_and_grad(loss_fn, has_aux=True)(params, batch, self.group)
        else:
            mbs, group = micro_batches(batch, size, self.group)
            grad_fn = jax.value_and_grad(lambda p, mb: loss_fn(p, mb, group), has_aux=True)
            first = jax.tree.map(lambda x: x[0], mbs)
            zeros = jax.tree.map(
                lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(grad_fn, params, first)
            )

            def accumulate(acc, mb):
                return jax.tree.map(jnp.add, acc, grad_fn(params, mb)), None

            total, _ = jax.lax.scan(accumulate, zeros, mbs)
        if not stacks:
            value, grads = total
            return value, grads, None
        from rlctl.core.trainer.update.optimizer import global_norm, layer_rows

        value, (stacked_grads, other_grads) = total
        norm = global_norm((stacked_grads, other_grads))
        return value, nnx.merge_state(layer_rows(stacked_grads, layers), other_grads), norm

    def _stacks(self, model: Any) -> bool:
        """Whether the update differentiates the layers stacked (``_stacked_params``):
        the log-probs run one stream through the scanned layers (``logprobs.streams``,
        an accelerator's row) and every parameter is trained (not LoRA's adapters)."""
        from rlctl.core.trainer.tunix_adapter.logprobs import streams

        return not self.lora and streams(model, self.info, self.numerics, True)

    @staticmethod
    def _stacked_params(params: Any, mdef: Any, rest: Any) -> tuple[Any, Any, Any]:
        """(what the gradient is taken of: the layers' parameters stacked on a leading
        axis and the others; the layers' own parameters; a function from the former to
        (the model, the stacked layers as ``layers.stack`` gives them)).

        Why stacked outside the gradient: stacked inside it (``layers.stack`` in the
        forward), each layer's gradient is a slice of the scan's stacked one at a
        constant offset, copied out before the optimizer's barrier. Here the gradient
        is the stacked one, and the optimizer reads each layer's row at an index XLA
        cannot fold (``optimizer.layer_rows``), so every layer's step of one kind of
        array has one body, which XLA merged into one fusion for all layers: the
        default update for an H200 went from about 660 fusion calls to 381
        (bench/bench_compile.py). The layers' own parameters stay in the model (without
        a gradient) only for its structure: the stream reads the stacked ones."""
        import jax
        from flax import nnx

        from rlctl.core.trainer.tunix_adapter.llama import layers as layers_lib

        layers, others = nnx.split_state(params, nnx.PathContains("layers"), ...)
        rows = [layers["layers"][i] for i in sorted(layers["layers"].keys())]
        graphdef, _ = nnx.split(nnx.merge(mdef, params, rest).layers[0])
        fixed = jax.lax.stop_gradient(layers)

        def merged(p: Any) -> tuple[Any, Any]:
            stacked, other = p
            return nnx.merge(mdef, fixed, other, rest), (graphdef, stacked)

        return (layers_lib.stack_states(rows), others), layers, merged

    def loss_and_grads(self, model: Any, batch: Batch, size: int) -> Any:
        """((loss, aux), gradients) of ``model`` on ``batch`` in micro-batches of
        ``size``, without updating anything (for tests and benchmarks)."""
        import jax

        from rlctl.core.trainer.tunix_adapter.weights import split_rest

        mdef, params, rest = split_rest(model, self._wrt())
        fn = jax.jit(lambda p, r, b: self._loss_and_grads(p, mdef, r, b, size))
        return fn(params, rest, batch)

    def _step_fn(
        self, graphdef: Any, size: int, remat: bool | int | None = None, mesh: Any = None
    ) -> Callable[..., Any]:
        """(state, batch) -> (new state, loss, aux, grad norm); over ``mesh``, each
        device computes its share of the sequences (``split_rows``)."""
        from flax import nnx

        from rlctl.core.trainer.tunix_adapter.weights import split_rest
        from rlctl.core.trainer.update.optimizer import apply_step, global_norm

        def step(state, batch: Batch):
            model, optimizer = nnx.merge(graphdef, state)
            mdef, params, rest = split_rest(model, self._wrt())
            (loss, aux), grads, stacked_norm = self._grads_and_norm(
                params, mdef, rest, batch, size, remat, mesh
            )
            # the CPU's barrier between the norm and the step (``clipped_adamw``) would
            # store every layer's row of the stacked gradients (``_stacked_params``)
            gnorm = apply_step(
                optimizer, model, grads, barrier=stacked_norm is None, norm=stacked_norm
            )
            if not self.numerics.norm_once:  # the numerics table's norm_once
                gnorm = global_norm(grads)
            return nnx.state((model, optimizer)), loss, aux, gnorm

        return step

    # --- compile once, check the memory ------------------------------------------
    @staticmethod
    def _key(state: Any, batch: Batch) -> Any:
        """What a compiled update is for: the state's tree and every array's shape and
        dtype. Not the graphdef: an optimizer made abstractly (``precompile``) has one
        that differs only in the order of its variables' metadata."""
        import jax

        return (
            jax.tree.structure(state),
            tuple((x.shape, x.dtype) for x in jax.tree.leaves((state, batch))),
        )

    def precompile(self, model: Any, make: Callable[[], Any], batch: Batch) -> tuple[Any, int]:
        """Compile the update for ``batch`` (arrays or ``jax.ShapeDtypeStruct``) before
        the optimizer exists: ``make`` builds it, here only abstractly.

        Why: XLA's compiler works in host memory, 1.4 GB for the default update (its
        switches over packed sizes, 30 layers forward, recomputed and backward). With
        Adam's moments (1.08 GB) already resident that was the default run's peak,
        4.23 GB against 3.85 GB in its steps (bench/bench_memory_breakdown.py).
        One device only: over a mesh the state's shardings come from the real arrays.
        """
        from flax import nnx

        abstract = nnx.eval_shape(make)
        return self.program(model, abstract, batch)

    @staticmethod
    def _mesh(model: Any) -> Any:
        """The FSDP mesh ``model``'s parameters are sharded over, or None (one device)."""
        import jax
        from flax import nnx

        one = next(x.sharding for x in jax.tree.leaves(nnx.state(model)))
        return getattr(one, "mesh", None)

    def compile_at(
        self, model: Any, optimizer: Any, batch: Batch, size: int, level: bool | int
    ) -> Any:
        """The update of ``batch`` in micro-batches of ``size`` sequences, ``level`` of
        its layers recomputed, compiled (``program`` picks both; the compile benchmark
        asks for one)."""
        import jax
        from flax import nnx

        from rlctl.core.trainer.runtime import compiles

        graphdef, state = nnx.split((model, optimizer))
        # the new state keeps the old one's shardings: left to XLA, a sharded run's
        # norms came back sharded otherwise, which the compiled program refuses
        # (an abstract optimizer's leaves have none: on one device, the model's)
        one = next(x.sharding for x in jax.tree.leaves(nnx.state(model)))
        keep = (
            jax.tree.map(lambda x: getattr(x, "sharding", None) or one, state),
            None,
            None,
            None,
        )
        return (
            jax.jit(
                self._step_fn(graphdef, size, level, self._mesh(model)),
                donate_argnums=0,
                out_shardings=keep,
            )
            .lower(state, batch)
            .compile(
                compiler_options=compiles.update_options(self.info.compute_dtype, self.numerics)
            )
        )

    def program(self, model: Any, optimizer: Any, batch: Batch) -> tuple[Any, int]:
        """The compiled update for ``batch``'s shapes, and its micro-batch size."""
        from flax import nnx

        from rlctl.core.config.models import micro_batch_sizes
        from rlctl.core.trainer.runtime import memory

        state = nnx.state((model, optimizer))
        key = self._key(state, batch)
        if key in self._compiled:
            return self._compiled[key]
        rows = batch.completion_ids.shape[0]
        sizes = micro_batch_sizes(rows // self.group, self.group)  # rows first
        if self.micro is not None:
            sizes = [min(self.micro, rows)]
        have, where = self.budget or memory.update_budget(self._budget_bytes(model, state))
        if self.topology is not None:
            from rlctl.core.trainer.runtime.distributed import least

            have = least(have, self.topology)
        grads = device_bytes(nnx.state(model, self._wrt()))  # one device's (its shard)
        mesh = self._mesh(model)
        levels = self._remat_levels(sharded=mesh is not None and mesh.size > 1)
        for n, level in enumerate(levels):
            # a lighter recomputation with the whole batch only; the last one in
            # micro-batches as needed (``_remat_levels``)
            measured: tuple[int, int] | None = None  # (size, need) of this level's first
            tried = rows + rows  # each retry at least halves: each try compiles again
            for size in sizes if n == len(levels) - 1 else sizes[:1]:
                if size > tried // 2:
                    continue
                if (
                    measured
                    and size != sizes[-1]
                    and memory.predicted_need(*measured, size, grads) > have
                ):
                    continue  # a compile (20 s for SmolLM2 on a CPU) that would not fit
                tried = size
                try:
                    compiled = self.compile_at(model, optimizer, batch, size, level)
                except Exception as e:
                    # a TPU's compiler refuses a program whose temporaries exceed the
                    # chip's memory ("Ran out of memory on HBM"): too big, as a need
                    # over the budget would be
                    if not memory.is_oom(e):
                        raise
                    memory.return_freed_memory()
                    need = memory.refused_need(e) or have + 1
                    measured = measured or (size, need)
                    continue
                memory.return_freed_memory()  # the compiler's working memory
                need = memory.compiled_need(compiled)
                measured = measured or (size, need)
                if need > have:
                    # each try is a whole compile (minutes for a 1B model on a CPU):
                    # say why another follows rather than show the same spinner again
                    self.warn(
                        f"the update {self._described(level, size, rows)} needs "
                        f"{human_bytes(need)}, more than the {human_bytes(have)} {where}: "
                        "compiling a lighter one (training.remat, "
                        f"training.micro_batch_size, {memory.LIMIT_ENV})"
                    )
                if need <= have:
                    if size < rows and self.micro is None:
                        self.warn(
                            f"the update runs in micro-batches of {size} sequences: "
                            f"the whole batch needs more than the {human_bytes(have)} "
                            f"{where} (training.micro_batch_size)"
                        )
                    self._compiled[key] = (compiled, size)
                    return compiled, size
        what = f"the update of {rows} sequences x {batch.completion_ids.shape[1]} tokens" + (
            f" in micro-batches of {tried}" if tried < rows else ""
        )
        valid = ", ".join(map(str, micro_batch_sizes(rows // self.group, self.group)))
        hint = (
            f"lower training.micro_batch_size (valid: {valid})"
            if self.micro and tried > 1
            else "lower rollout.max_new_tokens, rollout.max_prompt_tokens or "
            "training.prompts_per_step"
        )
        raise memory.too_big(need, have, where, what, hint)

    def lower(self, model: Any, optimizer: Any, batch: Batch, platforms: tuple[str, ...]) -> Any:
        """The update of ``batch`` (its whole batch, the first recomputation level)
        lowered, not compiled, for ``platforms`` (``("cuda",)``, ``("tpu",)``): what an
        accelerator would compile, read on a machine without one (CI counts its
        operations; tests/core/trainer/test_lowering.py). ``optimizer`` may be
        abstract (``nnx.eval_shape``)."""
        import jax
        from flax import nnx

        graphdef, state = nnx.split((model, optimizer))
        step = self._step_fn(graphdef, batch.completion_ids.shape[0], self._remat())
        return (
            jax.jit(step, donate_argnums=0).trace(state, batch).lower(lowering_platforms=platforms)
        )

    def logps(self, model: Any, prompt_ids: Any, completion_ids: Any, base: bool = False) -> Any:
        """Per-token log-probs under ``model`` (the reference, or the rollout policy
        frozen over iterations), with no gradient; with ``base``, under a LoRA
        model's frozen base (its adapters zeroed: the reference, without a copy)."""
        import jax
        from flax import nnx

        from rlctl.core.trainer.tunix_adapter.lora import base_only

        if self._logps is None:

            def policy_logps(graphdef, state, prompt_ids, completion_ids):
                return self._logps_fn(
                    nnx.merge(graphdef, state), prompt_ids, completion_ids, self.group
                )[0]

            self._logps = jax.jit(policy_logps, static_argnums=0)
        graphdef, state = nnx.split(model)
        if base:
            state = base_only(state)
        return self._logps(graphdef, state, prompt_ids, completion_ids)

    def train_step(self, model: Any, optimizer: Any, batch: Batch) -> tuple[Any, Any, Any]:
        """One update of ``model`` and ``optimizer`` in place: (loss, aux, grad norm)."""
        from flax import nnx

        compiled, _ = self.program(model, optimizer, batch)
        state = nnx.state((model, optimizer))
        new_state, loss, aux, gnorm = compiled(state, batch)
        nnx.update((model, optimizer), new_state)
        return loss, aux, gnorm

    def apply(
        self, model: Any, optimizer: Any, ref_model: Any, batch: Batch, iterations: int
    ) -> tuple[list[float], list[float], dict[str, Any]]:
        """``iterations`` updates on ``batch``: their losses, gradient norms, and the
        last one's auxiliary figures (kl, entropy, clip fraction)."""
        import jax
        from flax import nnx

        from rlctl.core.trainer.runtime import memory

        memory.return_freed_memory()  # the rollout's buffers, before the update's
        try:
            if ref_model is not None:
                batch = dataclasses.replace(
                    batch, ref_logps=self.logps(ref_model, batch.prompt_ids, batch.completion_ids)
                )
            elif self.lora and self.cfg.beta > 0:  # the reference: the frozen base
                batch = dataclasses.replace(
                    batch,
                    ref_logps=self.logps(model, batch.prompt_ids, batch.completion_ids, base=True),
                )
            # the rollout policy, frozen for all iterations (a pipelined run's batch
            # brings its generator's: the policy that sampled it, some versions back)
            if iterations > 1 and batch.old_logps is None:
                batch = dataclasses.replace(
                    batch, old_logps=self.logps(model, batch.prompt_ids, batch.completion_ids)
                )
            losses, norms, auxes = [], [], []
            for _ in range(iterations):
                loss, aux, gnorm = self.train_step(model, optimizer, batch)
                losses.append(float(loss))
                norms.append(float(gnorm))
                auxes.append(aux)
        except Exception as e:
            if not memory.is_oom(e):
                raise
            raise memory.from_runtime(
                e,
                "the update",
                "lower training.micro_batch_size, rollout.max_new_tokens "
                "or training.prompts_per_step",
            ) from None
        # the loss is ready before the new state: until that is too, XLA still holds
        # the update's temporaries (0.7 GB for the default run)
        jax.block_until_ready(nnx.state((model, optimizer)))
        memory.return_freed_memory()  # the update's temporaries (and its compilation's)
        return losses, norms, auxes[-1]


@dataclass(frozen=True)
class StepMetrics:
    """One row of metrics.jsonl (the field order is the row's key order)."""

    step: int  # 1-based: the number of steps done
    loss: float
    reward_mean: float
    reward_min: float
    reward_max: float
    reward_std: float
    accuracy: float
    format_rate: float
    kl: float
    entropy: float
    clip_fraction: float
    grad_norm: float
    completion_length: float
    completion_tokens: int
    step_seconds: float
    rollout_seconds: float
    tokens_per_s: float
    # each reward's mean over the step's completions, as ``rewards/<name>/mean`` keys
    # of the row (TRL's names); None where it applied to none of them
    reward_means: dict[str, float | None] = dataclasses.field(default_factory=dict)
    # rollout.engine=vllm only (absent from the row otherwise): the mean |difference|
    # of the engine's and the trainer's log-probs of the sampled tokens, and the
    # seconds the weight push into the engine took
    engine_logp_diff: float | None = None
    weight_push_seconds: float | None = None
    # the device allocator's peak so far (memory.DevicePeak); absent on a CPU
    peak_device_bytes: int | None = None
    # a pipelined run's (rollout.placement=split or max_staleness >= 1; absent
    # otherwise): the policy versions the batch lagged, the trajectories dropped for
    # age and the generator's restarts so far, each half's busy fraction of the step,
    # and the bytes of the weight push (weight_push_seconds: its seconds)
    staleness: int | None = None
    dropped_samples: int | None = None
    generator_restarts: int | None = None
    generator_busy: float | None = None
    learner_busy: float | None = None
    weight_push_bytes: int | None = None
    # rollout.correction=decoupled with max_staleness >= 1: the mean truncated
    # importance weight pi_learner / pi_sampler over the batch's tokens (1: no drift)
    importance_weight: float | None = None

    @classmethod
    def measure(
        cls,
        step: int,
        losses: list[float],
        norms: list[float],
        aux: dict[str, Any],
        scores: Scores,
        mask: np.ndarray,
        elapsed: float,
        rollout_seconds: float,
        engine_logp_diff: float | None = None,
        weight_push_seconds: float | None = None,
        peak_device_bytes: int | None = None,
        **pipeline: Any,
    ) -> StepMetrics:
        comp_tokens = int(mask.sum())
        rewards = scores.reward
        return cls(
            step=step,
            loss=float(np.mean(losses)),
            reward_mean=float(rewards.mean()),
            reward_min=float(rewards.min()),
            reward_max=float(rewards.max()),
            reward_std=float(rewards.std()),
            accuracy=float(scores.correct.mean()),
            format_rate=float(scores.formatted.mean()),
            kl=float(aux["kl"]),
            entropy=float(aux["entropy"]),
            clip_fraction=float(aux["clip_fraction"]),
            grad_norm=float(np.mean(norms)),
            completion_length=float(mask.sum(axis=1).mean()),
            completion_tokens=comp_tokens,
            step_seconds=round(elapsed, 3),
            rollout_seconds=round(rollout_seconds, 3),
            tokens_per_s=round(comp_tokens / elapsed, 2) if elapsed else 0.0,
            reward_means=dict(scores.reward_means),
            engine_logp_diff=engine_logp_diff,
            weight_push_seconds=(
                None if weight_push_seconds is None else round(weight_push_seconds, 3)
            ),
            peak_device_bytes=peak_device_bytes,
            importance_weight=(
                float(aux["importance_weight"]) if "importance_weight" in aux else None
            ),
            **pipeline,
        )

    def row(self) -> dict[str, Any]:
        """The metrics.jsonl row, and the ``metrics`` of the progress ``step`` event."""
        row = dataclasses.asdict(self)
        means = row.pop("reward_means")
        for key in _OPTIONAL:
            if row[key] is None:
                del row[key]
        row.update({f"rewards/{name}/mean": mean for name, mean in means.items()})
        return row


# the row's keys present only where they apply (an engine's, a device's, a pipeline's)
_OPTIONAL = (
    "engine_logp_diff",
    "weight_push_seconds",
    "peak_device_bytes",
    "staleness",
    "dropped_samples",
    "generator_restarts",
    "generator_busy",
    "learner_busy",
    "weight_push_bytes",
    "importance_weight",
)
