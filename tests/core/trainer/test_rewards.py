import math
import re
import signal
import threading
import time

import pytest

from rlctl.core.config.models import RewardEntry, RunSpec
from rlctl.core.errors import ConfigError
from rlctl.core.trainer.rewards import (
    Sample,
    correct_reward,
    extract_answer,
    format_reward,
    gold_answer,
    gsm8k_gold,
    normalize_number,
    resolve,
    score,
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
        [
            ("1,234", "1234"),
            ("$5", "5"),
            ("7.0", "7"),
            ("7.", "7"),
            ("-3", "-3"),
            ("0.50", "0.5"),
            (" 42 ", "42"),
            ("+8", "8"),
            ("1e3", None),
            ("seven", None),
            ("", None),
            (None, None),
            ("3/4", None),
        ],
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

    def test_format_needs_math_in_tags(self):
        assert format_reward("<answer>seven</answer>", "7") == 0.0
        assert format_reward("<answer>8</answer>", "7") == 1.0  # weighed 0.1 by the config
        assert format_reward("no tags: 8", "7") == 0.0

    def test_total_is_correct_plus_a_tenth_of_format(self):
        fns = resolve(["correct", "format"])
        assert total_reward(fns, "<answer>7</answer>", "7") == pytest.approx(1.1)
        assert total_reward(fns, "<answer>8</answer>", "7") == pytest.approx(0.1)
        assert total_reward(fns, "7", "7") == 0.0

    def test_dotted_path(self):
        (r,) = resolve(["rlctl.core.trainer.rewards.correct_reward"])
        assert r.fn is correct_reward and r.name == "correct_reward" and not r.batched

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

    def test_an_expression_after_hashes(self):
        assert gsm8k_gold("#### \\frac{1}{2}") == "\\frac{1}{2}"


class TestMathVerify:
    """``correct`` compares with math-verify, not a hand-written number normaliser."""

    @pytest.mark.parametrize("answer", ["7", "7.0", "14/2", "\\frac{14}{2}", "$7", "7."])
    def test_equal_forms_of_seven(self, answer):
        assert correct_reward(f"<answer>{answer}</answer>", "7") == 1.0

    @pytest.mark.parametrize(
        ("answer", "gold"),
        [("18 + 11", "29"), ("7 apples", "7"), ("x = 7", "7"), ("3 + 4 = 7", "7"), ("{7}", "7")],
    )
    def test_a_numeric_gold_wants_one_number_not_a_sum_or_a_hedge(self, answer, gold):
        """math-verify alone credits each of these (measured); the prompt asks for a
        number, and crediting sums and lists cost the default run held-out gain."""
        completion = f"<answer>{answer}</answer>"
        assert correct_reward(completion, gold) == 0.0
        assert format_reward(completion, gold) == 0.0

    @pytest.mark.parametrize("answer", ["30, 29", "29, 30"])
    def test_a_list_is_not_credited(self, answer):
        """math-verify alone credits '30, 29' for 29; as a number with a thousands
        separator it reads 3029 (the old normaliser's reading too): formatted, wrong."""
        assert correct_reward(f"<answer>{answer}</answer>", "29") == 0.0

    @pytest.mark.parametrize("answer", ["0.5", "1/2", "\\dfrac{1}{2}"])
    def test_a_latex_gold(self, answer):
        assert correct_reward(f"<answer>{answer}</answer>", "\\frac{1}{2}") == 1.0

    @pytest.mark.parametrize("answer", ["9^9^9^9", "123456789^987654321", "1" * 300])
    def test_what_sympy_could_spend_minutes_on_scores_zero_at_once(self, answer):
        t0 = time.perf_counter()
        assert correct_reward(f"<answer>{answer}</answer>", "7") == 0.0
        assert time.perf_counter() - t0 < 5  # unguarded, the towers run for minutes

    def test_no_alarm_is_set_and_it_works_in_a_thread(self):
        """math-verify's default timeout is signal.alarm: it raises outside the main
        thread and would race rlctl's own signal handling. rlctl turns it off."""
        before = signal.getsignal(signal.SIGALRM)
        got = []
        t = threading.Thread(
            target=lambda: got.append(correct_reward("<answer>3/4</answer>", "0.75"))
        )
        t.start()
        t.join()
        assert got == [1.0]
        assert signal.getsignal(signal.SIGALRM) is before
        assert signal.alarm(0) == 0  # no alarm left pending

    @pytest.mark.parametrize(
        ("raw", "want"),
        [
            ("#### 1,200", "1200"),
            ("12", "12"),
            (7, "7"),
            (2.5, "2.5"),
            ("\\frac{1}{2}", "\\frac{1}{2}"),
            ("seven", None),
            ("", None),
            (True, None),
        ],
    )
    def test_gold_answer(self, raw, want):
        assert gold_answer(raw) == want


def _trl(tmp_path, body, name="rewards.py"):
    (tmp_path / name).write_text(body)
    return str(tmp_path / name)


SAMPLES = [
    Sample("<answer>7</answer>", "3+4?", "7", {"level": 1}),
    Sample("a long answer without tags", "2+2?", "4", {"level": 2}),
]


class TestForms:
    def test_a_trl_reward_from_a_file_gets_prompts_completions_and_columns(self, tmp_path):
        path = _trl(
            tmp_path,
            "SEEN = {}\n"
            "def brevity(prompts, completions, level, **kwargs):\n"
            "    SEEN.update(prompts=prompts, level=level, kw=sorted(kwargs))\n"
            "    return [1.0 / len(c) for c in completions]\n",
        )
        (r,) = resolve([f"{path}:brevity"])
        assert r.batched and r.name == "brevity"
        out = score([r], SAMPLES)
        assert out.total.tolist() == pytest.approx([1 / 18, 1 / 26])
        seen = r.fn.__globals__["SEEN"]
        assert seen["prompts"] == ["3+4?", "2+2?"] and seen["level"] == [1, 2]
        assert seen["kw"] == ["answer", "completion_ids", "question"]

    def test_none_means_not_applicable(self, tmp_path):
        path = _trl(
            tmp_path,
            "def only_tagged(completions, **kw):\n"
            "    return [1.0 if '<answer>' in c else None for c in completions]\n",
        )
        rewards = resolve(["correct", f"{path}:only_tagged"])
        out = score(rewards, SAMPLES)
        assert out.total.tolist() == [2.0, 0.0]  # None adds nothing
        assert math.isnan(out.per_reward["only_tagged"][1])
        assert out.means() == {"correct": 0.5, "only_tagged": 1.0}  # over the applicable

    def test_a_reward_that_applies_to_none_has_no_mean(self, tmp_path):
        path = _trl(
            tmp_path, "def never(prompts, completions):\n    return [None] * len(completions)\n"
        )
        assert score(resolve([f"{path}:never"]), SAMPLES).means() == {"never": None}

    def test_weights_multiply(self, tmp_path):
        rewards = resolve(
            [RewardEntry(fn="correct", weight=2.0), RewardEntry(fn="format", weight=-0.5)]
        )
        assert score(rewards, SAMPLES).total.tolist() == [1.5, 0.0]

    def test_only_the_keywords_a_reward_names_are_passed(self, tmp_path):
        path = _trl(
            tmp_path, "def f(prompts, completions):\n    return [0.0 for _ in completions]\n"
        )
        assert score(resolve([f"{path}:f"]), SAMPLES).total.tolist() == [0.0, 0.0]

    def test_conversational_rows_get_chat_turns(self, tmp_path):
        path = _trl(
            tmp_path,
            "SEEN = []\n"
            "def f(prompts, completions, **kw):\n"
            "    SEEN.extend([prompts, completions])\n"
            "    return [0.0 for _ in completions]\n",
        )
        (r,) = resolve([f"{path}:f"])
        msgs = ({"role": "user", "content": "hi"},)
        score([r], [Sample("<answer>1</answer>", "hi", "1", {}, msgs)])
        assert r.fn.__globals__["SEEN"] == [
            [[{"role": "user", "content": "hi"}]],
            [[{"role": "assistant", "content": "<answer>1</answer>"}]],
        ]

    @pytest.mark.parametrize(
        ("body", "words"),
        [
            ("return 1.0", "returned 1.0 (float) on a batch of 2 completions, not a list"),
            ("return [1.0]", "returned 1 values for 2 completions"),
            ("return [1.0, 'x']", "returned 'x' (str) for completion 2 of 2 (problem '2+2?')"),
            ("raise KeyError('solution')", "raised KeyError"),
        ],
    )
    def test_a_batched_reward_that_misbehaves_is_named(self, tmp_path, body, words):
        path = _trl(tmp_path, f"def f(prompts, completions, **kw):\n    {body}\n")
        with pytest.raises(ConfigError, match=re.escape(words)) as e:
            score(resolve([f"{path}:f"]), SAMPLES)
        assert path in e.value.message

    def test_a_per_sample_reward_may_not_return_none(self):
        with pytest.raises(ConfigError, match="not a finite number"):
            total_reward(resolve(["rlctl.core.config.models.validate_name"]), "x", "y")

    def test_neither_form(self, tmp_path):
        path = _trl(tmp_path, "def f(completion):\n    return 1.0\n")
        with pytest.raises(
            ConfigError,
            match=r"cannot be called as f\(completion, gold\) "
            r"nor as f\(prompts, completions",
        ):
            resolve([f"{path}:f"])


class TestFiles:
    def test_a_missing_file(self, tmp_path):
        with pytest.raises(ConfigError, match="no file"):
            resolve([f"{tmp_path}/nope.py:f"])

    def test_a_missing_function(self, tmp_path):
        path = _trl(tmp_path, "x = 1\n")
        with pytest.raises(ConfigError, match="has no 'f'"):
            resolve([f"{path}:f"])

    def test_a_file_that_fails_to_import(self, tmp_path):
        path = _trl(tmp_path, "def f(:\n")
        with pytest.raises(ConfigError, match="SyntaxError"):
            resolve([f"{path}:f"])

    def test_two_rewards_of_one_file_share_its_module(self, tmp_path):
        path = _trl(tmp_path, "def a(c, g):\n    return 1.0\ndef b(c, g):\n    return 2.0\n")
        a, b = resolve([f"{path}:a", f"{path}:b"])
        assert a.fn.__globals__ is b.fn.__globals__

    def test_a_relative_path_is_stored_absolute(self, tmp_path, monkeypatch):
        monkeypatch.chdir(tmp_path)
        spec = RunSpec(rewards=["./rewards.py:brevity"])
        assert spec.rewards[0].fn == f"{tmp_path}/rewards.py:brevity"
        monkeypatch.chdir("/")  # a resume elsewhere reads the same file
        assert RunSpec.model_validate(spec.model_dump()).rewards[0].fn == spec.rewards[0].fn


class TestConfig:
    def test_the_default_is_correct_plus_a_tenth_of_format(self):
        assert [(e.fn, e.weight, e.name) for e in RunSpec().rewards] == [
            ("correct", 1.0, "correct"),
            ("format", 0.1, "format"),
        ]

    def test_an_old_spec_keeps_its_meaning(self):
        """spec.yaml files from before weights: bare names, format worth 0.1."""
        spec = RunSpec.model_validate({"rewards": ["correct", "format", "pkg.mod.fn"]})
        assert [e.weight for e in spec.rewards] == [1.0, 0.1, 1.0]
        assert [e.name for e in spec.rewards] == ["correct", "format", "fn"]

    def test_an_entry_with_a_weight_and_a_name(self):
        (e,) = RunSpec(rewards=[{"fn": "pkg.mod:fn", "weight": 0.5, "name": "short"}]).rewards
        assert (e.fn, e.weight, e.name) == ("pkg.mod:fn", 0.5, "short")

    @pytest.mark.parametrize(
        ("rewards", "words"),
        [
            (["a.f", "b.f"], "two rewards are named 'f'"),
            ([{"fn": "correct", "name": "a b"}], "metrics key"),
            ([{"fn": "correct", "weight": "nan"}], "finite"),
            (["./r.py:not-a-name"], "not a function name"),
            ([], "at least 1"),
        ],
    )
    def test_bad_entries(self, rewards, words):
        with pytest.raises(ValueError, match=words):
            RunSpec(rewards=rewards)


class TestGuest:
    """#47: a reward's values are checked where they enter (finite, within
    ``REWARD_LIMIT``), what it prints goes to ``say`` (the run's log), never to
    stdout, and one that exits is named like one that raises."""

    @pytest.mark.parametrize(
        ("value", "words"),
        [
            ("1e308", "returned 1e+308 (float) for completion 1 of 2 (problem '3+4?'), outside"),
            ("-2e6", "returned -2000000.0 (float) for completion 1 of 2"),
            ("1000001", "returned 1000001 (int) for completion 1 of 2"),  # exactly, not 1e+06
            ("10**400", "returned an int of 401 digits for completion 1 of 2"),
            ("float('nan')", "returned nan (float) for completion 1 of 2 (problem '3+4?'), not"),
            ("float('inf')", "returned inf (float) for completion 1 of 2 (problem '3+4?'), not"),
        ],
    )
    def test_a_value_out_of_range_or_not_finite_is_refused_with_the_rewards_name(
        self, tmp_path, value, words
    ):
        path = _trl(tmp_path, f"def f(completion, gold):\n    return {value}\n")
        with pytest.raises(ConfigError, match=re.escape(words)) as e:
            score(resolve([f"{path}:f"]), SAMPLES)
        assert f"reward '{path}:f'" in e.value.message

    def test_the_range_itself_is_accepted(self, tmp_path):
        path = _trl(tmp_path, "def f(completion, gold):\n    return -1e6\n")
        assert score(resolve([f"{path}:f"]), SAMPLES).total.tolist() == [-1e6, -1e6]

    def test_weights_that_overflow_the_total_name_the_reward(self, tmp_path):
        path = _trl(tmp_path, "def f(completion, gold):\n    return 1e6\n")
        entries = [RewardEntry(fn="correct"), RewardEntry(fn=f"{path}:f", weight=1e38)]
        with pytest.raises(ConfigError, match=r"reward '.*:f' weighted 1e\+38 makes the total"):
            score(resolve(entries), SAMPLES)

    @pytest.mark.parametrize("body", ["import sys; sys.exit(3)", "raise SystemExit('bye')"])
    def test_a_reward_that_exits_is_named(self, tmp_path, body):
        path = _trl(tmp_path, f"def f(completion, gold):\n    {body}\n")
        with pytest.raises(ConfigError, match=r"reward '.*:f' called sys.exit\("):
            score(resolve([f"{path}:f"]), SAMPLES)

    def test_a_stop_signal_inside_a_reward_stays_a_stop(self, tmp_path):
        path = _trl(tmp_path, "def f(completion, gold):\n    raise KeyboardInterrupt\n")
        with pytest.raises(KeyboardInterrupt) as e:
            score(resolve([f"{path}:f"]), SAMPLES)
        # a stop still (exit 130, resumable), but one that says which reward raised it
        assert str(e.value) == (
            f"reward '{path}:f' raised KeyboardInterrupt for completion 1 of 2 (problem '3+4?')"
        )

    @pytest.mark.parametrize(
        ("body", "words"),
        [
            # #53: each ended 'unexpected error: ...' with "report it", the reward unnamed
            (
                "class F:\n    def __float__(self): raise RuntimeError('no')\n"
                "def f(completion, gold):\n    return F()\n",
                "returned a F for completion 1 of 2 (problem '3+4?'), not a number: "
                "float() of it raised RuntimeError",
            ),
            (
                "class E(Exception):\n    def __str__(self): raise RuntimeError('no')\n"
                "def f(completion, gold):\n    raise E()\n",
                "raised E: (its message could not be read) for completion 1 of 2",
            ),
            (
                "import numpy as np\n"
                "def f(prompts, completions, **kw):\n    return np.array(1.0)\n",
                "returned '1.0' (numpy.ndarray) on a batch of 2 completions, not a list",
            ),
            (
                "class L(list):\n    def __iter__(self): raise RuntimeError('no')\n"
                "def f(prompts, completions, **kw):\n    return L([1.0, 1.0])\n",
                "returned a L on a batch of 2 completions, not a list",
            ),
            (
                "def f(prompts, completions, **kw):\n    return [0.0, 10**400]\n",
                "returned an int of 401 digits for completion 2 of 2 (problem '2+2?'), outside",
            ),
        ],
    )
    def test_every_odd_value_or_failure_is_one_line_naming_the_reward_and_row(
        self, tmp_path, body, words
    ):
        path = _trl(tmp_path, body)
        with pytest.raises(ConfigError) as e:
            score(resolve([f"{path}:f"]), SAMPLES)
        assert e.value.message.startswith(f"reward '{path}:f' ")
        assert words in e.value.message and "\n" not in e.value.message

    @pytest.mark.parametrize(
        "body",
        [
            "import numpy as np\ndef f(completion, gold):\n    return np.array(1.0)\n",
            "import numpy as np\ndef f(prompts, completions, **kw):\n"
            "    return [np.array(1.0) for _ in completions]\n",
            "import numpy as np\ndef f(prompts, completions, **kw):\n"
            "    return np.ones(len(completions))\n",
        ],
    )
    def test_numpy_values_are_numbers_as_trl_takes_them(self, tmp_path, body):
        path = _trl(tmp_path, body)
        assert score(resolve([f"{path}:f"]), SAMPLES).total.tolist() == [1.0, 1.0]

    def test_what_a_reward_prints_goes_to_say_never_to_stdout(self, tmp_path, capsys):
        path = _trl(
            tmp_path,
            "def f(prompts, completions, **kw):\n"
            "    print('scoring', len(completions), end='')\n"
            "    print(' now')\n    print('partial', end='')\n"
            "    return [0.0 for _ in completions]\n",
        )
        said: list[str] = []
        score(resolve([f"{path}:f"]), SAMPLES, said.append)
        assert said == [
            f"reward '{path}:f' printed: scoring 2 now",
            f"reward '{path}:f' printed: partial",
        ]
        score(resolve([f"{path}:f"]), SAMPLES)  # no say: stderr, still not stdout
        out = capsys.readouterr()
        assert out.out == "" and "scoring 2 now" in out.err


class TestExpressionGolds:
    """#47: a gold answer may be any expression math-verify can parse, and a model's
    answer in the same form is credited (math-verify's plain parse took the last
    number of ``x^2 + 1`` or ``2^{10}``, and nothing of ``x^2+1``)."""

    @pytest.mark.parametrize(
        ("gold", "answer"),
        [
            ("x^2+1", "1 + x^2"),
            ("x^2+1", "x^2 + 1"),
            ("{1,2}", "{2, 1}"),
            ("sqrt(2)", "\\sqrt{2}"),
            ("2^{10}", "1024"),
            ("a+b", "b+a"),
            ("(1, 2)", "(1,2)"),
        ],
    )
    def test_an_expression_gold_is_accepted_and_matched(self, gold, answer):
        assert gold_answer(gold) == gold
        assert correct_reward(f"<answer>{answer}</answer>", gold) == 1.0

    @pytest.mark.parametrize(
        ("gold", "answer"), [("x^2+1", "x^2"), ("x^2+1", "1"), ("2^{10}", "2"), ("{1,2}", "{1,3}")]
    )
    def test_a_different_expression_is_not(self, gold, answer):
        assert correct_reward(f"<answer>{answer}</answer>", gold) == 0.0

    def test_words_are_still_no_gold(self):
        assert gold_answer("seven") is None and gold_answer("pi") is None
