"""bench/bench_vs_trl.py and its TRL child without TRL or a training run: the figures
and ratios from metrics rows, the prompts TRL is given, the child's GRPOConfig and
rewards against rlctl's defaults, and the missing-venv message."""

from __future__ import annotations

import json

import pytest

from bench import bench_vs_trl as bv
from bench import trl_grpo_child as child
from rlctl.core.config.models import RunSpec


def _rows(steps: list[tuple[float, float, int]], acc: list[float] | None = None) -> list[dict]:
    return [
        {
            "step": i + 1,
            "step_seconds": s,
            "rollout_seconds": r,
            "completion_tokens": n,
            "accuracy": None if acc is None else acc[i],
        }
        for i, (s, r, n) in enumerate(steps)
    ]


class TestFigures:
    def test_first_step_apart_and_medians_of_the_rest(self):
        f = bv.figures(
            _rows([(60.0, 50.0, 100), (10.0, 4.0, 200), (12.0, 5.0, 300), (30.0, 6.0, 400)])
        )
        assert f["first_step"] == 60.0
        assert f["median_step"] == 12.0  # of 10, 12, 30: the compile step left out
        assert f["median_rollout"] == 5.0
        assert f["median_update"] == 7.0  # of 6, 7, 24
        assert f["tokens_per_s"] == pytest.approx(900 / 52)  # sums, not a mean of rates
        assert f["mean_tokens"] == 250
        assert f["steps"] == 4

    def test_one_step_has_no_later_figures(self):
        f = bv.figures(_rows([(60.0, 50.0, 100)]))
        assert f["first_step"] == 60.0
        assert f["median_step"] is None and f["tokens_per_s"] is None

    def test_accuracy_halves(self):
        f = bv.figures(_rows([(1.0, 0.5, 1)] * 4, acc=[0.0, 0.5, 0.5, 1.0]))
        assert f["accuracy_halves"] == [0.25, 0.75]
        assert bv.figures(_rows([(1.0, 0.5, 1)] * 4))["accuracy_halves"] is None


class TestRatios:
    def test_ours_over_theirs(self):
        ours = bv.Run(
            "rlctl", _rows([(9.0, 1.0, 10), (2.0, 1.0, 100), (2.0, 1.0, 100)]), peak_rss=2 * bv.GiB
        )
        theirs = bv.Run(
            "trl-fp32",
            _rows([(9.0, 1.0, 10), (8.0, 2.0, 200), (8.0, 2.0, 200)]),
            peak_rss=4 * bv.GiB,
        )
        q = bv.ratios(ours, theirs)
        assert q["median_step"] == 0.25
        assert q["peak_rss"] == 0.5
        assert q["tokens_per_s"] == pytest.approx((200 / 4) / (400 / 16))

    def test_fastest_is_the_lowest_median_step_that_ran(self):
        slow = bv.Run("trl-fp32", _rows([(1.0, 0.1, 1), (30.0, 10.0, 1)]))
        quick = bv.Run("trl-bf16", _rows([(99.0, 0.1, 1), (20.0, 10.0, 1)]))
        broken = bv.Run(
            "trl-fp32-compile", _rows([(1.0, 0.1, 1), (1.0, 0.1, 1)]), error="exit 1: boom"
        )
        one_step = bv.Run("trl-fp32-nockpt", _rows([(1.0, 0.1, 1)]))
        assert bv.fastest([slow, quick, broken, one_step]) is quick
        assert bv.fastest([broken]) is None

    def test_report_names_the_ratios_and_the_machine(self):
        result = {
            "machine": bv.machine("model name\t: Test CPU\nflags\t\t: fpu avx2 avx512f\n"),
            "steps": 3,
            "runs": [
                vars(
                    bv.Run(
                        "rlctl",
                        _rows([(9.0, 1.0, 10), (2.0, 1.0, 100), (2.0, 1.0, 100)]),
                        peak_rss=2 * bv.GiB,
                        extra={
                            "eval": {
                                "baseline": {"n": 64, "accuracy": 0.25, "seconds": 5.0},
                                "final": {"n": 64, "accuracy": 0.5, "seconds": 4.0},
                            }
                        },
                    )
                ),
                vars(
                    bv.Run(
                        "trl-fp32",
                        _rows([(9.0, 1.0, 10), (8.0, 2.0, 200), (8.0, 2.0, 200)]),
                        peak_rss=4 * bv.GiB,
                    )
                ),
                vars(
                    bv.Run(
                        "trl-bf16",
                        _rows([(9.0, 1.0, 10), (4.0, 2.0, 200), (4.0, 2.0, 200)]),
                        peak_rss=8 * bv.GiB,
                    )
                ),
            ],
        }
        text = bv.report(json.loads(json.dumps(result)))
        assert "Test CPU" in text and "avx512f yes" in text and "amx_bf16 no" in text
        assert "0.250 -> 0.500 (+0.250)" in text
        assert "TRL's fastest (trl-bf16)" in text
        fastest_line = next(line for line in text.splitlines() if "TRL's fastest" in line)
        assert "median step 0.50x" in fastest_line and "peak RSS 0.25x" in fastest_line
        fp32_line = next(line for line in text.splitlines() if "vs TRL fp32" in line)
        assert "median step 0.25x" in fp32_line and "peak RSS 0.50x" in fp32_line


class FakeTokenizer:
    """ChatTokenizer's two methods the prompts use: a template that joins the turns."""

    def apply_chat_template(self, messages: list[dict[str, str]]) -> str:
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    def encode(self, text: str) -> list[int]:
        return [len(word) for word in text.split()]


class TestPrompts:
    def test_rlctl_order_text_answer_and_tokens(self, tmp_path):
        from rlctl.core.trainer.data import load_source
        from rlctl.core.trainer.data.prompts import chat_messages

        spec = RunSpec()
        tok = FakeTokenizer()
        rows = bv.prompt_rows(3, tokenizer=tok)
        source = load_source(spec.data, spec.eval.size)
        problems = [p for k in range(3) for p in source.batch(k, 2)]
        assert len(rows) == 6
        assert [r["step"] for r in rows] == [1, 1, 2, 2, 3, 3]
        for row, problem in zip(rows, problems, strict=True):
            assert row["prompt"] == tok.apply_chat_template(chat_messages(problem))
            assert problem.question in row["prompt"]
            assert row["answer"] == problem.answer
            assert row["prompt_ids"] == tok.encode(row["prompt"])
        path = bv.write_prompts(tmp_path / "p.jsonl", rows)
        assert child.read_prompts(path) == rows  # what the child reads back

    def test_a_spec_changes_the_prompts(self):
        spec = RunSpec(data={"seed": 1})
        assert bv.prompt_rows(1, FakeTokenizer(), spec) != bv.prompt_rows(1, FakeTokenizer())


class TestChild:
    def test_config_is_the_default_run(self):
        spec = RunSpec()
        t, r = spec.training, spec.rollout
        c = child.config(
            "fp32", 20, "/tmp/x", t.prompts_per_step, r.num_generations, r.max_new_tokens
        )
        assert c["per_device_train_batch_size"] == t.prompts_per_step * r.num_generations == 16
        assert c["num_generations"] == r.num_generations
        # one generation per optimizer step, one update per generation
        assert c["gradient_accumulation_steps"] == c["steps_per_generation"] == 1
        assert c["num_iterations"] == t.num_iterations == 1
        assert c["max_completion_length"] == r.max_new_tokens == 48
        assert c["learning_rate"] == t.learning_rate
        assert c["weight_decay"] == t.weight_decay and c["max_grad_norm"] == t.max_grad_norm
        assert (c["adam_beta1"], c["adam_beta2"]) == (0.9, 0.99)  # step.make_optimizer's
        assert c["lr_scheduler_type"] == "constant" and c["warmup_steps"] == t.warmup_steps
        assert c["beta"] == t.beta and c["epsilon"] == t.epsilon
        assert c["temperature"] == r.temperature and c["top_p"] == r.top_p
        assert t.loss_aggregation == "sequence-mean-token-mean" and c["loss_type"] == "grpo"
        assert c["reward_weights"] == [e.weight for e in spec.rewards]
        assert c["shuffle_dataset"] is False and c["save_strategy"] == "no"
        assert c["bf16"] is False
        assert child.config("bf16", 20, "/tmp/x", 2, 8, 48)["bf16"] is True
        assert set(bv.TRL_SETTINGS) == set(child.SETTINGS)

    def test_rewards_are_rlctls(self):
        from rlctl.core.trainer.rewards import correct_reward, format_reward

        correct, fmt = child.reward_functions()
        assert [correct.__name__, fmt.__name__] == [e.name for e in RunSpec().rewards]
        completions = [
            "7 + 22 = 29. <answer>29</answer>",
            "<answer>30</answer>",
            "<answer>18 + 11</answer>",
            "twenty-nine",
        ]
        gold = ["29"] * len(completions)
        assert (
            correct([""] * 4, completions, answer=gold)
            == [correct_reward(c, g) for c, g in zip(completions, gold)]
            == [1.0, 0.0, 0.0, 0.0]
        )
        assert (
            fmt([""] * 4, completions, answer=gold)
            == [format_reward(c, g) for c, g in zip(completions, gold)]
            == [1.0, 1.0, 0.0, 0.0]
        )


def test_rlctl_run_folder(tmp_path):
    run = tmp_path / "r"
    (run / "eval").mkdir(parents=True)
    rows = [
        {"step": 1, "step_seconds": 9.0, "rollout_seconds": 3.0, "completion_tokens": 400},
        {"step": 2, "step_seconds": 5.0, "rollout_seconds": 2.0, "completion_tokens": 300},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    (run / "eval" / "baseline.json").write_text(
        json.dumps({"n": 64, "accuracy": 0.2, "format_rate": 0.5, "seconds": 7.0, "samples": []})
    )
    got, evals = bv.read_rlctl_run(run)
    assert got == rows
    assert evals == {"baseline": {"n": 64, "accuracy": 0.2, "format_rate": 0.5, "seconds": 7.0}}


def test_exit_reasons():
    assert bv.exit_reason(-15, "{'loss': 0}") == "killed by SIGTERM"
    assert bv.exit_reason(-9, "") == "killed by SIGKILL"
    assert bv.exit_reason(1, "  ValueError: bad  ") == "exit 1: ValueError: bad"
    assert bv.exit_reason(2, "") == "exit 2"
    assert len(bv.exit_reason(1, "x" * 500)) == len("exit 1: ") + 100


def test_machine_flags():
    m = bv.machine(
        "model name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512_bf16 amx_tile\n"
        "model name\t: other\nflags\t\t: fpu\n"
    )
    assert m["cpu"] == "AMD EPYC"
    assert m["flags"] == {
        "avx2": True,
        "avx512f": False,
        "avx512_bf16": True,
        "amx_bf16": False,
        "amx_tile": True,
    }


def test_missing_trl_venv_is_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        bv.main(["--steps", "1", "--trl-python", str(tmp_path / "no" / "python")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(tmp_path / "no" / "python") in err
    assert bv.VENV_COMMAND in err and "requirements-trl.txt" in err


def test_settings_and_their_step_caps():
    assert bv.parse_settings("fp32, bf16:2,,fp32-nockpt:50", 20) == [
        ("fp32", 20),
        ("bf16", 2),
        ("fp32-nockpt", 20),
    ]  # a cap above --steps is --steps
    assert bv.parse_settings(bv.DEFAULT_SETTINGS, 3)[-1] == ("bf16", 2)
    for bad in ("fp64", "bf16:0", "bf16:x", "bf16:-1"):
        with pytest.raises(ValueError):
            bv.parse_settings(bad, 20)


@pytest.mark.parametrize("settings", ["fp32,fp64", "bf16:0"])
def test_a_bad_setting_is_a_usage_error(settings, capsys):
    with pytest.raises(SystemExit) as e:
        bv.main(["--trl-settings", settings])
    assert e.value.code == 2 and settings.split(",")[-1] in capsys.readouterr().err
