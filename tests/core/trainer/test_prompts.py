"""The run config's prompt (system message, few-shot turns) and the data's own chat."""

from __future__ import annotations

import numpy as np
import pytest

from rlctl.core.config.models import PromptSpec, RunSpec
from rlctl.core.trainer.data import Problem
from rlctl.core.trainer.data.prompts import chat_messages
from rlctl.core.trainer.rollout.rollout import Scores
from rlctl.core.trainer.run.evaluation import scalars
from rlctl.core.trainer.update.step import StepMetrics

# builds a model, compiles or trains: out of the fast loop (tests/test_marks.py)
pytestmark = pytest.mark.slow

# what prompts.py built before the prompt was configurable: the default run learns with it
OLD_DEFAULT = [
    {
        "role": "system",
        "content": "You are a careful math assistant. Solve the problem, then "
        "give the final answer as a number inside <answer></answer> tags.",
    },
    {"role": "user", "content": "What is 4 + 3?"},
    {"role": "assistant", "content": "4 + 3 = 7. <answer>7</answer>"},
    {"role": "user", "content": "Q?"},
]


class TestChatMessages:
    def test_the_default_is_exactly_the_old_prompt(self):
        assert chat_messages(Problem("Q?", "1")) == OLD_DEFAULT
        assert chat_messages(Problem("Q?", "1"), RunSpec().prompt) == OLD_DEFAULT

    def test_system_and_examples_from_the_config(self):
        spec = RunSpec(
            prompt={
                "system": "Be brief.",
                "examples": [
                    {"user": "1+1?", "assistant": "<answer>2</answer>"},
                    {"user": "2+2?", "assistant": "<answer>4</answer>"},
                ],
            }
        )
        assert [m["content"] for m in chat_messages(Problem("Q?", "1"), spec.prompt)] == [
            "Be brief.",
            "1+1?",
            "<answer>2</answer>",
            "2+2?",
            "<answer>4</answer>",
            "Q?",
        ]

    def test_no_system_no_examples(self):
        p = PromptSpec(system="", examples=[])
        assert chat_messages(Problem("Q?", "1"), p) == [{"role": "user", "content": "Q?"}]

    def test_the_datas_messages_are_used_as_they_are(self):
        msgs = ({"role": "system", "content": "S"}, {"role": "user", "content": "U"})
        p = Problem("U", "1", messages=msgs)
        assert chat_messages(p, PromptSpec(system="ignored")) == [dict(m) for m in msgs]

    @pytest.mark.parametrize(
        "prompt", [{"examples": [{"user": "x"}]}, {"system": 3}, {"sytem": "typo"}]
    )
    def test_bad_prompt_config(self, prompt):
        with pytest.raises(ValueError):
            RunSpec(prompt=prompt)


def _scores(means):
    return Scores(
        np.array([1.0, 0.0], np.float32),
        np.array([1.0, 0.0], np.float32),
        np.array([1.0, 1.0], np.float32),
        means,
    )


class TestPerRewardMetrics:
    def test_a_step_row_has_each_rewards_mean(self):
        m = StepMetrics.measure(
            3,
            [0.1],
            [1.0],
            {"kl": 0.0, "entropy": 1.0, "clip_fraction": 0.0},
            _scores({"correct": 0.5, "brevity": None}),
            np.ones((2, 4)),
            elapsed=1.0,
            rollout_seconds=0.5,
        )
        row = m.row()
        assert row["rewards/correct/mean"] == 0.5 and row["rewards/brevity/mean"] is None
        assert "reward_means" not in row and row["reward_mean"] == 0.5

    def test_an_evals_tensorboard_scalars_include_each_reward(self):
        result = {
            "accuracy": 0.5,
            "format_rate": 1.0,
            "mean_reward": 0.6,
            "rewards": {"correct": 0.5, "never": None},
        }
        assert scalars(result) == {
            "accuracy": 0.5,
            "format_rate": 1.0,
            "mean_reward": 0.6,
            "rewards/correct/mean": 0.5,
        }
