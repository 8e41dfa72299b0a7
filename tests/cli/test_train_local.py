"""``rlctl train`` on this machine as a user first types it: from a project folder, with
the default run store ``./runs`` (a relative path) and relative model and data paths."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from rlctl.cli.app import app

# builds a model, compiles or trains: out of the fast loop (tests/test_marks.py)
pytestmark = pytest.mark.slow

pytest.importorskip("tunix")

TINY = (
    "--prompts-per-step",
    "2",
    "-G",
    "2",
    "--max-new-tokens",
    "8",
    "--lr",
    "3e-3",
    "--eval-size",
    "2",
    "--set",
    "eval.batch_size=2",
    "--set",
    'rewards=["tests.fakes.rewards.digit_count"]',
)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def same_path(a: str, b: Path) -> bool:
    return Path(a).is_absolute() and Path(a).resolve() == b.resolve()


@pytest.mark.trainer
def test_relative_store_trains_through_a_checkpoint_resumes_and_reports(
    tiny_model_dir, tmp_path, monkeypatch, runner
):
    """Orbax >= 0.12.8 refuses a relative checkpoint path: ``./runs`` used to crash at
    the first checkpoint. Stopped after one, the run resumes to the end from ./runs."""
    from rlctl.core.trainer.run import loop

    work = tmp_path / "project"
    work.mkdir()
    monkeypatch.chdir(work)
    write_jsonl(
        work / "train.jsonl",
        [{"question": f"What is {a} + {a + 1}?", "answer": 2 * a + 1} for a in range(12)],
    )
    model = os.path.relpath(tiny_model_dir, work)  # a local folder, given relative
    real_step = loop.Trainer.step

    def ctrl_c_at_step_2(self, k: int):
        if k == 2:  # after the checkpoint at step 2
            raise KeyboardInterrupt
        return real_step(self, k)

    monkeypatch.setattr(loop.Trainer, "step", ctrl_c_at_step_2)
    r = runner.invoke(
        app,
        [
            "train",
            "grpo",
            "--name",
            "rel",
            "--model",
            model,
            "--dataset",
            "jsonl",
            "--data-path",
            "train.jsonl",
            "--steps",
            "3",
            "--set",
            "checkpoint.interval=2",
            *TINY,
        ],
    )
    assert r.exit_code == 130, r.output
    run = work / "runs" / "rel"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["2"]
    spec = yaml.safe_load((run / "spec.yaml").read_text())
    assert same_path(spec["output"]["root"], work / "runs")
    assert same_path(spec["model"]["source"], tiny_model_dir)
    assert same_path(spec["data"]["path"], work / "train.jsonl")

    monkeypatch.setattr(loop.Trainer, "step", real_step)
    r = runner.invoke(app, ["resume", "rel", "-o", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["phase"] == "completed"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["2", "3"]
    # both attempts in the run's log, each with how it ended
    log = [x.split("  ", 1)[1] for x in (run / "train.log").read_text().splitlines()]
    ends = [x for x in log if x.startswith(("==== attempt", "run "))]
    assert [x.split(" (pid")[0] for x in ends] == [
        "==== attempt 1: rlctl train rel",
        "run interrupted after step 2; latest checkpoint 2",
        "==== attempt 2: rlctl resume rel",
        "run completed: 3 steps",
    ]
    assert (
        log.index("restoring checkpoint 2")
        < log.index("step 3: compiling and running (the first step is slower)")
        < log.index(next(x for x in log if x.startswith("step 3/3  ")))
    )

    r = runner.invoke(app, ["status", "rel", "-o", "json"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.stdout)
    assert (info["phase"], info["step"], info["latest_checkpoint"]) == ("completed", 3, 3)


def test_a_bad_data_row_exits_2_naming_file_and_row(tiny_model_dir, tmp_path, monkeypatch, runner):
    monkeypatch.chdir(tmp_path)
    write_jsonl(
        tmp_path / "gsm8k.jsonl",
        [{"question": "a", "answer": "so #### 4"}, {"question": "b", "answer": "so #### ?"}],
    )
    r = runner.invoke(
        app,
        [
            "train",
            "grpo",
            "--model",
            str(tiny_model_dir),
            "--dataset",
            "gsm8k",
            "--data-path",
            "gsm8k.jsonl",
            *TINY,
        ],
    )
    assert r.exit_code == 2, r.output
    assert "gsm8k.jsonl:2" in r.output and "no number after '####'" in r.output
    assert "Traceback" not in r.output
    assert not (tmp_path / "runs").exists()  # refused before anything was written


@pytest.mark.trainer
def test_a_users_small_file_with_its_own_columns_trains_and_evaluates_on_it(
    tiny_model_dir, tmp_path, monkeypatch, runner
):
    """#26: --data-path alone was ignored (the run trained on the generated arithmetic),
    and 20 rows emptied the training split once the 64 held-out rows were taken."""
    monkeypatch.chdir(tmp_path)
    rows = [
        {"id": i, "problem_text": f"Add {i} and {i + 1}.", "gold": f"so #### {2 * i + 1}"}
        for i in range(20)
    ]
    write_jsonl(tmp_path / "mine.jsonl", rows)
    r = runner.invoke(
        app,
        [
            "train",
            "grpo",
            "--name",
            "mine",
            "--model",
            str(tiny_model_dir),
            "--data-path",
            "mine.jsonl",
            "--set",
            "data.prompt_column=problem_text",
            "--set",
            "data.answer_column=gold",
            "--steps",
            "1",
            "--prompts-per-step",
            "2",
            "-G",
            "2",
            "--max-new-tokens",
            "8",
            "--eval-size",
            "64",
            "--set",
            "eval.batch_size=4",
            "--set",
            'rewards=["tests.fakes.rewards.digit_count"]',
        ],
    )
    assert r.exit_code == 0, r.output
    run = tmp_path / "runs" / "mine"
    data = yaml.safe_load((run / "spec.yaml").read_text())["data"]
    assert data["dataset"] is None and same_path(data["path"], tmp_path / "mine.jsonl")
    questions = {row["problem_text"]: row["gold"].split()[-1] for row in rows}
    for which in ("baseline", "final"):
        ev = json.loads((run / "eval" / f"{which}.json").read_text())
        assert ev["n"] == 4  # a fifth of the 20 rows, not eval.size=64
        assert ev["samples"] and all(questions[s["question"]] == s["gold"] for s in ev["samples"])
    log = (run / "train.log").read_text()
    assert "has 20 rows: holding out 4 for eval, not eval.size=64" in log


def test_a_data_path_with_no_usable_columns_is_one_line_and_writes_nothing(
    tiny_model_dir, tmp_path, monkeypatch, runner
):
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "notes.jsonl", [{"text": "hi", "label_x": 1}])
    r = runner.invoke(
        app, ["train", "grpo", "--model", str(tiny_model_dir), "--data-path", "notes.jsonl", *TINY]
    )
    assert r.exit_code == 2, r.output
    error = next(x for x in r.output.splitlines() if x.startswith("error:"))
    assert "notes.jsonl' has no prompt column (its columns: text, label_x;" in error
    assert "data.prompt_column" in error and "data.answer_column" in error
    assert "Traceback" not in r.output
    assert not (tmp_path / "runs").exists()  # refused before anything was written


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--dataset", "arithmetic", "--data-path", "d.jsonl"], "generated and takes no path"),
        (["--dataset", "d.jsonl"], "a file on this machine is --data-path FILE"),
        (["--data-path", "d.jsonl", "--set", "data.eval_split=test"], "data.eval_path"),
    ],
)
def test_data_flags_that_disagree_are_refused_before_the_run(
    tmp_path, monkeypatch, runner, args, words
):
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "d.jsonl", [{"question": "a", "answer": 1}])
    r = runner.invoke(app, ["train", "grpo", *args])
    assert r.exit_code == 2 and words in r.output, r.output
    assert not (tmp_path / "runs").exists()


@pytest.mark.trainer
def test_a_run_on_its_own_reward_shows_that_reward_not_accuracy(
    tiny_model_dir, tmp_path, monkeypatch, runner
):
    """Trained only on digit_count, a run's step lines, summary, log, status and -o json
    lead with digit_count, held out before and after and per step; the built-in
    accuracy (a reward it was not trained for) is nowhere in them."""
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(
        app,
        ["train", "grpo", "--name", "own", "--model", str(tiny_model_dir), "--steps", "2", *TINY],
    )
    assert r.exit_code == 0, r.output
    steps = [x for x in r.stderr.splitlines() if x.startswith("step 2/2  ")]
    assert steps and "  digit_count " in steps[0] and "accuracy" not in steps[0]
    (held,) = [x for x in r.stdout.splitlines() if x.startswith("held-out ")]
    assert held.startswith("held-out digit_count ") and held.endswith("(n=2)")
    log = (tmp_path / "runs" / "own" / "train.log").read_text()
    assert "eval/final: reward " in log and " digit_count " in log
    assert "accuracy" not in log
    # #45 point 5: each save said with its step, size and seconds, the last in status
    assert re.search(r"checkpoint 2 saved \([\d.]+ [KMG]i?B\) in [\d.]+ s", log), log
    assert re.search(r"checkpoint 2 saved \(", r.stderr)

    r = runner.invoke(app, ["status", "own"])
    assert r.exit_code == 0, r.output
    shown = [x.strip() for x in r.stdout.splitlines()]
    assert any(x.startswith("eval/final") and " digit_count=" in x for x in shown)
    assert any(x.startswith("last step") and "digit_count=" in x for x in shown)
    assert any(
        re.match(r"checkpoint  2 \(saved [\d.]+ [KMG]i?B in [\d.]+ s\)", x) for x in shown
    ), shown
    assert not any("accuracy" in x for x in shown if x.startswith(("eval/", "last step")))
    r = runner.invoke(app, ["status", "own", "-o", "json"])
    info = json.loads(r.stdout)
    assert set(info["eval"]["final"]["rewards"]) == {"digit_count"}
    assert "rewards/digit_count/mean" in info["latest_metrics"]
