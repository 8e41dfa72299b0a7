"""The trainer entrypoint: one RunSpec + one run folder -> a trained, evaluated run.

The same code runs on a laptop and in a cluster's pods. Everything a step needs
(prompts, sampling seed) is a pure function of (seed, step), and checkpoints hold
the model and optimizer state, so a run killed at any point and resumed from its
latest complete checkpoint produces exactly the metrics of an uninterrupted run.

In a multi-host workload every process runs this same loop on the same inputs
over one mesh (distributed.py); ``self.writer`` (process 0) alone writes the run
store, and decisions read from the store are agreed on before they branch.

``Trainer`` only composes: rollout.py samples and scores, step.py updates,
evaluation.py evaluates, checkpointing.py saves and restores.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from rlctl.core.config.models import RunSpec
from rlctl.core.errors import ConfigError
from rlctl.core.phases import Phase, StatusUpdate
from rlctl.core.store.base import EVAL, RunDir
from rlctl.core.trainer import rewards as rewards_lib
from rlctl.core.trainer.algorithm import finite
from rlctl.core.trainer.checkpoint.checkpointing import Checkpoints
from rlctl.core.trainer.data import load_source
from rlctl.core.trainer.rollout import rollout as rollout_lib
from rlctl.core.trainer.rollout.rollout import Rollout, sampler_mesh, score, step_seed
from rlctl.core.trainer.run import evaluation
from rlctl.core.trainer.runtime import stops
from rlctl.core.trainer.runtime.distributed import Topology, agree
from rlctl.core.trainer.runtime.events import Stage, phase
from rlctl.core.trainer.update.step import StepMetrics, Update, batch_shape, make_optimizer

Progress = Callable[[dict[str, Any]], None]
OnStatus = Callable[[StatusUpdate], None]  # what status.json should now say
# A caller's hook around the run's phases (a benchmark measuring each): called with
# the phase ("rollout", "update", "checkpoint save", "eval") and the object doing it
# (the Rollout, the Update, the Checkpoints, the Rollout), it returns the context the
# phase runs in. Watching needs nothing of the package rebound.
Watch = Callable[[str, Any], AbstractContextManager[Any]]


def _unwatched(phase: str, doer: Any) -> AbstractContextManager[Any]:
    return nullcontext()


class Trainer:
    """One run, set up in small ``create_*`` steps (a benchmark drives them one by one),
    then trained, checkpointed and evaluated by ``train``."""

    def __init__(
        self,
        spec: RunSpec,
        run: RunDir,
        progress: Progress | None = None,
        topology: Topology | None = None,
        recover: bool = False,
        watch: Watch | None = None,
    ):
        import jax

        from rlctl.core.trainer.rollout.placement import place
        from rlctl.core.trainer.runtime.distributed import current, make_mesh

        self.spec = spec
        self.run = run
        self.emit = progress or (lambda event: None)
        self.topo = topology or current()
        self.writer = self.topo.is_writer
        # which devices learn and which generate (rollout.placement): all of them learn
        # unless the rollout is split off onto devices of its own
        self.placement = place(spec.rollout, jax.devices(), self.topo.multi_process)
        self.mesh = make_mesh(self.placement.learner)  # None on one device
        self.pipelined: Any = None  # a pipelined run's steps (pipelined.Pipelined)
        self.recover = recover  # resume --recover: try the checkpoints set aside
        self.watch = watch or _unwatched
        from rlctl.core.trainer.runtime.memory import DevicePeak

        self.device_peak = DevicePeak()  # the allocator's peak, read after each step
        self.last_save: dict[str, Any] | None = None  # status.json's last_save
        self._cache_pushed = -1  # compilations when a gs:// run's cache was last pushed

    # --- setup: small create_* steps ---------------------------------------------
    def create_model(self) -> None:
        import jax

        from rlctl.core.trainer import tunix_adapter as ta
        from rlctl.core.trainer.model.models import resolve_model_dir
        from rlctl.core.trainer.model.tokenizer import ChatTokenizer
        from rlctl.core.trainer.rollout import engines

        s = self.spec
        # which engine samples: decided (and refused, when vLLM is asked for and absent)
        # before the model loads; said in the run's first lines and in status.json
        self.engine = engines.pick(
            s.rollout.engine, jax.default_backend(), engines.installed_vllm()
        )
        self.engine.check(s.training.lora_rank)
        self._say(f"rollout engine: {self.engine.why}")
        if s.rollout.pipelined:
            # vLLM samples in a generator process of its own (it takes each pushed
            # version there as it takes the policy's in a synchronous run)
            if self.engine.name != "vanilla" and s.rollout.placement != "process":
                raise ConfigError(
                    f"rollout.engine={self.engine.name} samples in a generator process of "
                    f"its own: rollout.placement={s.rollout.placement} runs rlctl's sampler",
                    hint="--set rollout.placement=process, or --set rollout.engine=vanilla "
                    "(docs/async.md)",
                )
            self._say(f"rollout: {self._rollout_status()['rollout']}")
        from rlctl.core.trainer.model.precision import choose

        self.precision = choose(
            s.model.compute_dtype,
            s.model.dtype,
            jax.default_backend(),
            engine=self.engine.name,
            sampling=s.rollout.compute_dtype,
        )
        self._say(f"precision: {self.precision.why}")
        if self.precision.warning:
            self._say(self.precision.warning)
        from rlctl.core.trainer.runtime import numerics

        # which of the CPU's tricks run here, and whether layers are scanned: one row of
        # numerics.TABLE, given to the sampler and the update
        self.numerics = numerics.current()
        self._say(f"numerics: {self.numerics.describe()}")
        self.emit(phase(Stage.LOADING, f"loading model {s.model.source}"))
        folder = resolve_model_dir(s.model.source)
        self.tokenizer = ChatTokenizer(folder)
        self.model, self.info = ta.load_model(
            folder, s.model.dtype, mesh=self.mesh, compute_dtype=self.precision.dtype
        )
        self.ref_model = None
        self.base_ref = None  # a LoRA run's base, as its checkpoints record it
        if s.training.lora_rank is not None:
            # adapters on the frozen base; the reference (beta > 0) is this base with
            # the adapters zeroed (step.py), so the base is held once
            from rlctl.core.trainer.tunix_adapter import lora

            lora.check_lora(self.info.family, s.training)
            self.model = lora.apply_lora(
                self.model, self.info.family, s.training, seed=s.training.seed
            )
            self.base_ref = lora.base_reference(folder, s.model.source)
        elif s.training.beta > 0:  # the reference model costs memory: only when used
            self.ref_model, _ = ta.load_model(
                folder, s.model.dtype, mesh=self.mesh, compute_dtype=self.precision.dtype
            )
        # the engine the run picked, behind one protocol (rollout_engine.RolloutEngine)
        sampler = engines.start(
            self.engine,
            engines.EngineSetup(
                spec=s,
                model=self.model,
                folder=folder,
                tokenizer=self.tokenizer,
                info=self.info,
                replicate_over=sampler_mesh(s.rollout, self.mesh, self.topo, self.model),
                sampling_dtype=self.precision.sampling,
                numerics=self.numerics,
                say=self._say,
                emit=self.emit,
            ),
        )
        self.rollout = Rollout(s.rollout, self.tokenizer, sampler, s.prompt)
        self.generator = self._generator(folder)

    def _generator(self, folder: Any) -> Any:
        """A pipelined run's generator in this process: its own sampler, reading the
        versions pushed to it (``rollout/generator.py``). None for a synchronous run,
        and for a generator process, which starts with the pipeline (``_pipelined``)."""
        from rlctl.core.trainer.rollout import engines

        s = self.spec
        if not s.rollout.pipelined or self.placement.process:
            return None
        from rlctl.core.trainer.rollout.generator import Generator

        setup = engines.EngineSetup(
            spec=s,
            model=self.model,
            folder=folder,
            tokenizer=self.tokenizer,
            info=self.info,
            # split: the push already makes one whole copy per generator device
            replicate_over=None
            if self.placement.split
            else sampler_mesh(s.rollout, self.mesh, self.topo, self.model),
            sampling_dtype=self.precision.sampling,
            numerics=self.numerics,
            say=self._say,
            emit=self.emit,
        )
        return Generator(engines.start(self.engine, setup), self.placement)

    def _pipelined(self, start: int) -> Any:
        """A pipelined run's steps from ``start`` (``run/pipelined.py``), the restored
        policy as version ``start`` (what was in flight before is gone); None for a
        synchronous run or one with no step left."""
        s = self.spec
        if not s.rollout.pipelined or start >= s.training.steps:
            return None
        generator = self.generator
        if self.placement.process:
            from pathlib import Path

            from rlctl.core.trainer.rollout.generator_process import GeneratorProcess

            # the store the generator opens: a local folder, or gs://BUCKET/PREFIX
            uri = self.run.uri
            root = uri.rpartition("/")[0] if "://" in uri else str(Path(uri).parent)
            generator = GeneratorProcess(self.run, root, s.rollout.max_staleness, say=self._say)
        from rlctl.core.trainer.run.pipelined import Pipelined

        return Pipelined(self, generator, start)

    def create_data(self) -> None:
        s = self.spec
        self.source = load_source(s.data, s.eval.size)
        for note in self.source.notes:  # e.g. a held-out slice smaller than eval.size
            self._say(note)
        self.reward_fns = rewards_lib.resolve(s.rewards)
        # the held-out set and the training data (its first batches when generated)
        # set the run's prompt width
        train = (
            self.source.every_train()
            if self.source.finite
            else [
                p
                for k in range(rollout_lib.PROBE_STEPS)
                for p in self.source.batch(k, s.training.prompts_per_step)
            ]
        )
        self.rollout.probe(self.source.eval_set + train, complete=self.source.finite)

    def lora_record(self) -> dict[str, Any] | None:
        """What a LoRA run's checkpoints say besides the adapters: the base (source
        and SHA-256) and the adapters' shape, for resume and checkpoint-convert."""
        t = self.spec.training
        if self.base_ref is None:
            return None
        return {
            "base": self.base_ref,
            "family": self.info.family,
            "rank": t.lora_rank,
            "alpha": t.lora_alpha,
            "target_modules": list(t.lora_target_modules or []),
        }

    def create_optimizer(self) -> None:
        self.optimizer = make_optimizer(self.model, self.spec.training)

    def compile_update(self) -> None:
        """The update compiled before the optimizer's moments exist, so the compiler's
        working memory and the moments are never resident together (``Update.
        precompile``: the default run's whole-run peak 4.23 -> 3.77 GB). For the batch every step
        gives it (``batch_shape``); one device only."""
        if self.mesh is not None:
            return
        self.emit(phase(Stage.COMPILING, "compiling the update"))
        compiled, size = self.update.precompile(
            self.model, lambda: make_optimizer(self.model, self.spec.training), self.batch_shape()
        )
        # an accelerator's row (on a CPU too, as RLCTL_NUMERICS=gpu runs its programs)
        if self.numerics.row != "cpu":
            self.check_device_memory(compiled, size)

    def check_device_memory(self, update: Any, size: int) -> None:
        """On an accelerator (its numerics row), before the first step: the rollout's and
        the eval's sampler compiled too (``RolloutEngine.precompile``; the first step then
        runs them), and what the device holds at each program's peak beside its memory,
        as the plan of a cluster run says it (``device_fit``): a rollout too big for the
        device is refused here with the setting that fixes it, not by the allocator in
        the middle of step 1 after the update's compile."""
        from flax import nnx

        from rlctl.core.errors import OutOfMemoryError
        from rlctl.core.trainer.device_fit.check import program_fit
        from rlctl.core.trainer.device_fit.fixes import fix_for
        from rlctl.core.trainer.device_fit.report import DeviceFit, ProgramName
        from rlctl.core.trainer.runtime import memory
        from rlctl.core.trainer.update.step import device_bytes

        s = self.spec
        mem = memory.device_memory()
        moments = device_bytes(
            nnx.state(nnx.eval_shape(lambda: make_optimizer(self.model, s.training)))
        )
        weights = device_bytes(nnx.state(self.model))
        ref = device_bytes(nnx.state(self.ref_model)) if self.ref_model is not None else 0
        programs = [program_fit("update", update, 0.0, ref, size if size < self._rows() else None)]
        width = self.rollout.probe_len
        calls: list[tuple[ProgramName, int, int]] = [
            ("rollout", s.training.prompts_per_step, s.rollout.num_generations)
        ]
        if s.eval.size:
            calls.append(("eval", s.eval.batch_size, 1))
        for name, prompts, group in calls:
            compiled = self.rollout.sampler.precompile(prompts, width, group)
            if compiled is not None:  # the engine's own (vLLM's) are not ours to read
                programs.append(program_fit(name, compiled, 0.0, moments + ref))
        import jax

        report = DeviceFit(
            target=mem.where,
            device=mem.where,
            unit={"tpu": "chip", "cpu": "machine"}.get(jax.default_backend(), "GPU"),
            devices=1,
            device_memory=mem.total,
            usable=int(mem.total * memory.HEADROOM),
            state=weights + moments + ref,
            programs=programs,
        )
        report.peak = max(p.peak for p in programs)
        worst = max(programs, key=lambda p: p.peak)
        if report.peak > report.usable:
            report.fits, report.reason = False, worst.name
            raise OutOfMemoryError(
                f"the run does not fit {report.target}: {report.amount}",
                hint=fix_for(report, s),
            )
        self._say(f"device memory: {report.line}")

    def _rows(self) -> int:
        t = self.spec.training
        return t.prompts_per_step * self.spec.rollout.num_generations

    def batch_shape(self) -> Any:
        """The ``Batch`` of every step, as shapes: its prompts at the probed width (a
        generated batch with a longer prompt compiles its own), the optional log-probs
        as ``Update.apply`` adds them."""
        t = self.spec.training
        ref = self.ref_model is not None or (t.lora_rank is not None and t.beta > 0)
        return batch_shape(self.spec, self.rollout.probe_len, ref)

    def create_steps(self) -> None:
        """Jitted update and log-prob functions over prefix-shared forwards."""
        self.update = Update.create(
            self.spec,
            self.tokenizer.pad_id(),
            self.info,
            warn=self._say,
            topology=self.topo,
            numerics=self.numerics,
        )

    def _rollout_status(self) -> dict[str, Any]:
        """status.json's ``rollout`` for a pipelined run (nothing for another)."""
        r = self.spec.rollout
        if not r.pipelined:
            return {}
        return {"rollout": f"{self.placement.describe()}; at most {r.max_staleness} behind"}

    def _latest(self) -> int | None:
        """The latest checkpoint saved or restored (None before ``train`` opened them:
        a benchmark drives ``step`` alone)."""
        ckpt = getattr(self, "ckpt", None)
        return ckpt.latest if ckpt is not None else None

    def _say(self, message: str) -> None:
        self.emit({"event": "message", "message": message})

    # --- eval and one step ---------------------------------------------------------
    def evaluate(self, which: str, step: int) -> dict[str, Any]:
        text = f"evaluating {which} on {len(self.source.eval_set)} held-out prompts"
        self.rollout.sync(self.model)  # the weights of now (a push, for vLLM)
        with self.watch("eval", self.rollout):
            result = evaluation.evaluate(
                self.rollout,
                self.model,
                self.source.eval_set,
                self.reward_fns,
                self.spec.eval,
                which,
                step,
                on_batch=lambda done, total: self.emit(
                    phase(Stage.EVALUATING, text, done, total, "batches")
                ),
                say=self._say,
            )
        if self.writer:
            self.run.write_json(f"{EVAL}/{which}.json", result)
        self.metrics.scalars(evaluation.scalar_prefix(which), evaluation.scalars(result), step)
        self.emit({"event": "eval", "which": which, "result": result})
        return result

    def step(self, step: int) -> StepMetrics:
        """Sample, score and update on the prompts of ``step`` (0-based)."""
        s = self.spec
        t0 = time.perf_counter()
        problems = self.source.batch(step, s.training.prompts_per_step)
        self.rollout.sync(self.model)
        prompts, width = self.rollout.render(problems)
        # each prompt is prefilled once and its group decoded from the shared cache
        with self.watch("rollout", self.rollout):
            out = self.rollout.sample(prompts, width, seed=step_seed(s.training.seed, step, 4))
        t_roll = time.perf_counter() - t0
        # what the engine checks of its samples (vLLM: that it sampled this policy)
        engine = self.rollout.sampler.checks(
            self.model, out.prompt_ids, out.completion_ids, out.logps, out.mask(), step + 1
        )

        # each problem once per completion of its group, to score them
        group = [p for p in problems for _ in range(s.rollout.num_generations)]
        try:
            scores = score(self.reward_fns, out.text, group, out.tokens, self._say)
        except ConfigError as e:  # a reward failed, or gave a value out of its range
            raise ConfigError(
                f"step {step + 1}: {e.message}: the run stopped before its update",
                hint=f"fix the reward, then {finite.resume_hint(self.run.name, self._latest())}",
            ) from e
        batch = self.rollout.batch(out, scores)
        if stops.requested() and stops.deferring():  # the model is untouched yet: drop it
            raise stops.Abandoned
        with self.watch("update", self.update):
            losses, norms, aux = self.update.apply(
                self.model, self.optimizer, self.ref_model, batch, _iterations(s)
            )
        # the values each step brings to the host anyway: a NaN or inf stops the run
        # here, before this step's weights are saved or sampled from
        finite.check_update(step + 1, losses, norms, self.run.name, self._latest())
        return StepMetrics.measure(
            step + 1,
            losses,
            norms,
            aux,
            scores,
            batch.mask,
            elapsed=time.perf_counter() - t0,
            rollout_seconds=t_roll,
            peak_device_bytes=self.device_peak.read(),
            **engine,
        )

    # --- the whole run -----------------------------------------------------------
    def _stop(self, done: int, on_status: OnStatus) -> None:
        """Stop after ``done`` steps: checkpoint them unless the latest checkpoint
        already holds them (a second signal cuts this save short), then raise. A save
        in flight is waited for first, and so is the stop's own."""
        if self.ckpt.in_flight() is not None:
            self._say(
                f"stopping: waiting for checkpoint {self.ckpt.in_flight()} to be "
                "written (press Ctrl-C again to skip it)"
            )
        self.ckpt.wait()
        self._saves_done()
        saved = self.ckpt.latest
        if done and done != saved:
            self._say(f"stopping: saving checkpoint {done} (press Ctrl-C again to skip it)")
            with self.watch("checkpoint save", self.ckpt):
                self.ckpt.save(done, self.model, self.optimizer)
            self.ckpt.wait()
            self._saves_done()
            saved = done
        said: dict[str, Any] = {"last_save": self.last_save} if self.last_save else {}
        on_status(StatusUpdate(step=done, latest_checkpoint=saved, **said))
        raise stops.StopRequested(done, saved)

    def _saves_done(self) -> int | None:
        """Say each save completed since the last call (a background one once it is
        written and committed), and return the newest one's step, if any."""
        from rlctl.core.units import human_bytes

        newest = None
        for saved in self.ckpt.finished():
            how = (
                f"in the background in {saved.write_s:.1f} s (the step waited {saved.held_s:.2f} s)"
                if saved.background
                else f"in {saved.held_s:.1f} s"
            )
            size = f" ({human_bytes(saved.bytes)})" if saved.bytes else ""
            self._say(f"checkpoint {saved.step} saved{size} {how}")
            newest = saved.step
            self.last_save = saved.record()
        return newest

    def _push_cache(self) -> None:
        """A gs:// run's compilation cache pushed to its store when this process
        compiled something since the last push (after step 1; after a late compile)."""
        from rlctl.core.trainer.runtime.compiles import push_cache

        if self.writer and self.compiles.total != self._cache_pushed:
            push_cache(self.run, self._say)  # a failure is said once, not every step
            self._cache_pushed = self.compiles.total

    def _readable(self, rel: str) -> bool:
        """``rel`` exists and holds a JSON object (a cut or garbled file is re-made)."""
        if not self.run.exists(rel):
            return False
        try:
            return _is_record(self.run.read_text(rel))
        except UnicodeDecodeError:
            return False

    def train(self, on_status: OnStatus) -> dict[str, Any]:
        from rlctl.core.trainer.runtime.compiles import CompileWatch, enable_persistent_cache
        from rlctl.core.trainer.runtime.distributed import using_mesh

        # before the first program compiles; a gs:// run's cache is pulled from its store
        enable_persistent_cache(self._say, self.run)
        self.compiles = CompileWatch(report=self._say)
        with using_mesh(self.mesh), self.compiles:
            return self._train(on_status)

    def _train(self, on_status: OnStatus) -> dict[str, Any]:
        from rlctl.core.trainer.run.metrics import MetricsWriter, NullMetrics

        s = self.spec
        if not self.writer:
            on_status = lambda update: None  # noqa: E731 - process 0 keeps status.json
        # each program's compile seconds in status.json as it compiles (status shows them)
        self.compiles.on_compile = lambda seconds: on_status(StatusUpdate(compiles=seconds))
        self.create_model()
        self.create_data()
        self.create_steps()
        self.compile_update()  # before the optimizer's moments take their memory
        self.create_optimizer()
        # the checkpoints first: a resume they refuse leaves no new event file behind
        self.ckpt = Checkpoints(
            self.run,
            self.topo,
            s.checkpoint.keep,
            warn=lambda m: self.emit({"event": "message", "message": m}),
            recover=self.recover,
            lora=self.lora_record(),
            background=self.numerics.background_saves,
        )
        self.metrics = (
            MetricsWriter(self.run, s.output.tensorboard) if self.writer else NullMetrics()
        )
        try:
            # The baseline is the initial weights' eval: taken (or re-created, when
            # eval/ was lost) before any checkpoint is restored, never from trained ones.
            baseline = None
            needs_baseline = agree(not self._readable(f"{EVAL}/baseline.json"), self.topo)
            if s.eval.size and needs_baseline:
                on_status(StatusUpdate(phase=Phase.EVALUATING))
                baseline = self.evaluate("baseline", 0)
            if self.ckpt.latest is not None:
                self.emit(phase(Stage.RESTORING, f"restoring checkpoint {self.ckpt.latest}"))
            start = self.ckpt.restore_latest(self.model, self.optimizer)
            self.metrics.truncate_after(start)
            self.pipelined = self._pipelined(start)
            if start:
                self.emit({"event": "message", "message": f"resumed from checkpoint {start}"})
            self.emit(
                {
                    "event": "start",
                    "name": self.run.name,
                    "step": start,
                    "total_steps": s.training.steps,
                }
            )
            on_status(
                StatusUpdate(
                    phase=Phase.RUNNING,
                    step=start,
                    latest_checkpoint=start or None,
                    processes=self.topo.process_count,
                    devices=self.topo.device_count,
                    engine=self.engine.name,
                    precision=self.info.compute_dtype,
                    sampling_precision=self.rollout.sampler.sampling_dtype,
                    **self._rollout_status(),
                )
            )
            # One process only: a multi-host run's processes would have to agree on
            # the stop (a collective each step) before the collective save; there a
            # stop takes effect at once, as before, and resume repeats the steps since
            # the last checkpoint.
            safe = not self.topo.multi_process
            if start < s.training.steps:  # its programs compile in this step
                self.emit(
                    phase(
                        Stage.COMPILING,
                        f"step {start + 1}: compiling and running (the first step is slower)",
                    )
                )
            if self.pipelined is not None:
                self.pipelined.begin()
            for step in range(start, s.training.steps):
                with stops.deferred(safe):  # a first Ctrl-C waits for a safe point
                    compiling = sum(self.compiles.seconds.values())
                    try:
                        row = (self.pipelined or self).step(step).row()
                    except stops.Abandoned:
                        self._stop(step, on_status)
                    self.compiles.warm()  # the run's programs exist: later compiles are news
                    self._push_cache()
                    self.metrics.write(row)
                    done = step + 1
                    # The step line first: a user sees the result before a save that may
                    # take seconds, and a checkpoint on disk implies its line was printed.
                    # with the seconds this step spent compiling (or loading from the
                    # cache): an ETA leaves them out, as the later steps do not repeat them
                    compiled = round(sum(self.compiles.seconds.values()) - compiling, 1)
                    self.emit(
                        {"event": "step", "step": done, "metrics": row, "compile_seconds": compiled}
                    )
                    if done % s.checkpoint.interval == 0 or done == s.training.steps:
                        # in the background, only once complete is it the latest
                        with self.watch("checkpoint save", self.ckpt):
                            self.ckpt.save(done, self.model, self.optimizer)
                    saved = self._saves_done()
                    peak = row.get("peak_device_bytes")
                    given: dict[str, Any] = (
                        {"latest_checkpoint": saved, "last_save": self.last_save} if saved else {}
                    )
                    if peak:
                        given["peak_device_bytes"] = peak
                    on_status(StatusUpdate(phase=Phase.RUNNING, step=done, **given))
                    if stops.requested() and stops.deferring():
                        self._stop(done, on_status)
                if (
                    s.eval.interval
                    and s.eval.size
                    and done % s.eval.interval == 0
                    and done != s.training.steps
                ):
                    try:
                        self.evaluate(f"step-{done}", done)
                    except KeyboardInterrupt:
                        # an eval does not touch the model: a first stop here still
                        # keeps the steps done (a second, during that save, does not)
                        if safe and len(stops.received()) == 1:
                            with stops.deferred():
                                self._stop(done, on_status)
                        raise
            final = self.evaluate("final", s.training.steps) if s.eval.size else None
            self.ckpt.wait()  # the last save, written while the final eval ran
            if saved := self._saves_done():
                on_status(StatusUpdate(latest_checkpoint=saved, last_save=self.last_save))
            return {"baseline": baseline, "final": final}
        finally:
            if self.pipelined is not None:
                self.pipelined.close()  # the generator's thread, before anything it reads
            self.metrics.close()
            self.ckpt.close()


def _is_record(text: str) -> bool:
    import json

    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):  # garbled, or nested too deeply to read
        return False


def _iterations(spec: RunSpec) -> int:
    """``training.num_iterations``, which RunSpec's validator always fills."""
    n = spec.training.num_iterations
    if n is None:
        raise ValueError("training.num_iterations is unset: not a validated RunSpec")
    return n


def run_trainer(
    spec: RunSpec,
    run: RunDir,
    progress: Progress | None,
    on_status: OnStatus,
    topology: Topology | None = None,
    recover: bool = False,
    watch: Watch | None = None,
) -> dict[str, Any]:
    return Trainer(spec, run, progress, topology, recover, watch).train(on_status)
