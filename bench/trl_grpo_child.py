"""One TRL ``GRPOTrainer`` run of rlctl's default task, timed: the child of bench_vs_trl.py.

Runs in TRL's own virtual environment (bench/requirements-trl.txt), never in rlctl's:
it imports nothing of rlctl but its reward checks, ``rlctl/core/trainer/rewards/
verifier.py``, loaded by file path (that module needs only the standard library and
math-verify), so TRL's rewards are rlctl's ``correct`` (weight 1) and ``format``
(weight 0.1) to the line.

The prompts come from the parent, one JSON object a line: ``prompt`` (the text as
rlctl's chat template rendered it, passed to TRL as a plain string, which TRL
tokenizes as it is without applying a template), ``answer`` (the gold answer) and
``prompt_ids`` (rlctl's tokens of the prompt; checked against TRL's tokenizer, so
both sides prompt the model with the same tokens). Row 2k and 2k+1 are step k+1's
prompts: the dataset is not shuffled.

Timing: a step is ``on_step_begin`` to ``on_step_end`` of a callback; the rollout is
the time inside ``GRPOTrainer._generate`` (tokenizing, ``model.generate``, decoding),
as rlctl's ``rollout_seconds`` is its sampling alone: the rewards and the update fall
in the rest of the step on both sides. Completion tokens are the lengths ``_generate``
returns (cut after the first EOS, the EOS counted, as rlctl's mask counts it). The
result JSON is rewritten after every step, so a run cut short keeps its steps.

    .venvs/trl/bin/python bench/trl_grpo_child.py --model DIR --prompts P.jsonl \\
        --setting fp32 --steps 20 --out result.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
VERIFIER = REPO / "rlctl" / "core" / "trainer" / "rewards" / "verifier.py"

# The GRPOConfig fields each setting sets on top of the common ones (``config``).
# TRL's own defaults are gradient checkpointing on and bf16 on; "fp32" keeps the
# first (rlctl also recomputes activations on the CPU) and turns bf16 off.
SETTINGS: dict[str, dict[str, Any]] = {
    "fp32": {"bf16": False},
    "bf16": {"bf16": True},
    "fp32-nockpt": {"bf16": False, "gradient_checkpointing": False},
    "bf16-nockpt": {"bf16": True, "gradient_checkpointing": False},
    "fp32-compile": {"bf16": False, "gradient_checkpointing": False, "torch_compile": True},
}


def load_verifier() -> Any:
    spec = importlib.util.spec_from_file_location("rlctl_verifier", VERIFIER)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reward_functions() -> list[Any]:
    """rlctl's ``correct`` and ``format`` in TRL's batched signature."""
    v = load_verifier()

    def correct(
        prompts: list[str], completions: list[str], answer: list[str], **_: Any
    ) -> list[float]:
        return [v.correct_reward(c, g) for c, g in zip(completions, answer, strict=True)]

    def format_(
        prompts: list[str], completions: list[str], answer: list[str], **_: Any
    ) -> list[float]:
        return [v.format_reward(c, g) for c, g in zip(completions, answer, strict=True)]

    format_.__name__ = "format"
    return [correct, format_]


def config(
    setting: str,
    steps: int,
    output_dir: str,
    prompts_per_step: int,
    group: int,
    max_new_tokens: int,
) -> dict[str, Any]:
    """GRPOConfig keyword arguments: rlctl's default run, one optimizer step per
    generation of ``prompts_per_step`` x ``group`` completions."""
    return {
        "output_dir": output_dir,
        "per_device_train_batch_size": prompts_per_step * group,
        "num_generations": group,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": 1,
        "num_iterations": 1,
        "max_completion_length": max_new_tokens,
        "max_steps": steps,
        "learning_rate": 1e-5,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "optim": "adamw_torch",
        "adam_beta1": 0.9,
        "adam_beta2": 0.99,
        "adam_epsilon": 1e-8,
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
        "beta": 0.0,
        "epsilon": 0.2,
        "loss_type": "grpo",  # rlctl's sequence-mean-token-mean
        "scale_rewards": "group",
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "reward_weights": [1.0, 0.1],
        "shuffle_dataset": False,
        "use_vllm": False,
        "seed": 0,
        "model_init_kwargs": {"dtype": "float32"},
        "use_cpu": True,
        "save_strategy": "no",
        "eval_strategy": "no",
        "logging_steps": 1,
        "report_to": "none",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        **SETTINGS[setting],
    }


def read_prompts(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_tokens(tokenizer: Any, rows: list[dict[str, Any]]) -> None:
    """TRL tokenizes a string prompt with ``processing_class(text=...)``: it must give
    rlctl's tokens, or the two sides would not prompt alike."""
    got = tokenizer(text=[r["prompt"] for r in rows])["input_ids"]
    for i, (ids, r) in enumerate(zip(got, rows, strict=True)):
        if list(ids) != r["prompt_ids"]:
            raise SystemExit(
                f"prompt {i}: TRL's tokenizer gives {len(ids)} tokens, rlctl "
                f"{len(r['prompt_ids'])}; the two sides would differ"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="the Hugging Face model folder")
    p.add_argument("--prompts", type=Path, required=True, help="the parent's JSONL")
    p.add_argument("--setting", choices=sorted(SETTINGS), default="fp32")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--prompts-per-step", type=int, default=2)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--out", type=Path, required=True, help="result JSON to write")
    a = p.parse_args()

    t_start = time.perf_counter()
    import datasets
    import torch
    import transformers
    import trl
    from transformers import AutoTokenizer, TrainerCallback

    rows = read_prompts(a.prompts)
    need = a.steps * a.prompts_per_step
    if len(rows) < need:
        raise SystemExit(f"{a.prompts} has {len(rows)} prompts; {a.steps} steps need {need}")
    rows = rows[:need]
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    check_tokens(tokenizer, rows)
    dataset = datasets.Dataset.from_list(
        [{"prompt": r["prompt"], "answer": r["answer"]} for r in rows]
    )

    steps: list[dict[str, Any]] = []

    class Timed(trl.GRPOTrainer):
        """GRPOTrainer with its generation timed and its completion tokens counted."""

        def _generate(self, prompts: list) -> Any:
            t0 = time.perf_counter()
            out = super()._generate(prompts)
            if steps:
                steps[-1]["rollout_seconds"] += time.perf_counter() - t0
                steps[-1]["completion_tokens"] += sum(len(ids) for ids in out[1])
            return out

    class Clock(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            steps.append(
                {
                    "step": state.global_step + 1,
                    "rollout_seconds": 0.0,
                    "completion_tokens": 0,
                    "_t0": time.perf_counter(),
                }
            )

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            row = steps[-1]
            row["step_seconds"] = round(time.perf_counter() - row.pop("_t0"), 3)
            row["rollout_seconds"] = round(row["rollout_seconds"], 3)

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **_: Any) -> None:
            if logs and steps and "reward" in logs:
                steps[-1]["reward_mean"] = logs["reward"]
                steps[-1]["accuracy"] = logs.get("rewards/correct/mean")
                write(partial=True)  # the steps so far survive a run cut short

    def write(partial: bool = False, train_s: float | None = None) -> None:
        done = [r for r in steps if "step_seconds" in r]
        result = {
            "setting": a.setting,
            "config": SETTINGS[a.setting],
            "versions": {
                "torch": torch.__version__,
                "trl": trl.__version__,
                "transformers": transformers.__version__,
            },
            "torch_threads": torch.get_num_threads(),
            "steps": done,
            "partial": partial,
            "setup_seconds": None if t_train is None else round(t_train - t_start, 2),
            "train_seconds": None if train_s is None else round(train_s, 2),
            "median_step": (
                statistics.median(r["step_seconds"] for r in done[1:]) if len(done) > 1 else None
            ),
            "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }
        a.out.write_text(json.dumps(result, indent=1))

    t_train: float | None = None
    with tempfile.TemporaryDirectory(prefix="trl-grpo-") as out_dir:
        args = trl.GRPOConfig(
            **config(a.setting, a.steps, out_dir, a.prompts_per_step, a.group, a.max_new_tokens)
        )
        trainer = Timed(
            model=a.model,
            reward_funcs=reward_functions(),
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[Clock()],
        )
        t_train = time.perf_counter()
        trainer.train()
        write(train_s=time.perf_counter() - t_train)
    print(f"TRL {a.setting}: {len(steps)} steps written to {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
