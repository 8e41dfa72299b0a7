"""Prompt construction: the run's system message and few-shot turns, then the question.

The one place a problem becomes chat messages: training rollouts, the prompt-width
probe and the evals all render through ``chat_messages``, and ``train
--print-prompt`` shows its output through the tokenizer's chat template. The
defaults (``PromptSpec``: an instruction plus one worked example) are what the
default run learns with; see ``config/models.py`` for why the example is there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlctl.core.config.models import (
    DEFAULT_EXAMPLE_ASSISTANT,
    DEFAULT_EXAMPLE_USER,
    DEFAULT_SYSTEM_PROMPT,
    PromptSpec,
    RunSpec,
)

if TYPE_CHECKING:
    from rlctl.core.trainer.data import Problem
    from rlctl.core.trainer.model.tokenizer import ChatTokenizer

SYSTEM = DEFAULT_SYSTEM_PROMPT
DEMO_QUESTION = DEFAULT_EXAMPLE_USER
DEMO_ANSWER = DEFAULT_EXAMPLE_ASSISTANT


def chat_messages(problem: Problem | str, prompt: PromptSpec | None = None) -> list[dict[str, str]]:
    """The chat turns of ``problem``: its own ``messages`` when the data gave them (as
    they are), else the system message, the examples and the question."""
    if not isinstance(problem, str) and problem.messages is not None:
        return [dict(m) for m in problem.messages]
    question = problem if isinstance(problem, str) else problem.question
    p = prompt or PromptSpec()
    turns = [{"role": "system", "content": p.system}] if p.system else []
    for ex in p.examples:
        turns += [
            {"role": "user", "content": ex.user},
            {"role": "assistant", "content": ex.assistant},
        ]
    return [*turns, {"role": "user", "content": question}]


def prompt_text(
    tokenizer: ChatTokenizer, problem: Problem, prompt: PromptSpec | None = None
) -> str:
    """The exact text the model is prompted with: the chat turns through the model's
    chat template (the generation prompt included)."""
    return tokenizer.apply_chat_template(chat_messages(problem, prompt))


def first_prompts(spec: RunSpec) -> dict[str, str | None]:
    """The rendered prompts of step 1's first problem and of the first held-out one
    (None without an eval set), as ``train --print-prompt`` shows them: the model's
    tokenizer and the data are read, nothing is trained or written."""
    from rlctl.core.trainer.data import load_source
    from rlctl.core.trainer.model.models import resolve_model_dir
    from rlctl.core.trainer.model.tokenizer import ChatTokenizer

    tokenizer = ChatTokenizer(resolve_model_dir(spec.model.source))
    source = load_source(spec.data, spec.eval.size)
    train = source.batch(0, spec.training.prompts_per_step)[0]
    held = source.eval_set[0] if source.eval_set else None
    return {
        "train": prompt_text(tokenizer, train, spec.prompt),
        "eval": None if held is None else prompt_text(tokenizer, held, spec.prompt),
    }
