"""The fit check: a run's update, rollout and eval compiled for an accelerator that is
not here, and their device memory per chip against the chip's.

MaxText's ``train_compile.py`` compiles a training step for a v5e-256 from a CPU host
before any TPU is paid for; rlctl does it inside the submit path
(``rlctl train --cluster C --dry-run`` and the plan before every submit), so a batch
that cannot fit is refused before a slice is provisioned, with the setting that fixes
it. Everything is abstract: the model is built from its config.json as shapes
(``tunix_adapter.abstract_model``), placed on compile-only devices
(``runtime/targets.py``) over the mesh the pods build (``distributed.make_mesh``), and
the very programs the pods run are compiled for them:

* the update, through ``Update.program``, which the pods call at their first step: the
  same search for a micro-batch size that fits the memory the pods will have (half of
  what is free beside the resident state), the same recomputation levels;
* the rollout and the eval, rlctl's sampler (``sample_groups``) at their shapes.

The peak of each is what one device holds while it runs: the resident state (the
model's shard, Adam's moments, a reference model) with the program's temporaries and
outputs. XLA's analysis is per device, so FSDP's sharding shows in it.

Run in a process of its own (``python -m rlctl.core.trainer.device_fit``, what the run driver
starts): JAX there sees no accelerator (``JAX_PLATFORMS=cpu``), the compiler's working
memory goes with the process, and libtpu's start-up chatter stays in its stderr.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlctl.core import families
from rlctl.core.config.compile_targets import CompileTarget
from rlctl.core.config.models import RunSpec
from rlctl.core.errors import OutOfMemoryError
from rlctl.core.trainer.device_fit.report import DeviceFit, ProgramFit, ProgramName

Say = Callable[[str], None]


@dataclass
class Placed:
    """A run's model and optimizer as shapes on a target's compile-only devices: what
    its programs are compiled over (``place``), for the fit check and the compile
    benchmark (bench/bench_compile.py)."""

    model: Any
    optimizer: Any
    info: Any  # tunix_adapter.ModelInfo
    devices: list[Any]
    mesh: Any  # None on one device
    row: Any  # the target's row of the numerics table
    precision: Any  # model.precision.Precision
    replicated: Any  # a sharding that puts a whole array on every device
    # rollout.placement=split: the generator's devices (``devices`` are the learner's)
    generator: list[Any] = dataclasses.field(default_factory=list)

    def generator_sharding(self) -> Any:
        """A whole array on every generator device (the push's copy of the weights)."""
        from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

        if len(self.generator) == 1:
            return SingleDeviceSharding(self.generator[0])
        return NamedSharding(Mesh(self.generator, ("generator",)), PartitionSpec())


def place(
    spec: RunSpec, config: dict[str, Any], target: CompileTarget, engine: str = "vanilla"
) -> Placed:
    """``spec``'s model (``config``: its config.json) and optimizer built abstractly and
    placed on ``target``'s devices as the pods place them: FSDP over the mesh they
    build (``distributed.make_mesh``), each parameter by the model's own sharding rules."""
    import jax
    from flax import nnx
    from jax.sharding import NamedSharding, SingleDeviceSharding
    from jax.sharding import PartitionSpec as P

    from rlctl.core.trainer import tunix_adapter as ta
    from rlctl.core.trainer.model.precision import choose
    from rlctl.core.trainer.runtime import distributed, numerics, targets
    from rlctl.core.trainer.update.step import make_optimizer

    devices = targets.devices(target)
    generator: list[Any] = []
    if spec.rollout.placement == "split":  # the learner first, as the trainer places it
        from rlctl.core.trainer.rollout.placement import share

        learner, _ = share(len(devices), spec.rollout.devices)
        devices, generator = devices[:learner], devices[learner:]
    mesh = distributed.make_mesh(devices)
    prec = choose(
        spec.model.compute_dtype,
        spec.model.dtype,
        target.kind,
        flags=frozenset(),
        engine=engine,
        sampling=spec.rollout.compute_dtype,
    )
    t = spec.training
    lora = t.lora_rank is not None

    def extend(model: Any) -> tuple[Any, Any]:
        if lora:
            from rlctl.core.trainer.tunix_adapter.lora import apply_lora

            model = apply_lora(
                model, families.of_config(config).model_type, t, seed=t.seed, place=False
            )
        return model, make_optimizer(model, t)

    (model, optimizer), info = ta.abstract_model(
        config, spec.model.dtype, prec.dtype, extend=extend
    )
    if lora:
        from rlctl.core.trainer.tunix_adapter.lora import check_lora

        check_lora(info.family, t)
    one = SingleDeviceSharding(devices[0])
    state = nnx.state((model, optimizer))
    shardings = (
        nnx.get_named_sharding(state, mesh)
        if mesh is not None
        else jax.tree.map(lambda _: one, state)
    )
    nnx.update(
        (model, optimizer),
        jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings
        ),
    )
    return Placed(
        model=model,
        optimizer=optimizer,
        info=info,
        devices=devices,
        mesh=mesh,
        row=numerics.TABLE[target.kind],
        precision=prec,
        replicated=NamedSharding(mesh, P()) if mesh is not None else one,
        generator=generator,
    )


def check(
    spec: RunSpec,
    config: dict[str, Any],
    target: CompileTarget,
    engine: str = "vanilla",
    say: Say | None = None,
) -> DeviceFit:
    """Compile ``spec``'s programs for ``target`` (the model ``config.json`` says) and
    report their device memory per chip. ``engine``: the rollout engine the pods pick
    (vLLM's programs are its own: only the update is compiled then)."""
    from flax import nnx

    from rlctl.core.trainer.runtime import memory, targets
    from rlctl.core.trainer.update.step import Update, batch_shape, device_bytes, tree_bytes

    say = say or (lambda line: None)
    placed = place(spec, config, target, engine)
    model, optimizer, info = placed.model, placed.optimizer, placed.info
    devices, mesh, row, prec = placed.devices, placed.mesh, placed.row, placed.precision
    replicated = placed.replicated
    t = spec.training
    lora = t.lora_rank is not None
    # resident on one device: the model's and the moments' shards, and a reference
    # model's weights (beta > 0 without LoRA loads one; with LoRA it is the base)
    state_bytes = device_bytes(nnx.state((model, optimizer)))
    weights_bytes = device_bytes(nnx.state(model, nnx.Param))
    ref = t.beta > 0
    resident = state_bytes + (weights_bytes if ref and not lora else 0)
    usable = int(target.device_memory * memory.HEADROOM)
    report = DeviceFit(
        target=target.label,
        device=target.device_name,
        unit="chip" if target.kind == "tpu" else "GPU",
        devices=target.devices,
        device_memory=target.device_memory,
        usable=usable,
        state=resident,
    )
    if target.kind == "gpu":
        report.notes.append(targets.AUTOTUNE_NOTE)
    if resident > usable:
        report.fits, report.reason, report.peak = False, "state", resident
        return report

    # the update, as the pods compile it at their first step: in micro-batches where the
    # whole batch needs more than half of what is free beside the resident state
    have = int(memory.UPDATE_SHARE * memory.HEADROOM * (target.device_memory - resident))
    update = Update(
        spec,
        pad_id=0,
        info=info,
        numerics=row,
        budget=(have, f"the update may use on one {report.unit} of {target.label}"),
        warn=say,
    )
    prompt_len = spec.rollout.max_prompt_tokens
    batch = batch_shape(spec, prompt_len, ref, sharding=replicated)
    say(f"compiling the update for {target.label}")
    t0 = time.perf_counter()
    try:
        compiled, size = update.program(model, optimizer, batch)
    except OutOfMemoryError as e:
        report.fits, report.reason = False, "update"
        report.notes.append(e.message)
        report.compile_seconds = round(time.perf_counter() - t0, 1)
        report.peak = resident + have  # at least: what it was refused against
        return report
    report.programs.append(
        program_fit("update", compiled, time.perf_counter() - t0, resident - state_bytes, size)
    )
    rows = batch.completion_ids.shape[0]
    if size < rows:
        report.notes.append(
            f"the update runs in micro-batches of {size} of its {rows} sequences "
            "(training.micro_batch_size)"
        )

    if engine == "vllm":
        report.notes.append("the rollout runs in vLLM (its programs are not compiled here)")
    else:
        # across hosts the sampler decodes on a whole copy of the weights where one fits
        # a quarter of a device (``rollout.sampler_mesh``): a copy beside the shards
        whole = mesh is not None and _whole_weights(
            spec, devices, tree_bytes(nnx.state(model, nnx.Param)), target
        )
        # a pipelined run's generator reads copies of the weights pushed by version: up
        # to max_staleness of them besides the one it samples from
        k = spec.rollout.max_staleness if spec.rollout.pipelined else 0
        split = bool(placed.generator)
        for name, rows_, group in _sampler_calls(spec, row.prefill_once_per_group):
            say(f"compiling the {name} for {target.label}")
            t0 = time.perf_counter()
            on_generator = split and name == "rollout"  # the eval samples on the learner
            sampled = _sampler_lowered(
                model,
                info,
                spec,
                prec.sampling,
                row,
                rows_,
                group,
                prompt_len,
                placed.generator_sharding() if on_generator else replicated,
                whole or on_generator,
            ).compile()
            if on_generator:  # nothing of the learner's there: the copies it holds
                extra = k * tree_bytes(nnx.state(model))
            elif name == "rollout" and k:  # colocated: its copies beside the learner's state
                extra = resident + k * device_bytes(nnx.state(model))
            else:  # its weights are the model's own buffers, or a whole copy beside them
                extra = resident if whole else resident - weights_bytes
            report.programs.append(program_fit(name, sampled, time.perf_counter() - t0, extra))
        if split:
            report.notes.append(
                f"split: the update and the eval on {len(devices)} {report.unit}(s), the "
                f"rollout on the other {len(placed.generator)} with a whole copy of the "
                f"weights on each (up to {k + 1} version(s))"
            )
    report.compile_seconds = round(sum(p.compile_seconds for p in report.programs), 1)
    worst = max(report.programs, key=lambda p: p.peak)
    report.peak = worst.peak
    if report.peak > usable:
        report.fits, report.reason = False, worst.name
    return report


def program_fit(
    name: ProgramName, compiled: Any, seconds: float, resident_beside: int, micro: int | None = None
) -> ProgramFit:
    """A compiled program's figures on one device; ``resident_beside``: what stays on
    the device besides its arguments (the reference's weights beside the update, the
    moments beside the sampler)."""
    m = compiled.memory_analysis()
    text = compiled.as_text() or ""
    outputs = int(m.output_size_in_bytes - m.alias_size_in_bytes)
    peak = int(m.argument_size_in_bytes + m.temp_size_in_bytes + outputs + resident_beside)
    return ProgramFit(
        name=name,
        arguments=int(m.argument_size_in_bytes),
        temporaries=int(m.temp_size_in_bytes),
        outputs=outputs,
        peak=peak,
        compile_seconds=round(seconds, 1),
        micro_batch=micro,
        cpu_only=[name for name, scope in cpu_only_scopes().items() if scope in text],
    )


def cpu_only_scopes() -> dict[str, str]:
    """Each of the CPU's own numerics (the numerics table's CPU-only fields) by the named
    scope it leaves in a compiled program's operations."""
    from rlctl.core.trainer.tunix_adapter.llama import compaction, decode, mlp_grad

    return {
        "pack_mlp_rows": compaction.ROWS_SCOPE,
        "pack_head": compaction.HEAD_SCOPE,
        "own_mlp_gradient": mlp_grad.SCOPE,
        "weights_first_decode": decode.SCOPE,
    }


def _whole_weights(
    spec: RunSpec, devices: list[Any], whole_bytes: int, target: CompileTarget
) -> bool:
    """Whether the pods' sampler decodes on whole weights (``rollout.sampler_mesh``:
    asked for, or across processes where one copy takes at most a quarter of a
    device, ``distributed.weights_fit_each_device``)."""
    mode = spec.rollout.sampler_weights
    processes = len({d.process_index for d in devices})
    return mode == "whole" or (
        mode == "auto" and processes > 1 and whole_bytes <= 0.25 * target.device_memory
    )


def _sampler_calls(spec: RunSpec, prefill_once: bool) -> list[tuple[ProgramName, int, int]]:
    """(name, prompt rows, group) of each sampler program a run compiles: the rollout's
    P x G completions (each row prefilled on an accelerator, as ``Sampler.__call__``
    lays them out) and the eval's greedy batch (none when the run has no eval)."""
    p, g = spec.training.prompts_per_step, spec.rollout.num_generations
    calls: list[tuple[ProgramName, int, int]] = [
        ("rollout", p, g) if prefill_once else ("rollout", p * g, 1)
    ]
    if spec.eval.size > 0:
        calls.append(("eval", spec.eval.batch_size, 1))
    return calls


def _sampler_lowered(
    model: Any,
    info: Any,
    spec: RunSpec,
    sampling: str | None,
    row: Any,
    rows: int,
    group: int,
    prompt_len: int,
    sharding: Any,
    whole: bool = False,
) -> Any:
    import dataclasses

    import jax
    import numpy as np
    from flax import nnx

    from rlctl.core.trainer.rollout.sampler import filters, sample_groups

    if sampling is not None and info.dtype != "bfloat16":
        info = dataclasses.replace(info, compute_dtype=sampling)
    graphdef, state = nnx.split(model)
    if whole:  # one whole copy on every device (``kv_cache.whole_weights``)
        state = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), state
        )

    def arg(shape: tuple[int, ...], dtype: Any) -> Any:
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    return sample_groups.trace(
        graphdef,
        state,
        arg((rows, prompt_len), np.int32),
        arg((), np.uint32),
        arg((), np.float32),
        arg((), np.float32),
        arg((), np.int32),
        info=info,
        group=group,
        max_new_tokens=spec.rollout.max_new_tokens,
        pad_id=0,
        eos_ids=(1,),
        weights_first=row.weights_first_decode,
        scan=row.scan_layers,
        filtering=filters(spec.rollout),
    ).lower()
