"""What the trainer asks of a rollout engine, whichever samples: ``RolloutEngine``.

Tunix's ``tunix.rl.rollout.base_rollout.BaseRollout`` is the anchor (its vLLM, SGLang
and native rollouts share it): ``update_params`` is ``sync``, ``generate`` is
``__call__`` over token ids (rlctl's tokenizer renders and decodes the text, so every
engine samples from the same ids and the update trains on exactly those), ``pad_id``
and ``eos_id`` are attributes. rlctl's engines (sampler.py's ``Sampler``,
vllm_engine.py's ``VllmSampler``) implement it; ``engines.start`` builds the one a run
picked from an ``EngineSetup``, and ``loop.py`` holds nothing but the protocol.

Nothing here imports JAX or an engine: the protocol sits below them all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

    from rlctl.core.config.models import RunSpec


@dataclass(frozen=True)
class Drawn:
    """What one call decoded, as host arrays; rows are grouped by prompt."""

    tokens: np.ndarray  # [P*G, N] int32: the stop token included, pad after it
    logps: np.ndarray  # [P*G, N] float32 log-prob of each token (0 after the stop)
    lengths: np.ndarray  # [P*G] tokens before the stop token (N when none was emitted)
    steps: int  # iterations of the decode loop (< N - 1 when every row stopped early)


class RolloutEngine(Protocol):
    """What the trainer asks of the engine that samples, whichever it is.

    Tunix's ``BaseRollout`` is the anchor: ``update_params`` -> ``sync`` (the policy's
    current weights, before each rollout and eval), ``generate`` -> ``__call__``
    (token ids in, ``Drawn`` out: rlctl's tokenizer renders and decodes the text, so
    every engine samples from the same ids), ``pad_id``/``eos_id`` -> the attributes
    below. ``checks`` is rlctl's own: what the engine adds to a step's metrics (vLLM:
    its agreement with the trainer's log-probs, which stops a run on stale weights).
    """

    pad_id: int
    eos_ids: tuple[int, ...]

    def sync(self, model: Any) -> None: ...

    def __call__(
        self,
        prompt_ids: np.ndarray,
        *,
        group: int,
        seed: int,
        temperature: float,
        top_p: float = 1.0,
        top_k: int | None = None,
    ) -> Drawn: ...

    def checks(
        self,
        model: Any,
        prompt_ids: np.ndarray,
        completion_ids: np.ndarray,
        logps: np.ndarray,
        mask: np.ndarray,
        step: int,
    ) -> dict[str, float]:
        """The step's figures of this engine, given what it sampled at ``step``
        (1-based) and the policy it sampled for; may stop the run."""
        ...

    def precompile(self, prompts: int, width: int, group: int) -> Any:
        """Its program for ``prompts`` prompts of ``width`` tokens, ``group`` completions
        each, compiled now and run by the calls of those shapes (its device memory known
        before the first step), or None where the engine compiles its own (vLLM)."""
        ...

    @property
    def sampling_dtype(self) -> str | None:
        """What its matmuls read, for status.json (None: the engine's own affair)."""
        ...


@dataclass(frozen=True)
class EngineSetup:
    """What any engine may need to start for a run: the run's spec, the policy and
    where it came from, how the trainer reads it, and where to say what it did."""

    spec: RunSpec
    model: Any  # the policy (an nnx.Module)
    folder: Path  # the model's folder (safetensors and config.json)
    tokenizer: Any  # a ChatTokenizer
    info: Any  # tunix_adapter.ModelInfo
    replicate_over: Any = None  # a mesh to hold whole weights on (rollout.sampler_mesh)
    sampling_dtype: str | None = None  # precision.choose's sampling dtype
    numerics: Any = None  # the backend's row of numerics.TABLE
    say: Callable[[str], None] = lambda line: None
    emit: Callable[[dict[str, Any]], None] = lambda event: None
