"""Pydantic specs: what a user asks for. ``extra="forbid"`` so typos surface.

A ``RunSpec`` is written once to the run store as ``spec.yaml`` and read back by
the trainer, locally or in a pod; the same object crosses every boundary.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rlctl.core.names import validate_name
from rlctl.core.paths import RUNS_ROOT

DEFAULT_MODEL = "smollm2-135m-instruct"


class Spec(BaseModel):
    """Base for user-written specs: unknown keys are errors, assignments are validated."""

    # allow_inf_nan=False: ``--lr nan`` is "not a finite number", not "should be <= 1"
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class ModelSpec(Spec):
    source: Annotated[
        str,
        Field(
            description="'smollm2-135m-instruct' (embedded, offline), a local Hugging Face "
            "safetensors folder, or a hub id (needs network)"
        ),
    ] = DEFAULT_MODEL
    dtype: Annotated[
        Literal["float32", "bfloat16"],
        Field(description="parameter dtype; float32 is faster than bfloat16 on most CPUs"),
    ] = "float32"
    compute_dtype: Annotated[
        Literal["auto", "float32", "bfloat16"],
        Field(
            description="dtype the matmuls read, summed in float32 (weights and optimizer "
            "stay model.dtype); auto: bfloat16 on a GPU or TPU, float32 on a CPU (bfloat16 "
            "is faster on one with AVX512-BF16 or AMX, but learned less there)"
        ),
    ] = "auto"


# ``--dataset`` names that are not hub ids: the generator, and a hub dataset's alias
# (its repo, config and eval split). 'jsonl' is the old name of "the --data-path file".
GENERATED = "arithmetic"
HUB_ALIASES = {"gsm8k": ("openai/gsm8k", "main", "test")}
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
# the keys of DataSpec before #26, read as their new names (old spec.yaml files, old flags)
_RENAMED = {"name": "dataset", "question_field": "prompt_column", "answer_field": "answer_column"}


class DataSpec(Spec):
    dataset: Annotated[
        str | None,
        Field(
            description="'arithmetic' (embedded generator; the default without "
            "data.path), 'gsm8k' (openai/gsm8k: config main, eval split test) or a "
            "Hugging Face hub dataset id 'owner/name' (the datasets library; with "
            "data.path, that file is a local copy of it); unset with data.path: the file"
        ),
    ] = None
    path: Annotated[
        str | None,
        Field(
            description="local data file to train on: JSONL, JSON, Parquet or CSV (by "
            "its extension, else its content); its columns are found as for "
            "data.prompt_column / data.answer_column"
        ),
    ] = None
    config: Annotated[str | None, Field(description="hub dataset config (subset), e.g. 'main'")] = (
        None
    )
    split: Annotated[str, Field(min_length=1, description="hub dataset split to train on")] = (
        "train"
    )
    eval_split: Annotated[
        str | None,
        Field(
            description="hub dataset split to evaluate on (e.g. 'test'); default: a "
            "held-out slice of the training data"
        ),
    ] = None
    eval_path: Annotated[
        str | None,
        Field(
            description="local file to evaluate on (same formats as data.path); default: "
            "a held-out slice of the training data"
        ),
    ] = None
    prompt_column: Annotated[
        str | None,
        Field(
            description="column holding the prompt: text, or a chat list of "
            "{role, content}; default: the first of prompt, question, problem, query, "
            "messages"
        ),
    ] = None
    answer_column: Annotated[
        str | None,
        Field(
            description="column holding the gold answer ('... #### N' or a number); "
            "default: the first of answer, solution, ground_truth, final_answer, target, "
            "label, else a chat prompt's last turn when it is the assistant's"
        ),
    ] = None
    max_operand: Annotated[
        int, Field(ge=2, le=10_000, description="arithmetic generator: largest operand")
    ] = 20
    seed: Annotated[int, Field(ge=0, description="dataset shuffling/generation seed")] = 0

    @model_validator(mode="before")
    @classmethod
    def _renamed_and_defaults(cls, data: object) -> object:
        """Old keys as their new names; the dataset and a hub alias's config and eval
        split filled in, so the stored spec says what was trained on."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for old, new in _RENAMED.items():
            if old in data:
                value = data.pop(old)
                if new in data and data[new] != value:
                    raise ValueError(
                        f"data.{old} is the old name of data.{new}; set only data.{new}"
                    )
                data[new] = value
        if data.get("dataset") == "jsonl":  # the old "a --data-path file"
            if not data.get("path"):
                raise ValueError("data.dataset 'jsonl' reads data.path: pass --data-path FILE")
            data["dataset"] = None
        if data.get("dataset") is None and not data.get("path"):
            data["dataset"] = GENERATED
        alias = HUB_ALIASES.get(data.get("dataset"))  # type: ignore[arg-type]  # raw input: any value
        if alias and not data.get("path"):
            data.setdefault("config", alias[1])
            if not data.get("eval_path"):
                data.setdefault("eval_split", alias[2])
        return data

    @field_validator("dataset")
    @classmethod
    def _known_or_hub_id(cls, v: str | None) -> str | None:
        if v is None or v == GENERATED or v in HUB_ALIASES or _HUB_ID.fullmatch(v):
            return v
        local = Path(v).expanduser().exists() or v.startswith((".", "/", "~"))
        if local:
            raise ValueError(f"{v!r} is a path: a file on this machine is --data-path FILE")
        raise ValueError(f"{v!r} is not 'arithmetic', 'gsm8k' or a hub dataset id 'owner/name'")

    @model_validator(mode="after")
    def _one_source(self) -> DataSpec:
        if self.dataset == GENERATED:
            given = [k for k in ("path", "eval_path", "config", "eval_split") if getattr(self, k)]
            if given:
                raise ValueError(
                    f"dataset 'arithmetic' is generated and takes no {given[0]}; to train "
                    "on a file pass --data-path without --dataset"
                )
        if self.path and self.eval_split:
            raise ValueError(
                "eval_split names a split of a hub dataset; with a data.path "
                "give the eval file as data.eval_path"
            )
        if self.path and self.split != "train":
            raise ValueError(
                "split names a split of a hub dataset; with a data.path the "
                "whole file is the training data"
            )
        return self

    @property
    def hub_id(self) -> str | None:
        """The hub repository to load, when the data comes from the hub."""
        if self.path or self.dataset in (None, GENERATED):
            return None
        return HUB_ALIASES[self.dataset][0] if self.dataset in HUB_ALIASES else self.dataset


MAX_STEPS = 10_000_000  # train --steps and resume --steps alike
MAX_PROMPT_TOKENS = 32_768  # rollout.max_prompt_tokens


class RolloutSpec(Spec):
    engine: Annotated[
        Literal["auto", "vanilla", "vllm"],
        Field(
            description="what samples the completions: vanilla (rlctl's JAX sampler) or "
            "vllm (vLLM, the trainer's weights pushed into it after each update); "
            "auto = vllm on TPU when vLLM is installed, else vanilla (CPU and GPU "
            "always vanilla)"
        ),
    ] = "auto"
    sampler_weights: Annotated[
        Literal["auto", "sharded", "whole"],
        Field(
            description="weights the sampler decodes on when there are several devices: "
            "sharded like the model, or one whole copy per device; auto = whole across "
            "hosts when a copy takes at most a quarter of a device's memory"
        ),
    ] = "auto"
    num_generations: Annotated[
        int, Field(ge=2, le=256, description="completions sampled per prompt (the GRPO group)")
    ] = 8
    max_new_tokens: Annotated[int, Field(ge=1, le=32_768)] = 48
    max_prompt_tokens: Annotated[int, Field(ge=8, le=MAX_PROMPT_TOKENS)] = 160
    temperature: Annotated[float, Field(gt=0.0, le=10.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int | None, Field(ge=1)] = None
    compute_dtype: Annotated[
        Literal["auto", "float32", "bfloat16"],
        Field(
            description="dtype the sampler's matmuls and decode weights read, summed in "
            "float32; auto: bfloat16 where it is native (a GPU, a TPU, a CPU with "
            "AVX512-BF16 or AMX) unless model.compute_dtype=float32 is set, else "
            "model.compute_dtype's"
        ),
    ] = "auto"
    # Generation and learning at once (issue 54; docs/async.md): Tunix's RLCluster
    # role-to-mesh and MaxText RL's trainer/sampler device split are the anchors.
    placement: Annotated[
        Literal["colocated", "split", "process"],
        Field(
            description="where the rollout samples: colocated (on the learner's devices, "
            "one after the other), split (on its own devices, rollout.devices of them, "
            "the learner on the rest) or process (a generator process of its own, "
            "weights and trajectories through the run store)"
        ),
    ] = "colocated"
    devices: Annotated[
        float,
        Field(
            gt=0,
            description="with placement=split, the generator's devices: a count (1, 2, ...) "
            "or a fraction of the run's devices (0.5); the learner takes the rest",
        ),
    ] = 0.5
    max_staleness: Annotated[
        int,
        Field(
            ge=0,
            le=8,
            description="how many policy versions a rollout may lag the learner: 0 is "
            "synchronous; k >= 1 samples the next batches while the learner updates "
            "(each batch from the policy of k steps before)",
        ),
    ] = 0
    correction: Annotated[
        Literal["decoupled", "behaviour"],
        Field(
            description="with max_staleness >= 1, how the loss corrects for the older "
            "policy that sampled a batch: decoupled (AReaL's: the ratio and its clipping "
            "against the learner's policy of now, times the truncated importance weight "
            "of now over the sampler's) or behaviour (the sampler's log-probs as the "
            "ratio's denominator, clipped)",
        ),
    ] = "decoupled"

    @field_validator("devices")
    @classmethod
    def _count_or_fraction(cls, v: float) -> float:
        if v >= 1 and v != int(v):
            raise ValueError(
                "a count of devices (1, 2, ...) or a fraction of the run's below 1 (0.5)"
            )
        return v

    @property
    def pipelined(self) -> bool:
        """Whether a generator of its own samples (split, a process, or rollouts
        running ahead)."""
        return self.placement != "colocated" or self.max_staleness > 0


# LoRA: the projections that can carry adapters (Hugging Face names, as PEFT's
# target_modules), and the learning rate measured on the default task with rank-16
# adapters (docs/lora.md): 5x full fine-tuning's, as adapters starting at zero
# move only a low-rank part of each weight
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# the default targets, and Qwen3.5's linear-attention projections (its families record
# says which a model has: ``Family.lora_paths``)
LoraTarget = Literal[
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "in_proj_qkv",
    "in_proj_z",
    "out_proj",
]
LORA_LEARNING_RATE = 5e-5


class TrainingSpec(Spec):
    steps: Annotated[int, Field(ge=1, le=MAX_STEPS, description="optimizer steps to run")] = 20
    prompts_per_step: Annotated[int, Field(ge=1, le=4096)] = 2
    # 1e-5: over 20 steps x 2 prompts, 5e-6 gained +0.13..+0.30 held-out accuracy across
    # seeds, 1e-5 gained +0.23..+0.36 (SmolLM2-135M, arithmetic; docs/local-runs.md).
    learning_rate: Annotated[float, Field(gt=0.0, le=1.0)] = 1e-5
    warmup_steps: Annotated[int, Field(ge=0)] = 0
    weight_decay: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    max_grad_norm: Annotated[float, Field(gt=0.0)] = 1.0
    beta: Annotated[
        float, Field(ge=0.0, le=10.0, description="KL penalty weight; 0 = no reference model")
    ] = 0.0
    kl_estimator: Annotated[
        Literal["k1", "k3"], Field(description="k3 is the GRPO paper's low-variance estimator")
    ] = "k3"
    epsilon: Annotated[
        float | None,
        Field(gt=0.0, le=1.0, description="clip range; default 0.2 (grpo) or 3e-4 (gspo)"),
    ] = None
    epsilon_high: Annotated[
        float | None,
        Field(gt=0.0, le=1.0, description="upper clip; default = epsilon (grpo), 4e-4 (gspo)"),
    ] = None
    num_iterations: Annotated[
        int | None,
        Field(ge=1, le=64, description="updates per rollout batch; default 1 (grpo), 2 (gspo)"),
    ] = None
    loss_aggregation: Annotated[
        Literal["sequence-mean-token-mean", "token-mean", "sequence-mean-token-sum"],
        Field(description="how token losses are averaged"),
    ] = "sequence-mean-token-mean"
    lora_rank: Annotated[
        int | None,
        Field(
            ge=1,
            le=1024,
            description="LoRA rank: train low-rank adapters (qwix) on the frozen base "
            f"instead of every parameter; None = full fine-tuning. With LoRA use "
            f"learning_rate={LORA_LEARNING_RATE:g} (tested on the default task)",
        ),
    ] = None
    lora_alpha: Annotated[
        float | None,
        Field(
            gt=0.0,
            le=65536.0,
            description="LoRA scale numerator (adapter output x alpha/rank); default "
            "2 x lora_rank, so the scale stays 2 when the rank changes",
        ),
    ] = None
    lora_target_modules: Annotated[
        list[LoraTarget] | None,
        Field(
            min_length=1,
            description="projections that get adapters (Hugging Face names); "
            "default all: " + ",".join(LORA_TARGETS),
        ),
    ] = None
    micro_batch_size: Annotated[
        int | None,
        Field(
            ge=1,
            le=1_048_576,
            description="sequences per forward/backward, gradients accumulated (same "
            "result as the whole batch); a multiple or a divisor of rollout.num_generations; "
            "default: the largest that fits the device's free memory",
        ),
    ] = None
    remat: Annotated[
        bool | None,
        Field(
            description="gradient checkpointing: each layer keeps only its inputs for the "
            "backward pass and recomputes the rest (Llama-family models); default on the "
            "CPU: three quarters of the layers, or all where that does not fit the update's "
            "memory; every layer on accelerators"
        ),
    ] = None
    seed: Annotated[int, Field(ge=0)] = 0


class CheckpointSpec(Spec):
    interval: Annotated[int, Field(ge=1, description="save every N steps (and at the end)")] = 5
    keep: Annotated[int, Field(ge=1, le=1000, description="checkpoints kept")] = 2


class EvalSpec(Spec):
    size: Annotated[int, Field(ge=0, le=100_000, description="held-out prompts; 0 = no eval")] = 64
    interval: Annotated[int, Field(ge=0, description="also evaluate every N steps; 0 = off")] = 0
    batch_size: Annotated[int, Field(ge=1, le=4096)] = 16
    samples: Annotated[int, Field(ge=0, le=100, description="completions kept in eval files")] = 4


class OutputSpec(Spec):
    root: Annotated[
        str, Field(min_length=1, description="run store root: a local path or gs://bucket/prefix")
    ] = RUNS_ROOT
    tensorboard: bool = True


# The default prompt: measured on SmolLM2-135M-Instruct, with the instruction alone it
# never writes <answer> tags (0/64), every reward is 0 and GRPO has nothing to learn
# from; with one worked example it answers in tags most of the time.
DEFAULT_SYSTEM_PROMPT = (
    "You are a careful math assistant. Solve the problem, then give the final answer "
    "as a number inside <answer></answer> tags."
)
DEFAULT_EXAMPLE_USER = "What is 4 + 3?"
DEFAULT_EXAMPLE_ASSISTANT = "4 + 3 = 7. <answer>7</answer>"


class PromptExample(Spec):
    """One few-shot turn pair, shown before the question."""

    user: Annotated[str, Field(min_length=1, description="the example question")]
    assistant: Annotated[str, Field(min_length=1, description="its worked answer")]


class PromptSpec(Spec):
    system: Annotated[str, Field(description="the system message; '' = none")] = (
        DEFAULT_SYSTEM_PROMPT
    )
    examples: Annotated[
        list[PromptExample],
        Field(
            description="few-shot turns before the question: [{user, assistant}, ...]; "
            "[] = none (a data row with 'messages' uses those instead of all this)"
        ),
    ] = Field(
        default_factory=lambda: [
            PromptExample(user=DEFAULT_EXAMPLE_USER, assistant=DEFAULT_EXAMPLE_ASSISTANT)
        ]
    )


# a registry reward's weight when a config names it bare (``rewards: [correct, format]``):
# format is shaping, worth a tenth of a correct answer, as it was before weights existed
DEFAULT_REWARD_WEIGHTS = {"format": 0.1}
_REWARD_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def is_reward_file(ref: str) -> bool:
    """``path/to/file.py:function`` (a file), not ``package.module:function``."""
    path, sep, _ = ref.rpartition(":")
    return bool(sep) and path.endswith(".py")


class RewardEntry(Spec):
    """One reward of a run: which function, its weight in the total, its metrics name."""

    fn: Annotated[
        str,
        Field(
            min_length=1,
            description="'correct' or 'format' (built in), package.module:function, or "
            "path/to/file.py:function (relative to where 'rlctl train' runs; stored "
            "absolute)",
        ),
    ]
    weight: Annotated[
        float | None,
        Field(
            description="multiplies this reward in the per-completion total; default "
            "0.1 for 'format', else 1.0"
        ),
    ] = None
    name: Annotated[
        str | None,
        Field(description="its key in metrics (rewards/NAME/mean); default: the function's name"),
    ] = None

    @classmethod
    def of(cls, ref: str) -> RewardEntry:
        """A bare reference, with its default weight."""
        return cls(fn=ref)

    @field_validator("fn")
    @classmethod
    def _absolute_file(cls, v: str) -> str:
        """A reward file is found from where ``train`` runs, then stored absolute, so a
        resume from another folder finds the same file."""
        if not is_reward_file(v):
            return v
        path, _, attr = v.rpartition(":")
        if not attr.isidentifier():
            raise ValueError(f"reward {v!r}: {attr!r} after ':' is not a function name")
        return f"{os.path.abspath(os.path.expanduser(path))}:{attr}"

    @model_validator(mode="after")
    def _defaults(self) -> RewardEntry:
        """Fill the weight and the name, so the stored spec says both."""
        if self.weight is None:
            object.__setattr__(self, "weight", DEFAULT_REWARD_WEIGHTS.get(self.fn, 1.0))
        if self.name is None:
            tail = self.fn.rpartition(":")[2] if ":" in self.fn else self.fn
            object.__setattr__(self, "name", tail.rpartition(".")[2] or tail)
        if not _REWARD_NAME.match(self.name or ""):
            raise ValueError(
                f"reward name {self.name!r}: use letters, digits, '_', '.' "
                "or '-' (it is a metrics key)"
            )
        return self


def _reward_entries(v: object) -> object:
    """Bare strings (older spec.yaml files, ``--set rewards='["correct"]'``) become
    entries with their default weight, so the stored spec says every weight."""
    if isinstance(v, str):
        v = [v]
    if isinstance(v, list):
        return [RewardEntry.of(x) if isinstance(x, str) else x for x in v]
    return v


Algorithm = Literal["grpo", "gspo"]


def micro_batch_sizes(prompts: int, group: int) -> list[int]:
    """The micro-batch sizes a step of ``prompts`` x ``group`` sequences can be cut
    into, largest first: whole groups (k prompts, k dividing ``prompts``) or equal
    parts of one group, so each micro-batch still shares its prompts' prefix."""
    whole = [k * group for k in range(prompts, 0, -1) if prompts % k == 0]
    parts = [d for d in range(group - 1, 0, -1) if group % d == 0]
    return whole + parts


class RunSpec(Spec):
    name: Annotated[str | None, Field(description="run name (DNS-1035); default generated")] = None
    algorithm: Algorithm = "grpo"
    model: ModelSpec = Field(default_factory=ModelSpec)
    data: DataSpec = Field(default_factory=DataSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    eval: EvalSpec = Field(default_factory=EvalSpec)
    output: OutputSpec = Field(default_factory=OutputSpec)
    prompt: PromptSpec = Field(default_factory=PromptSpec)
    rewards: Annotated[
        list[RewardEntry],
        Field(
            min_length=1,
            description="reward functions, weighted and summed per completion: each a "
            "name ('correct', 'format'), package.module:function or file.py:function, or "
            "{fn, weight, name}; a function is fn(completion, gold) -> float or TRL's "
            "fn(prompts, completions, **columns) -> list[float | None]",
        ),
    ] = Field(default_factory=lambda: [RewardEntry.of("correct"), RewardEntry.of("format")])

    @field_validator("rewards", mode="before")
    @classmethod
    def _bare_rewards(cls, v: object) -> object:
        return _reward_entries(v)

    @field_validator("rewards")
    @classmethod
    def _distinct_names(cls, v: list[RewardEntry]) -> list[RewardEntry]:
        seen: set[str] = set()
        for e in v:
            if e.name in seen:
                raise ValueError(
                    f"two rewards are named {e.name!r} (their key in metrics): "
                    f"give one another name, e.g. {{fn: {e.fn}, name: "
                    f"{e.name}_2}}"
                )
            seen.add(e.name or "")
        return v

    @field_validator("name")
    @classmethod
    def _valid_name(cls, v: str | None) -> str | None:
        return None if v is None else validate_name(v, "run")

    @model_validator(mode="after")
    def _algorithm_defaults(self) -> RunSpec:
        """Fill what depends on the algorithm, so the stored spec is fully explicit.

        GSPO equals GRPO exactly when each rollout batch gets one update (the
        ratio is 1), so GSPO defaults to two; its ratio is a sequence-level
        geometric mean, which is why its clip range is ~1000x smaller.
        """
        t = self.training
        gspo = self.algorithm == "gspo"
        updates: dict[str, object] = {}
        if t.epsilon is None:
            updates["epsilon"] = 3e-4 if gspo else 0.2
        if t.epsilon_high is None:
            updates["epsilon_high"] = 4e-4 if gspo else updates.get("epsilon", t.epsilon)
        if t.num_iterations is None:
            updates["num_iterations"] = 2 if gspo else 1
        if updates:
            object.__setattr__(self, "training", t.model_copy(update=updates))
        eps_hi = self.training.epsilon_high
        if eps_hi is not None and eps_hi < (self.training.epsilon or 0):
            raise ValueError("training.epsilon_high must be >= training.epsilon")
        mbs, P, G = (
            self.training.micro_batch_size,
            self.training.prompts_per_step,
            self.rollout.num_generations,
        )
        if mbs is not None and mbs < P * G and mbs not in micro_batch_sizes(P, G):
            some = ", ".join(map(str, micro_batch_sizes(P, G)[:5]))
            raise ValueError(
                f"training.micro_batch_size={mbs} must divide rollout.num_generations={G} or "
                f"be a multiple of it that divides the step's {P * G} sequences ({some}, ...)"
            )
        t = self.training
        if t.lora_rank is None and (t.lora_alpha is not None or t.lora_target_modules):
            which = "lora_alpha" if t.lora_alpha is not None else "lora_target_modules"
            raise ValueError(f"training.{which} needs training.lora_rank (LoRA is off)")
        if t.lora_rank is not None and (t.lora_alpha is None or not t.lora_target_modules):
            object.__setattr__(
                self,
                "training",
                t.model_copy(
                    update={
                        "lora_alpha": t.lora_alpha or 2.0 * t.lora_rank,
                        "lora_target_modules": list(
                            dict.fromkeys(t.lora_target_modules or LORA_TARGETS)
                        ),
                    }
                ),
            )
        return self
