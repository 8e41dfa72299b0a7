"""What a run's numbers lead with (``rlctl.core.runs.headline``): its own rewards."""

from __future__ import annotations

from rlctl.core.runs import headline as h
from rlctl.core.runs.log_lines import eval_line, step_line

DEFAULT = {
    "reward_mean": 0.35,
    "accuracy": 0.25,
    "format_rate": 1.0,
    "loss": 0.0,
    "rewards/correct/mean": 0.25,
    "rewards/format/mean": 1.0,
    "step_seconds": 2.0,
}
OWN = {
    "reward_mean": 0.7,
    "accuracy": 0.0,
    "format_rate": 0.0,
    "loss": 0.0,
    "rewards/brevity/mean": 0.4,
    "rewards/length/mean": 0.6,
    "step_seconds": 2.0,
}


def test_the_default_rewards_lead_with_accuracy_as_before():
    assert (
        step_line(3, 20, DEFAULT, None)
        == "step 3/20  reward 0.350  accuracy 0.250  loss +0.0000  2.0 s/step"
    )
    rec = {
        "accuracy": 0.5,
        "format_rate": 0.9,
        "mean_reward": 0.6,
        "n": 64,
        "rewards": {"correct": 0.5, "format": 0.9},
    }
    assert eval_line("final", rec) == "eval/final: accuracy 0.500  format 0.900  (n=64, 0s)"
    base = {**rec, "accuracy": 0.219, "format_rate": 0.6}
    assert h.held_out(base, rec) == "held-out accuracy 0.219 -> 0.500 (n=64); format 0.600 -> 0.900"


def test_own_rewards_lead_and_accuracy_is_left_out():
    assert (
        step_line(3, 20, OWN, None)
        == "step 3/20  reward 0.700  brevity 0.400  length 0.600  loss +0.0000  2.0 s/step"
    )
    rec = {
        "accuracy": 0.0,
        "format_rate": 0.0,
        "mean_reward": 0.8,
        "n": 8,
        "rewards": {"brevity": 0.5, "length": 0.3},
    }
    assert (
        eval_line("final", rec)
        == "eval/final: reward 0.800  brevity 0.500  length 0.300  (n=8, 0s)"
    )
    base = {**rec, "mean_reward": 0.2, "rewards": {"brevity": 0.1, "length": None}}
    assert h.held_out(base, rec) == (
        "held-out reward 0.200 -> 0.800 (n=8); brevity 0.100 -> 0.500, length - -> 0.300"
    )


def test_correct_beside_own_rewards_shows_both():
    row = {**OWN, "rewards/correct/mean": 0.5, "accuracy": 0.5}
    assert h.step_parts(row) == [
        "reward 0.700",
        "brevity 0.400",
        "length 0.600",
        "correct 0.500",
        "accuracy 0.500",
    ]


def test_a_row_that_names_no_reward_is_read_as_the_default():
    assert h.step_parts({"reward_mean": 0.1, "accuracy": 0.2}) == ["reward 0.100", "accuracy 0.200"]
