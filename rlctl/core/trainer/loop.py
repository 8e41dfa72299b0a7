"""The trainer entrypoint: one RunSpec + one run folder -> a trained, evaluated run.

The same code runs on a laptop and in a cluster's pods. Everything a step needs
(prompts, sampling seed) is a pure function of (seed, step), and checkpoints hold
the model and optimizer state, so a run killed at any point and resumed from its
latest complete checkpoint produces exactly the metrics of an uninterrupted run.

In a multi-host workload every process runs this same loop on the same inputs
over one mesh (distributed.py); ``self.writer`` (process 0) alone writes the run
store, and decisions read from the store are agreed on before they branch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rlctl.core.config.models import RunSpec
from rlctl.core.errors import ConfigError
from rlctl.core.runs.store import CHECKPOINTS, EVAL, LocalRunDir, latest_checkpoint_step
from rlctl.core.trainer import rewards as rewards_lib
from rlctl.core.trainer.data import Problem, load_source
from rlctl.core.trainer.distributed import (
    Topology,
    agree,
    place_like,
    to_host,
    weights_fit_each_device,
)
from rlctl.core.trainer.loss import group_advantages
from rlctl.core.trainer.prompts import chat_messages

Progress = Callable[[dict[str, Any]], None]
BUCKET = 16  # sequence lengths are rounded up to this to bound recompilations


def _round_up(n: int, to: int) -> int:
    return max(to, math.ceil(n / to) * to)


def step_seed(seed: int, step: int, stream: int) -> int:
    return int(np.random.default_rng([seed, stream, step]).integers(0, 2**31 - 1))


class Trainer:
    def __init__(self, spec: RunSpec, run: LocalRunDir, progress: Progress | None = None,
                 topology: Topology | None = None):
        from rlctl.core.trainer.distributed import current, make_mesh

        self.spec = spec
        self.run = run
        self.emit = progress or (lambda event: None)
        self.topo = topology or current()
        self.writer = self.topo.is_writer
        self.mesh = make_mesh()  # None on one device
        self.sampler_mesh = None  # a mesh when the sampler decodes on whole weights

    # --- setup: small create_* steps ---------------------------------------------
    def create_model(self) -> None:
        from rlctl.core.trainer import tunix_adapter as ta
        from rlctl.core.trainer.models import resolve_model_dir
        from rlctl.core.trainer.tokenizer import ChatTokenizer

        s = self.spec
        if s.training.lora_rank is not None:
            raise ConfigError(
                "training.lora_rank is not supported by the local trainer yet",
                hint="remove training.lora_rank to train all parameters",
            )
        if s.rollout.engine == "vllm":
            raise ConfigError(
                "rollout.engine 'vllm' needs a TPU/GPU vLLM install; this machine uses 'vanilla'",
                hint="use --set rollout.engine=auto",
            )
        self.emit({"event": "message", "message": f"loading model {s.model.source}"})
        folder = resolve_model_dir(s.model.source)
        self.tokenizer = ChatTokenizer(folder)
        self.model, self.info = ta.load_model(folder, s.model.dtype, mesh=self.mesh)
        self.ref_model = None
        if s.training.beta > 0:  # the reference model costs memory: only when used
            self.ref_model, _ = ta.load_model(folder, s.model.dtype, mesh=self.mesh)
        # Across processes, decoding on FSDP shards all-gathers every layer per token
        # over the host network: the sampler gets whole weights instead (measured on
        # CPU: rollout 3.9x faster for two processes; in one process, with fast local
        # collectives, the shards were faster, so they stay).
        mode = s.rollout.sampler_weights
        if self.mesh is not None and (mode == "whole" or (
                mode == "auto" and self.topo.multi_process
                and weights_fit_each_device(self.model))):
            self.sampler_mesh = self.mesh
        self.max_prompt = s.rollout.max_prompt_tokens
        self.sampler = ta.make_sampler(
            self.model, self.tokenizer, self.info,
            cache_size=_round_up(self.max_prompt, BUCKET) + s.rollout.max_new_tokens + BUCKET,
            replicate_over=self.sampler_mesh,
        )

    def create_data(self) -> None:
        s = self.spec
        self.source = load_source(s.data, s.eval.size)
        self.reward_fns = rewards_lib.resolve(s.rewards)
        # One prompt width for the whole run (every new width recompiles the sampler and
        # the update): the longest of the held-out set and of the first training batches.
        probe = self.source.eval_set + [
            p for k in range(64) for p in self.source.batch(k, s.training.prompts_per_step)
        ]
        self._prompt_len = _round_up(max(self._prompt_tokens(p) for p in probe), BUCKET)

    def create_optimizer(self) -> None:
        import optax
        from flax import nnx

        t = self.spec.training
        lr: Any = t.learning_rate
        if t.warmup_steps:
            lr = optax.linear_schedule(0.0, t.learning_rate, t.warmup_steps)
        tx = optax.chain(
            optax.clip_by_global_norm(t.max_grad_norm),
            optax.adamw(lr, b1=0.9, b2=0.99, weight_decay=t.weight_decay),
        )
        self.optimizer = nnx.Optimizer(self.model, tx, wrt=nnx.Param)

    def create_steps(self) -> None:
        """Jitted update and log-prob functions over prefix-shared forwards."""
        import optax
        from flax import nnx

        from rlctl.core.trainer import tunix_adapter as ta
        from rlctl.core.trainer.loss import LossConfig, policy_loss

        s = self.spec
        cfg = LossConfig(
            algorithm=s.algorithm,
            epsilon=s.training.epsilon,
            epsilon_high=s.training.epsilon_high,
            beta=s.training.beta,
            kl_estimator=s.training.kl_estimator,
            aggregation=s.training.loss_aggregation,
        )
        self.loss_config = cfg

        def logps_fn(model, prompt_ids, completion_ids):
            return ta.shared_prefix_logps(
                model, prompt_ids, completion_ids, group=s.rollout.num_generations,
                pad_id=self.tokenizer.pad_id(), temperature=s.rollout.temperature,
                info=self.info,
            )

        # Donating model and optimizer lets XLA update parameters and Adam moments in
        # place instead of holding old and new copies (~1.6 GB less for SmolLM2-135M).
        @nnx.jit(donate_argnums=(0, 1))
        def train_step(model, optimizer, batch):
            def loss_fn(m):
                logps, entropy = logps_fn(m, batch["prompt_ids"], batch["completion_ids"])
                loss, aux = policy_loss(
                    logps, batch["mask"], batch["advantages"], cfg,
                    old_logps=batch.get("old_logps"), ref_logps=batch.get("ref_logps"),
                )
                return loss, {**aux, "entropy": entropy}

            (loss, aux), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
            optimizer.update(model, grads)
            return loss, aux, optax.global_norm(grads)

        @nnx.jit
        def logps(model, prompt_ids, completion_ids):
            return logps_fn(model, prompt_ids, completion_ids)[0]

        self.train_step = train_step
        self.logps = logps

    # --- checkpoints -----------------------------------------------------------
    def _checkpointer(self):
        import orbax.checkpoint as ocp

        c = self.spec.checkpoint
        # run store sync (gs://): bring the latest committed checkpoint into staging;
        # every process restores the step process 0 chose
        latest = agree(latest_checkpoint_step(self.run) or 0, self.topo)
        self._restore_step = latest or None
        if latest:
            self.run.fetch_checkpoint(latest)
        folder = self.run.path_for(CHECKPOINTS)
        extra = {}
        if self.topo.multi_process:
            # gathered, unsharded arrays: each process reads and writes them on its own
            # (Orbax leaves creating the folder to us in that mode)
            Path(folder).mkdir(parents=True, exist_ok=True)
            me = self.topo.process_index
            extra["multiprocessing_options"] = ocp.options.MultiprocessingOptions(
                primary_host=me, active_processes={me})
        return ocp.CheckpointManager(
            folder,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=c.keep, create=not self.topo.multi_process,
                enable_async_checkpointing=False, **extra
            ),
        )

    def _state(self) -> dict[str, Any]:
        from flax import nnx

        return {
            "model": nnx.to_pure_dict(nnx.state(self.model, nnx.Param)),
            "optimizer": nnx.to_pure_dict(nnx.state(self.optimizer)),
        }

    def save(self, step: int) -> None:
        import orbax.checkpoint as ocp

        state = self._state()
        if self.topo.multi_process:
            state = to_host(state, self.topo)  # a collective: every process takes part
        if not self.writer:
            return
        self.ckpt.save(step, args=ocp.args.StandardSave(state))
        self.ckpt.wait_until_finished()
        self.run.publish_checkpoint(step)  # run store sync (gs://): upload, then marker

    def restore_latest(self) -> int:
        import jax
        import orbax.checkpoint as ocp
        from flax import nnx

        step = self._restore_step
        if step is None:
            return 0
        state = self._state()
        if self.topo.multi_process:  # whole arrays from disk, then sharded over the mesh
            target = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), state)
            restored = self.ckpt.restore(step, args=ocp.args.StandardRestore(target))
            restored = place_like(restored, state)
        else:
            abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
            restored = self.ckpt.restore(step, args=ocp.args.StandardRestore(abstract))
        model_state = nnx.state(self.model, nnx.Param)
        nnx.replace_by_pure_dict(model_state, restored["model"])
        nnx.update(self.model, model_state)
        opt_state = nnx.state(self.optimizer)
        nnx.replace_by_pure_dict(opt_state, restored["optimizer"])
        nnx.update(self.optimizer, opt_state)
        return int(step)

    # --- rollout -----------------------------------------------------------------
    def _prompt_tokens(self, problem: Problem) -> int:
        text = self.tokenizer.apply_chat_template(chat_messages(problem.question))
        return len(self.tokenizer.encode(text))

    def render(self, problems: list[Problem]) -> list[str]:
        prompts = [self.tokenizer.apply_chat_template(chat_messages(p.question)) for p in problems]
        longest = max(len(self.tokenizer.encode(p)) for p in prompts)
        if longest > self.max_prompt:
            raise ConfigError(
                f"a prompt has {longest} tokens, more than rollout.max_prompt_tokens="
                f"{self.max_prompt}",
                hint=f"--set rollout.max_prompt_tokens={_round_up(longest, 64)}",
            )
        if longest > self._prompt_len:  # rare: a longer prompt than probed; widen for good
            self._prompt_len = _round_up(longest, BUCKET)
        return prompts

    def sample(self, prompts: list[str], seed: int, greedy: bool = False):
        from rlctl.core.trainer import tunix_adapter as ta

        r = self.spec.rollout
        return ta.generate(
            self.sampler, prompts,
            max_new_tokens=r.max_new_tokens,
            max_prompt_tokens=self._prompt_len,
            eos_ids=self.tokenizer.eos_ids,
            temperature=None if greedy else r.temperature,
            top_p=r.top_p, top_k=r.top_k, seed=seed,
        )

    def completion_arrays(self, tokens: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Right-padded completion ids with the stop token included where it was emitted,
        so the policy also learns when to stop; length bucketed to bound recompiles."""
        max_new = self.spec.rollout.max_new_tokens
        pad, eos = self.tokenizer.pad_id(), self.tokenizer.eos_id()
        lengths = [min(len(t) + 1, max_new) if len(t) < max_new else max_new for t in tokens]
        width = min(_round_up(max(lengths), BUCKET), _round_up(max_new, BUCKET))
        ids = np.full((len(tokens), width), pad, np.int32)
        mask = np.zeros((len(tokens), width), np.int32)
        for i, t in enumerate(tokens):
            t = np.asarray(t[:max_new], np.int32)
            ids[i, : len(t)] = t
            if len(t) < max_new:
                ids[i, len(t)] = eos
            mask[i, : lengths[i]] = 1
        return ids, mask

    def score(self, texts: list[str], problems: list[Problem]):
        """(training reward, exact-answer correctness, format) per completion."""
        pairs = list(zip(texts, problems, strict=True))
        total = [rewards_lib.total_reward(self.reward_fns, t, p.answer) for t, p in pairs]
        correct = [rewards_lib.correct_reward(t, p.answer) for t, p in pairs]
        formatted = [rewards_lib.format_reward(t, p.answer) > 0 for t, p in pairs]
        return (np.array(total, np.float32), np.array(correct, np.float32),
                np.array(formatted, np.float32))

    # --- eval ------------------------------------------------------------------
    def evaluate(self, which: str, step: int) -> dict[str, Any]:
        from rlctl.core.trainer import tunix_adapter as ta

        e = self.spec.eval
        problems = self.source.eval_set
        ta.sync_sampler(self.sampler, self.model, self.sampler_mesh)
        t0 = time.perf_counter()
        texts: list[str] = []
        for i in range(0, len(problems), e.batch_size):
            chunk = problems[i : i + e.batch_size]
            padded = chunk + [chunk[0]] * (e.batch_size - len(chunk))  # one compiled shape
            out = self.sample(self.render(padded), seed=0, greedy=True)
            texts.extend(out.text[: len(chunk)])
        total, correct, formatted = self.score(texts, problems)
        n = len(problems)
        result = {
            "which": which,
            "step": step,
            "n": n,
            "accuracy": float(np.mean(correct)) if n else 0.0,
            "format_rate": float(np.mean(formatted)) if n else 0.0,
            "mean_reward": float(np.mean(total)) if n else 0.0,
            "greedy": True,
            "seconds": round(time.perf_counter() - t0, 2),
            "samples": [
                {"question": p.question, "gold": p.answer, "completion": t, "correct": bool(c)}
                for p, t, c in list(zip(problems, texts, correct))[: e.samples]
            ],
        }
        if self.writer:
            self.run.write_json(f"{EVAL}/{which}.json", result)
        self.metrics.scalars(f"eval_{which}" if which in ("baseline", "final") else "eval",
                             {k: result[k] for k in ("accuracy", "format_rate", "mean_reward")},
                             step)
        self.emit({"event": "eval", "which": which, "result": result})
        return result

    # --- one step --------------------------------------------------------------
    def step(self, step: int) -> dict[str, Any]:
        from rlctl.core.trainer import tunix_adapter as ta

        s = self.spec
        G = s.rollout.num_generations
        t0 = time.perf_counter()
        problems = self.source.batch(step, s.training.prompts_per_step)
        group = [p for p in problems for _ in range(G)]
        ta.sync_sampler(self.sampler, self.model, self.sampler_mesh)
        out = self.sample(self.render(group), seed=step_seed(s.training.seed, step, 4))
        t_roll = time.perf_counter() - t0

        rewards, correct, formatted = self.score(out.text, group)
        adv = group_advantages(rewards, G)
        completion_ids, mask = self.completion_arrays(list(out.tokens))
        prompt_ids = np.asarray(out.padded_prompt_tokens, np.int32)[::G]  # one row per group
        batch: dict[str, Any] = {
            "prompt_ids": prompt_ids, "completion_ids": completion_ids,
            "mask": mask, "advantages": adv,
        }
        if self.ref_model is not None:
            batch["ref_logps"] = self.logps(self.ref_model, prompt_ids, completion_ids)
        if s.training.num_iterations > 1:  # the rollout policy, frozen for all iterations
            batch["old_logps"] = self.logps(self.model, prompt_ids, completion_ids)
        losses, norms, auxes = [], [], []
        for _ in range(s.training.num_iterations):
            loss, aux, gnorm = self.train_step(self.model, self.optimizer, batch)
            losses.append(float(loss))
            norms.append(float(gnorm))
            auxes.append(aux)
        elapsed = time.perf_counter() - t0
        comp_tokens = int(mask.sum())
        lengths = mask.sum(axis=1)
        aux = auxes[-1]
        return {
            "step": step + 1,
            "loss": float(np.mean(losses)),
            "reward_mean": float(rewards.mean()),
            "reward_min": float(rewards.min()),
            "reward_max": float(rewards.max()),
            "reward_std": float(rewards.std()),
            "accuracy": float(correct.mean()),
            "format_rate": float(formatted.mean()),
            "kl": float(aux["kl"]),
            "entropy": float(aux["entropy"]),
            "clip_fraction": float(aux["clip_fraction"]),
            "grad_norm": float(np.mean(norms)),
            "completion_length": float(lengths.mean()),
            "completion_tokens": comp_tokens,
            "step_seconds": round(elapsed, 3),
            "rollout_seconds": round(t_roll, 3),
            "tokens_per_s": round(comp_tokens / elapsed, 2) if elapsed else 0.0,
        }

    # --- the whole run -----------------------------------------------------------
    def train(self, on_status: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        from rlctl.core.trainer.distributed import using_mesh

        with using_mesh(self.mesh):
            return self._train(on_status)

    def _train(self, on_status: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        from rlctl.core.trainer.metrics import MetricsWriter, NullMetrics

        s = self.spec
        if not self.writer:
            on_status = lambda fields: None  # noqa: E731 - process 0 keeps status.json
        self.create_model()
        self.create_data()
        self.create_optimizer()
        self.create_steps()
        self.metrics = (MetricsWriter(self.run, s.output.tensorboard) if self.writer
                        else NullMetrics())
        self.ckpt = self._checkpointer()
        try:
            start = self.restore_latest()
            self.metrics.truncate_after(start)
            if start:
                self.emit({"event": "message", "message": f"resumed from checkpoint {start}"})
            baseline = None
            needs_baseline = agree(not self.run.exists(f"{EVAL}/baseline.json"), self.topo)
            if s.eval.size and needs_baseline:
                on_status({"phase": "evaluating", "step": start})
                baseline = self.evaluate("baseline", 0)
            self.emit({"event": "start", "name": self.run.name, "step": start,
                       "total_steps": s.training.steps})
            on_status({"phase": "running", "step": start, "latest_checkpoint": start or None,
                       "processes": self.topo.process_count,
                       "devices": self.topo.device_count})
            for step in range(start, s.training.steps):
                row = self.step(step)
                self.metrics.write(row)
                done = step + 1
                saved = None
                if done % s.checkpoint.interval == 0 or done == s.training.steps:
                    self.save(done)
                    saved = done
                on_status({"phase": "running", "step": done,
                           **({"latest_checkpoint": saved} if saved else {})})
                self.emit({"event": "step", "step": done, "metrics": row})
                if s.eval.interval and s.eval.size and done % s.eval.interval == 0 \
                        and done != s.training.steps:
                    self.evaluate(f"step-{done}", done)
            final = self.evaluate("final", s.training.steps) if s.eval.size else None
            return {"baseline": baseline, "final": final}
        finally:
            self.metrics.close()
            self.ckpt.close()


def run_trainer(spec: RunSpec, run: LocalRunDir, progress: Progress | None,
                on_status: Callable[[dict[str, Any]], None],
                topology: Topology | None = None) -> dict[str, Any]:
    return Trainer(spec, run, progress, topology).train(on_status)
