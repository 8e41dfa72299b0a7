"""Rewards: the built-in math rewards, custom ones from the run config, and scoring.

``verifier``: the ``<answer>`` block checked with math-verify (``correct``,
``format``) and the gold answer of a data row; ``loading``: names, dotted paths and
files resolved to functions of either signature (per sample or TRL's batched);
``scoring``: a batch scored by all of them, weighted, with each one's values kept.
"""

from __future__ import annotations

from rlctl.core.trainer.rewards.loading import REGISTRY, Reward, RewardFn, resolve
from rlctl.core.trainer.rewards.scoring import Sample, Scored, score, total_reward
from rlctl.core.trainer.rewards.verifier import (
    answers_match,
    correct_reward,
    extract_answer,
    format_reward,
    gold_answer,
    gsm8k_gold,
    normalize_number,
)

__all__ = [
    "REGISTRY",
    "Reward",
    "RewardFn",
    "Sample",
    "Scored",
    "answers_match",
    "correct_reward",
    "extract_answer",
    "format_reward",
    "gold_answer",
    "gsm8k_gold",
    "normalize_number",
    "resolve",
    "score",
    "total_reward",
]
