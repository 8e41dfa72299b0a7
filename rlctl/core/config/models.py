"""Pydantic specs: what a user asks for. ``extra="forbid"`` so typos surface.

A ``RunSpec`` is written once to the run store as ``spec.yaml`` and read back by
the trainer, locally or in a pod; the same object crosses every boundary.
"""

from __future__ import annotations

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


class DataSpec(Spec):
    name: Annotated[
        Literal["arithmetic", "gsm8k", "jsonl"],
        Field(
            description="'arithmetic' (embedded generator), 'gsm8k' (openai/gsm8k or a local "
            "file with question/answer columns), 'jsonl' (question + number answer per line)"
        ),
    ] = "arithmetic"
    path: Annotated[
        str | None,
        Field(description="local .jsonl/.parquet file for gsm8k/jsonl (train split)"),
    ] = None
    eval_path: Annotated[
        str | None, Field(description="held-out file; default: the test split or a disjoint slice")
    ] = None
    question_field: str = "question"
    answer_field: str = "answer"
    max_operand: Annotated[
        int, Field(ge=2, le=10_000, description="arithmetic generator: largest operand")
    ] = 20
    seed: Annotated[int, Field(ge=0, description="dataset shuffling/generation seed")] = 0


class RolloutSpec(Spec):
    engine: Annotated[
        Literal["auto", "vanilla", "vllm"],
        Field(description="generation engine; auto = vanilla on CPU/GPU, vllm on TPU"),
    ] = "auto"
    sampler_weights: Annotated[
        Literal["auto", "sharded", "whole"],
        Field(description="weights the sampler decodes on when there are several devices: "
              "sharded like the model, or one whole copy per device; auto = whole across "
              "hosts when a copy takes at most a quarter of a device's memory"),
    ] = "auto"
    num_generations: Annotated[
        int, Field(ge=2, le=256, description="completions sampled per prompt (the GRPO group)")
    ] = 8
    max_new_tokens: Annotated[int, Field(ge=1, le=32_768)] = 48
    max_prompt_tokens: Annotated[int, Field(ge=8, le=32_768)] = 160
    temperature: Annotated[float, Field(gt=0.0, le=10.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int | None, Field(ge=1)] = None


# LoRA: the projections that can carry adapters (Hugging Face names, as PEFT's
# target_modules), and the learning rate measured on the default task with rank-16
# adapters (README "LoRA"): 5x full fine-tuning's, as adapters starting at zero
# move only a low-rank part of each weight
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LoraTarget = Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                     "down_proj"]
LORA_LEARNING_RATE = 5e-5


class TrainingSpec(Spec):
    steps: Annotated[int, Field(ge=1, le=10_000_000, description="optimizer steps to run")] = 20
    prompts_per_step: Annotated[int, Field(ge=1, le=4096)] = 2
    # 1e-5: over 20 steps x 2 prompts, 5e-6 gained +0.13..+0.30 held-out accuracy across
    # seeds, 1e-5 gained +0.23..+0.36 (SmolLM2-135M, arithmetic; see the README).
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
        Field(ge=1, le=1024,
              description="LoRA rank: train low-rank adapters (qwix) on the frozen base "
              f"instead of every parameter; None = full fine-tuning. With LoRA use "
              f"learning_rate={LORA_LEARNING_RATE:g} (tested on the default task)"),
    ] = None
    lora_alpha: Annotated[
        float | None,
        Field(gt=0.0, le=65536.0,
              description="LoRA scale numerator (adapter output x alpha/rank); default "
              "2 x lora_rank, so the scale stays 2 when the rank changes"),
    ] = None
    lora_target_modules: Annotated[
        list[LoraTarget] | None,
        Field(min_length=1, description="projections that get adapters (Hugging Face names); "
              "default all: " + ",".join(LORA_TARGETS)),
    ] = None
    micro_batch_size: Annotated[
        int | None,
        Field(ge=1, le=1_048_576,
              description="sequences per forward/backward, gradients accumulated (same "
              "result as the whole batch); a multiple or a divisor of rollout.num_generations; "
              "default: the largest that fits the device's free memory"),
    ] = None
    remat: Annotated[
        bool | None,
        Field(description="gradient checkpointing: each layer keeps only its inputs for the "
              "backward pass and recomputes the rest (Llama-family models); default: on for "
              "the CPU, where it costs no time, off on accelerators"),
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
        str, Field(min_length=1,
                   description="run store root: a local path or gs://bucket/prefix")
    ] = RUNS_ROOT
    tensorboard: bool = True


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
    rewards: Annotated[
        list[str],
        Field(
            min_length=1,
            description="reward functions summed per completion: registry names "
            "('correct', 'format') or dotted paths module.function(completion, gold)",
        ),
    ] = Field(default_factory=lambda: ["correct", "format"])

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
        mbs, P, G = (self.training.micro_batch_size, self.training.prompts_per_step,
                     self.rollout.num_generations)
        if mbs is not None and mbs < P * G and mbs not in micro_batch_sizes(P, G):
            some = ", ".join(map(str, micro_batch_sizes(P, G)[:5]))
            raise ValueError(
                f"training.micro_batch_size={mbs} must divide rollout.num_generations={G} or "
                f"be a multiple of it that divides the step's {P * G} sequences ({some}, ...)")
        t = self.training
        if t.lora_rank is None and (t.lora_alpha is not None or t.lora_target_modules):
            which = "lora_alpha" if t.lora_alpha is not None else "lora_target_modules"
            raise ValueError(f"training.{which} needs training.lora_rank (LoRA is off)")
        if t.lora_rank is not None and (t.lora_alpha is None or not t.lora_target_modules):
            object.__setattr__(self, "training", t.model_copy(update={
                "lora_alpha": t.lora_alpha or 2.0 * t.lora_rank,
                "lora_target_modules": list(dict.fromkeys(
                    t.lora_target_modules or LORA_TARGETS))}))
        if self.data.name in ("jsonl",) and not self.data.path:
            raise ValueError("data.path is required when data.name is 'jsonl'")
        return self
