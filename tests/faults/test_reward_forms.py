"""#26: a TRL-style reward given by file path trains; two rewards give two per-step
means in metrics.jsonl, TensorBoard and ``status RUN``; ``--print-prompt`` shows the
exact prompts and creates nothing."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.faults.conftest import one_error

TRL_FILE = """
def brevity(prompts, completions, completion_ids, answer, **kwargs):
    assert len(prompts) == len(completions) == len(answer)
    return [1.0 / (1 + len(ids)) for ids in completion_ids]
"""


@pytest.fixture(scope="module")
def two_rewards(tmp_path_factory, tiny_args):
    """A 2-step run whose second reward is a TRL-signature function in ./trl_rewards.py
    (the working folder is not on PYTHONPATH)."""
    from tests.faults.conftest import Cli

    home = tmp_path_factory.mktemp("two")
    (home / "trl_rewards.py").write_text(TRL_FILE)
    cli = Cli(home)
    r = cli(
        *tiny_args(
            home / "runs",
            "two",
            "--steps",
            "2",
            "--set",
            'rewards=["tests.fakes.rewards.digit_count", '
            '{"fn": "./trl_rewards.py:brevity", "weight": 0.5}]',
        )
    )
    assert r.returncode == 0, r.stderr
    return cli, home


def test_each_reward_has_a_mean_per_step_in_metrics(two_rewards):
    _, home = two_rewards
    rows = [json.loads(x) for x in (home / "runs/two/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert 0 < r["rewards/brevity/mean"] <= 1
        assert r["rewards/digit_count/mean"] >= 0
    spec = yaml.safe_load((home / "runs/two/spec.yaml").read_text())
    assert spec["rewards"][1] == {
        "fn": f"{home}/trl_rewards.py:brevity",
        "weight": 0.5,
        "name": "brevity",
    }  # absolute: a resume finds it anywhere
    final = json.loads((home / "runs/two/eval/final.json").read_text())
    assert set(final["rewards"]) == {"digit_count", "brevity"}


def test_each_rewards_mean_is_in_tensorboard(two_rewards):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, home = two_rewards
    events = EventAccumulator(str(home / "runs/two/tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {
        "train/rewards/brevity/mean",
        "train/rewards/digit_count/mean",
        "eval_final/rewards/brevity/mean",
    } <= tags
    assert [e.step for e in events.Scalars("train/rewards/brevity/mean")] == [1, 2]


def test_status_shows_a_line_per_reward(two_rewards):
    cli, home = two_rewards
    r = cli("status", "two", "--runs-dir", str(home / "runs"), env={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    lines = [x.strip() for x in r.stdout.splitlines()]
    assert any(x.startswith("brevity") and "last" in x for x in lines), r.stdout
    assert any(x.startswith("digit_c") and "last" in x for x in lines), r.stdout
    j = json.loads(cli("status", "two", "--runs-dir", str(home / "runs"), "-o", "json").stdout)
    assert set(j["curve"]["rewards"]) == {"digit_count", "brevity"}


def test_a_trl_reward_that_fails_on_the_data_is_refused_before_the_run(cli, tiny_args, tmp_path):
    (tmp_path / "r.py").write_text(
        "def f(prompts, completions, solution, **kw):\n    return [0.0] * len(completions)\n"
    )
    r = cli(*tiny_args(tmp_path / "runs", "r", "--set", 'rewards=["./r.py:f"]'))
    one_error(r, 2, f"reward '{tmp_path}/r.py:f' raised TypeError", "solution")
    assert not (tmp_path / "runs").exists()


def test_a_missing_reward_file_is_one_line(cli, tiny_args, tmp_path):
    r = cli(*tiny_args(tmp_path / "runs", "r", "--set", 'rewards=["./nope.py:f"]'))
    one_error(r, 2, "no file", "nope.py")
    assert not (tmp_path / "runs").exists()


def test_print_prompt_shows_the_templated_prompts_and_creates_nothing(cli, tiny_args, tmp_path):
    args = tiny_args(
        tmp_path / "runs", "p", "--set", "prompt.system=Answer in tags.", "--print-prompt"
    )
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    assert "--- first training prompt (step 1) ---" in r.stdout
    assert "--- first eval prompt ---" in r.stdout
    assert r.stdout.count("Answer in tags.") == 2 and "What is" in r.stdout
    assert "What is 4 + 3?" in r.stdout  # the default example turn
    assert not (tmp_path / "runs").exists()
    j = json.loads(cli(*args, "-o", "json").stdout)
    assert set(j) == {"train", "eval"} and "Answer in tags." in j["train"]


def test_a_reward_file_is_refused_for_a_cluster_run():
    from rlctl.cli.train import _no_reward_files
    from rlctl.core.config.models import RunSpec
    from rlctl.core.errors import ConfigError

    _no_reward_files(RunSpec(rewards=["correct", "pkg.mod:fn"]))  # fine: importable in a pod
    with pytest.raises(ConfigError, match="pods cannot read"):
        _no_reward_files(RunSpec(rewards=["correct", "/abs/r.py:fn"]))
