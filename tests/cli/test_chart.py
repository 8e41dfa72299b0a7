"""The learning curve as text (``rlctl status RUN``): pure, plain, within the width."""

from __future__ import annotations

import math
from typing import ClassVar

import pytest

from rlctl.cli._chart import ASCII_BLOCKS, BLOCKS, buckets, curve_lines, num, sparkline
from rlctl.core.runs.curve import build_curve

EVALS = {
    "baseline": {"which": "baseline", "step": 0, "accuracy": 0.219},
    "step-10": {"which": "step-10", "step": 10, "accuracy": 0.4},
    "final": {"which": "final", "step": 20, "accuracy": 0.547},
}


def rows(n: int) -> list[dict]:
    return [
        {
            "step": i,
            "reward_mean": 0.1 + i / n,
            "accuracy": i / n,
            "loss": -1e-5 * i,
            "entropy": 1.5 - i / n,
            "kl": 0.0,
            "clip_fraction": 0.0,
        }
        for i in range(1, n + 1)
    ]


class TestSparkline:
    def test_rises_from_the_lowest_to_the_highest_mark(self):
        assert sparkline([0.0, 0.5, 1.0]) == BLOCKS[0] + BLOCKS[4] + BLOCKS[-1]

    def test_a_gap_for_a_missing_value_and_a_flat_series_in_the_middle(self):
        assert sparkline([1.0, None, 1.0]) == BLOCKS[3] + " " + BLOCKS[3]
        assert sparkline([None, None]) == "  "

    def test_ascii_marks(self):
        assert set(sparkline([0.0, 1.0, 0.3], ASCII_BLOCKS)) <= set(ASCII_BLOCKS)

    def test_buckets_average_and_keep_gaps(self):
        assert buckets([1.0, 3.0, None, None], 2) == [2.0, None]
        assert buckets([1.0, 2.0], 5) == [1.0, 2.0]


class TestNumbers:
    @pytest.mark.parametrize(
        "v,text",
        [
            (0.5, "0.500"),
            (0.0, "0.000"),
            (-3.2e-5, "-3.20e-05"),
            (None, "-"),
            (12345.0, "1.23e+04"),
        ],
    )
    def test_a_tiny_loss_is_not_printed_as_zero(self, v, text):
        assert num(v) == text


class TestCurveLines:
    def test_twenty_steps_with_evals_at_80_columns(self):
        lines = curve_lines(build_curve(rows(20), EVALS), 80)
        assert all(len(x) <= 80 for x in lines), lines
        assert lines[0] == "learning curve, steps 1-20"
        reward = next(x for x in lines if x.strip().startswith("reward"))
        assert BLOCKS[0] in reward and BLOCKS[-1] in reward
        assert reward.split()[-6:] == ["last", "1.100", "min", "0.150", "max", "1.100"]
        assert lines[-1].split() == [
            "held-out",
            "baseline",
            "0.219",
            "→",
            "step-10",
            "0.400",
            "→",
            "final",
            "0.547",
        ]
        assert any(x.split() == ["step", "1", "20"] for x in lines)

    def test_plain_text_only(self):
        text = "\n".join(curve_lines(build_curve(rows(20), EVALS), 80))
        assert "\x1b" not in text and "[" not in text

    def test_one_step(self):
        lines = curve_lines(build_curve(rows(1), {}), 80)
        assert lines[0] == "learning curve, step 1"
        assert all(len(x) <= 80 for x in lines)

    def test_more_steps_than_columns_are_averaged(self):
        lines = curve_lines(build_curve(rows(500), {}), 80)
        assert "a mark per" in lines[0] and all(len(x) <= 80 for x in lines)

    def test_nan_and_missing_values_are_gaps_not_errors(self):
        data = rows(6)
        data[2]["entropy"] = math.nan
        data[3]["reward_mean"] = None
        del data[4]["accuracy"]
        data[5]["entropy"] = "oops"
        curve = build_curve(data, {})
        assert curve.entropy[2] is None and curve.reward_mean[3] is None
        assert curve.accuracy[4] is None and curve.entropy[5] is None
        lines = curve_lines(curve, 80)
        entropy = next(x for x in lines if x.strip().startswith("entropy"))
        spark = entropy[len("  entropy   ") :][:6]
        assert [c == " " for c in spark] == [False, False, True, False, False, True], spark

    def test_a_series_with_no_value_at_all(self):
        lines = curve_lines(build_curve([{"step": 1, "reward_mean": 0.5}], {}), 80)
        assert any(x.split()[:3] == ["accuracy", "last", "-"] for x in lines), lines

    def test_no_loss_and_the_policys_series_only_where_they_say_something(self):
        """GRPO's loss is near zero by construction: not drawn. KL without a KL term
        and the clip fraction of one update per rollout are all 0: not drawn either."""
        labels = [x.split()[0] for x in curve_lines(build_curve(rows(5), {}), 80)[1:-1]]
        assert labels == ["reward", "accuracy", "entropy"]
        data = [{**r, "kl": 0.01 * r["step"], "clip_fraction": 0.1} for r in rows(5)]
        labels = [x.split()[0] for x in curve_lines(build_curve(data, {}), 80)[1:-1]]
        assert labels == ["reward", "accuracy", "entropy", "kl", "clipped"]

    def test_a_run_on_its_own_reward_draws_it_and_no_accuracy(self):
        data = [{**r, "rewards/length/mean": r["reward_mean"]} for r in rows(5)]
        evals = {
            "baseline": {
                "step": 0,
                "accuracy": 0.0,
                "mean_reward": 0.2,
                "rewards": {"length": 0.2},
            },
            "final": {"step": 5, "accuracy": 0.0, "mean_reward": 0.7, "rewards": {"length": 0.7}},
        }
        lines = curve_lines(build_curve(data, evals), 80)
        assert [x.split()[0] for x in lines[1:-2]] == ["reward", "length", "entropy"]
        assert lines[-1] == "  held-out  baseline 0.200 → final 0.700"

    def test_no_eval_no_held_out_line(self):
        assert not any("held-out" in x for x in curve_lines(build_curve(rows(3), {}), 80))

    def test_evals_before_the_first_step(self):
        lines = curve_lines(build_curve([], {"baseline": {"accuracy": 0.25}}), 80)
        assert lines == ["learning curve: no step yet", "  held-out  baseline 0.250"]

    def test_nothing_to_draw(self):
        assert curve_lines(build_curve([], {}), 80) == []

    @pytest.mark.parametrize("width", [60, 40, 30])
    def test_narrow_terminals_fold_instead_of_overflowing(self, width):
        lines = curve_lines(build_curve(rows(20), EVALS), width)
        assert all(len(x) <= width for x in lines), lines
        text = "\n".join(lines)
        assert "baseline 0.219" in text and "final 0.547" in text

    def test_many_evals_keep_the_first_and_the_last(self):
        evals = {f"step-{k}": {"step": k, "accuracy": k / 100} for k in range(5, 100, 5)}
        evals["baseline"] = {"step": 0, "accuracy": 0.0}
        evals["final"] = {"step": 100, "accuracy": 0.9}
        line = curve_lines(build_curve(rows(100), evals), 80)[-1]
        assert len(line) <= 80 and "baseline 0.000" in line and "final 0.900" in line
        assert "…" in line

    def test_ascii_only(self):
        text = "\n".join(curve_lines(build_curve(rows(20), EVALS), 80, ascii_only=True))
        text.encode("ascii")
        assert "baseline 0.219 -> step-10 0.400 -> final 0.547" in text


class TestPerRewardLines:
    """Two rewards: one line each under the summed reward, so a reader sees which moved."""

    ROWS: ClassVar[list[dict]] = [
        {
            "step": i,
            "reward_mean": i / 10,
            "accuracy": 0.5,
            "loss": 0.0,
            "rewards/correct/mean": i / 20,
            "rewards/a_very_long_reward_name/mean": 1 - i / 10,
        }
        for i in range(1, 11)
    ]

    def test_the_curve_keeps_each_rewards_series_in_order(self):
        curve = build_curve(self.ROWS, {})
        assert list(curve.rewards) == ["correct", "a_very_long_reward_name"]
        assert curve.series("rewards/correct/mean")[-1] == 0.5

    def test_one_line_per_reward_below_the_total(self):
        lines = curve_lines(build_curve(self.ROWS, {}), 80)
        labels = [x[:28] for x in lines[1:5]]
        assert labels[0].strip().startswith("reward") and "correct" in labels[1]
        assert "a_very_long_reward_name" in labels[2]  # whole: the column widens for it
        cut = build_curve(
            [{**r, "rewards/an_even_longer_reward_name_here/mean": 0.1} for r in self.ROWS], {}
        )
        assert " an_even_longer_reward_… " in "\n".join(curve_lines(cut, 80))  # cut at 24
        assert lines[2].split()[-6:] == ["last", "0.500", "min", "0.050", "max", "0.500"]
        assert all(len(x) <= 80 for x in lines)

    def test_no_reward_keys_no_extra_lines(self):
        lines = curve_lines(build_curve(rows(5), {}), 80)
        assert [x.split()[0] for x in lines[1:4]] == ["reward", "accuracy", "entropy"]
