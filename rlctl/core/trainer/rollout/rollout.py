"""Rollout: prompts rendered and padded, completions sampled, scored, and grouped into
the ``Batch`` the update trains on.

Every new prompt or completion width recompiles the sampler and the update, so
both are fixed when the run starts: completions are padded to
``rollout.max_new_tokens``, prompts to the bucket (``BUCKET``) of the data's
longest prompt. The sampling seed of a step is a pure function of (seed, step) so
that a resumed run draws what the uninterrupted one did.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from rlctl.core.config.models import MAX_PROMPT_TOKENS, PromptSpec, RolloutSpec
from rlctl.core.errors import ConfigError
from rlctl.core.trainer import rewards as rewards_lib
from rlctl.core.trainer.algorithm.loss import group_advantages
from rlctl.core.trainer.data import Problem
from rlctl.core.trainer.data.prompts import prompt_text
from rlctl.core.trainer.rewards import Reward
from rlctl.core.trainer.runtime.distributed import Topology, weights_fit_each_device

if TYPE_CHECKING:  # flax and the models: imported once a Rollout is created
    from rlctl.core.trainer.rollout.rollout_engine import RolloutEngine

BUCKET = 16  # prompt widths are rounded up to this
PROBE_STEPS = 64  # batches of a generated dataset measured up front for the prompt width


def round_up(n: int, to: int) -> int:
    return max(to, math.ceil(n / to) * to)


def prompt_width(probed: int, longest: int) -> int:
    """The padded prompt width of one batch: the probed width, or the bucket of a longer
    prompt in this batch.

    A pure function of the batch, not of the batches before it: a run resumed at step
    k pads exactly as the uninterrupted run did, whatever it saw before k (a width kept
    "for good" after a widening lived only in memory, not in the checkpoint). Each
    width compiles once and stays cached, so the distinct shapes are the same few
    buckets between the probe and ``rollout.max_prompt_tokens`` either way.
    """
    return max(probed, round_up(longest, BUCKET))


def too_long_hint(tokens: int) -> str:
    """What to do about a prompt of ``tokens`` tokens: raise the limit to fit it when
    the spec allows that much, else shorten or drop the row (a hint of five million
    tokens is no hint)."""
    wanted = round_up(tokens, 64)
    if wanted <= MAX_PROMPT_TOKENS:
        return f"--set rollout.max_prompt_tokens={wanted}"
    return f"shorten or drop that row: a prompt may have at most {MAX_PROMPT_TOKENS:,} tokens"


def step_seed(seed: int, step: int, stream: int) -> int:
    """A seed for ``stream`` at ``step`` that depends on nothing else, so a resumed
    run samples exactly what the uninterrupted run did (the sampler draws from
    this seed alone: ``sampler.sample_groups``)."""
    return int(np.random.default_rng([seed, stream, step]).integers(0, 2**31 - 1))


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Batch:
    """One step's training input: a pytree, so the jitted update takes it whole.

    The optional log-probs are ``None`` when unused (no reference model; a single
    iteration per batch), which gives the update a different, smaller program.
    """

    prompt_ids: Any  # [P, Lp] left-padded, one row per group (the prefix is shared)
    completion_ids: Any  # [P*G, Lc] right-padded, grouped by prompt
    mask: Any  # [P*G, Lc] 1 on completion tokens (stop token included)
    advantages: Any  # [P*G]
    ref_logps: Any = None  # [P*G, Lc] of the reference model, for the KL term
    old_logps: Any = None  # [P*G, Lc] of the rollout policy, frozen over iterations
    # [P*G, Lc] of the older policy that sampled a pipelined run's batch, when the loss
    # corrects for it by a weight (rollout.correction=decoupled); else None
    behaviour_logps: Any = None


@dataclass(frozen=True)
class Scores:
    """Per completion: the training reward, and the two figures reported beside it;
    per reward of the spec: its mean over the completions it applied to."""

    reward: np.ndarray  # what the policy is trained on (the spec's rewards, weighted)
    correct: np.ndarray  # exact answer, 0/1, whatever the training reward is
    formatted: np.ndarray  # the answer tag present, 0/1
    reward_means: dict[str, float | None] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class Samples:
    """Completions of P prompts, ``group`` per prompt, grouped by prompt."""

    text: list[str]  # each completion decoded, without its stop token
    tokens: list[np.ndarray]  # each completion's ids, without its stop token
    prompt_ids: np.ndarray  # [P, Lp] left-padded, one row per group
    completion_ids: np.ndarray  # [P*G, max_new_tokens]: the stop token kept, pad after
    lengths: np.ndarray  # [P*G] tokens before the stop (max_new_tokens: none emitted)
    logps: np.ndarray  # [P*G, max_new_tokens] of each sampled token under the temperature

    def mask(self) -> np.ndarray:
        """1 on completion tokens, the stop token included, so the policy also learns
        when to stop; always ``max_new_tokens`` wide, so the update compiles once."""
        width = self.completion_ids.shape[1]
        return (np.arange(width)[None, :] <= self.lengths[:, None]).astype(np.int32)


def score(
    rewards: list[Reward],
    texts: list[str],
    problems: list[Problem],
    tokens: list[np.ndarray] | None = None,
    say: Callable[[str], None] | None = None,
) -> Scores:
    """Each completion scored by the spec's rewards (TRL-style ones once for the whole
    batch), and by the built-in answer checks whatever the rewards are. ``say``: where
    the lines a reward prints go (``rewards.score``)."""
    ids = tokens if tokens is not None else [None] * len(texts)
    samples = [
        rewards_lib.Sample(
            t,
            p.question,
            p.answer,
            p.columns,
            p.messages,
            None if i is None else [int(x) for x in i],
        )
        for t, p, i in zip(texts, problems, ids, strict=True)
    ]
    scored = rewards_lib.score(rewards, samples, say)
    correct = [rewards_lib.correct_reward(t, p.answer) for t, p in zip(texts, problems)]
    formatted = [rewards_lib.format_reward(t, p.answer) > 0 for t, p in zip(texts, problems)]
    return Scores(
        scored.total, np.array(correct, np.float32), np.array(formatted, np.float32), scored.means()
    )


def sampler_mesh(spec: RolloutSpec, mesh: Any, topo: Topology, model: Any) -> Any:
    """The mesh to give the sampler whole weights on, or None to decode on the shards.

    Across processes, decoding on FSDP shards all-gathers every layer per token over
    the host network, so whole weights are faster; in one process, with fast local
    collectives, the shards were (docs/decisions/trainer.md).
    """
    mode = spec.sampler_weights
    if mesh is not None and (
        mode == "whole"
        or (mode == "auto" and topo.multi_process and weights_fit_each_device(model))
    ):
        return mesh
    return None


class Rollout:
    """The engine that samples (``rollout_engine.RolloutEngine``: rlctl's sampler or vLLM)
    and the tokenizer, and what turns problems into a ``Batch``."""

    def __init__(
        self,
        spec: RolloutSpec,
        tokenizer: Any,
        sampler: RolloutEngine,
        prompt: PromptSpec | None = None,
    ) -> None:
        self.spec = spec
        self.prompt = prompt or PromptSpec()
        self.tokenizer = tokenizer
        self.sampler = sampler
        self.probe_len = 0  # until probe(): each batch gets the bucket of its own longest

    @classmethod
    def create(
        cls,
        spec: RolloutSpec,
        model: Any,
        tokenizer: Any,
        info: Any,
        replicate_over: Any = None,
        prompt: PromptSpec | None = None,
        compute_dtype: str | None = None,
        numerics: Any = None,
    ) -> Rollout:
        """``compute_dtype``: what the sampler's matmuls read (precision.choose), when
        not ``info``'s (the update's); ``numerics``: the backend's row of the numerics
        table (this backend's when None)."""
        from rlctl.core.trainer.rollout.sampler import Sampler

        sampler = Sampler(
            model,
            info,
            pad_id=tokenizer.pad_id(),
            eos_ids=tokenizer.eos_ids,
            max_new_tokens=spec.max_new_tokens,
            replicate_over=replicate_over,
            compute_dtype=compute_dtype,
            numerics=numerics,
        )
        return cls(spec, tokenizer, sampler, prompt)

    def prompt_text(self, problem: Problem) -> str:
        """The exact text the model is prompted with for ``problem``."""
        return prompt_text(self.tokenizer, problem, self.prompt)

    def prompt_lengths(self, problems: list[Problem]) -> list[int]:
        """Each prompt's token count; for a prompt too long to fit at any width (more
        characters than ``max_prompt_tokens`` tokens can stand for), a lower bound
        found without tokenizing it (a line of megabytes took minutes, #47)."""
        texts = [self.prompt_text(p) for p in problems]
        per = max(1, getattr(self.tokenizer, "max_token_chars", 1))
        cap = self.spec.max_prompt_tokens * per
        short = [t for t in texts if len(t) <= cap]
        counted = iter(self.tokenizer.lengths(short) if short else [])
        return [next(counted) if len(t) <= cap else -(-len(t) // per) for t in texts]

    def probe(self, problems: list[Problem], complete: bool = False) -> None:
        """Fix the prompt width of every step (each new width recompiles the sampler
        and the update) to the bucket of the longest of ``problems``.

        ``complete``: ``problems`` is the whole dataset, so a prompt longer than
        ``rollout.max_prompt_tokens`` is refused now, not at the step that draws
        it. A generated dataset is probed on its first batches; a longer batch
        later gets a wider width for itself (``prompt_width``).
        """
        lengths = self.prompt_lengths(problems)
        limit = self.spec.max_prompt_tokens
        over = [n for n in lengths if n > limit]
        if complete and over:
            longest = max(range(len(lengths)), key=lengths.__getitem__)
            where = problems[longest].where
            raise ConfigError(
                f"{len(over)} of the data's {len(lengths)} prompts are longer than "
                f"rollout.max_prompt_tokens={limit} (the longest"
                f"{f', {where},' if where else ''} has "
                f"{'at least ' if self._bound(problems[longest]) else ''}"
                f"{lengths[longest]:,} tokens)",
                hint=too_long_hint(lengths[longest]),
            )
        self.probe_len = min(round_up(max(lengths), BUCKET), round_up(limit, BUCKET))

    def _bound(self, problem: Problem) -> bool:
        """Whether ``prompt_lengths`` gave ``problem`` a lower bound, not a count."""
        per = max(1, getattr(self.tokenizer, "max_token_chars", 1))
        return len(self.prompt_text(problem)) > self.spec.max_prompt_tokens * per

    def sync(self, model: Any) -> None:
        """Give the sampler the policy's current weights."""
        self.sampler.sync(model)

    def render(self, problems: list[Problem]) -> tuple[list[str], int]:
        """Chat prompts of ``problems`` and the width to pad them to."""
        prompts = [self.prompt_text(p) for p in problems]
        lengths = self.prompt_lengths(problems)
        longest = max(lengths)
        limit = self.spec.max_prompt_tokens
        if longest > limit:
            where = problems[lengths.index(longest)].where
            raise ConfigError(
                f"a prompt{f' ({where})' if where else ''} has {longest:,} tokens, more "
                f"than rollout.max_prompt_tokens={limit}",
                hint=too_long_hint(longest),
            )
        return prompts, prompt_width(self.probe_len, longest)

    def sample(self, prompts: list[str], width: int, seed: int, greedy: bool = False) -> Samples:
        """Completions of each prompt: ``rollout.num_generations`` sampled ones (the
        GRPO group, decoded from the prompt's one prefill), or one greedy."""
        from rlctl.core.trainer.rollout.sampler import left_pad

        r = self.spec
        group = 1 if greedy else r.num_generations
        prompt_ids = left_pad(
            [self.tokenizer.encode(p) for p in prompts], width, self.tokenizer.pad_id()
        )
        drawn = self.sampler(
            prompt_ids,
            group=group,
            seed=seed,
            temperature=0.0 if greedy else r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
        )
        tokens = [row[:n] for row, n in zip(drawn.tokens, drawn.lengths, strict=True)]
        return Samples(
            text=[self.tokenizer.decode(t.tolist()) for t in tokens],
            tokens=tokens,
            prompt_ids=prompt_ids,
            completion_ids=drawn.tokens,
            lengths=drawn.lengths,
            logps=drawn.logps,
        )

    def batch(self, out: Samples, scores: Scores) -> Batch:
        """The sampler's output for whole groups, with each completion's advantage
        within its group, as a ``Batch`` (no log-probs yet)."""
        advantages = group_advantages(scores.reward, self.spec.num_generations)
        return Batch(
            prompt_ids=out.prompt_ids,
            completion_ids=out.completion_ids,
            mask=out.mask(),
            advantages=advantages,
        )
