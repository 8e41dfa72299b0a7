import pytest

from rlctl.core.errors import ConfigError
from rlctl.core.trainer.rewards import (
    correct_reward,
    extract_answer,
    format_reward,
    gsm8k_gold,
    normalize_number,
    resolve,
    total_reward,
)


class TestExtractAnswer:
    def test_last_block_wins(self):
        assert extract_answer("<answer>3</answer> no wait <answer>4</answer>") == "4"

    def test_no_block(self):
        assert extract_answer("the answer is 4") is None

    def test_unclosed_block_is_not_an_answer(self):
        assert extract_answer("<answer>4") is None

    def test_multiline_and_case(self):
        assert extract_answer("<ANSWER>\n 12 \n</ANSWER>") == "12"


class TestNormalizeNumber:
    @pytest.mark.parametrize(
        ("raw", "want"),
        [("1,234", "1234"), ("$5", "5"), ("7.0", "7"), ("7.", "7"), ("-3", "-3"),
         ("0.50", "0.5"), (" 42 ", "42"), ("+8", "8"), ("1e3", None), ("seven", None),
         ("", None), (None, None), ("3/4", None)],
    )
    def test_cases(self, raw, want):
        assert normalize_number(raw) == want


class TestRewards:
    def test_correct(self):
        assert correct_reward("so <answer>$1,000.00</answer>", "1000") == 1.0

    def test_wrong(self):
        assert correct_reward("<answer>999</answer>", "1000") == 0.0

    def test_earlier_right_answer_does_not_count(self):
        assert correct_reward("<answer>7</answer><answer>8</answer>", "7") == 0.0

    def test_format_needs_a_number_in_tags(self):
        assert format_reward("<answer>seven</answer>", "7") == 0.0
        assert format_reward("<answer>8</answer>", "7") == pytest.approx(0.1)

    def test_total_is_correct_plus_format(self):
        fns = resolve(["correct", "format"])
        assert total_reward(fns, "<answer>7</answer>", "7") == pytest.approx(1.1)
        assert total_reward(fns, "7", "7") == 0.0

    def test_dotted_path(self):
        (fn,) = resolve(["rlctl.core.trainer.rewards.correct_reward"])
        assert fn is correct_reward

    def test_unknown_reward_is_a_config_error(self):
        with pytest.raises(ConfigError, match="unknown reward"):
            resolve(["no_such_reward"])


class TestGsm8kGold:
    def test_after_hashes(self):
        assert gsm8k_gold("She has 3 + 4 = <<3+4=7>>7.\n#### 7") == "7"

    def test_commas(self):
        assert gsm8k_gold("... #### 1,200") == "1200"

    def test_missing(self):
        with pytest.raises(ValueError):
            gsm8k_gold("#### about seven")
