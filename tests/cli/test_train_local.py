"""``rlctl train`` on this machine as a user first types it: from a project folder, with
the default run store ``./runs`` (a relative path) and relative model and data paths."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from rlctl.cli.app import app

pytest.importorskip("tunix")

TINY = ("--prompts-per-step", "2", "-G", "2", "--max-new-tokens", "8", "--lr", "3e-3",
        "--eval-size", "2", "--set", "eval.batch_size=2",
        "--set", 'rewards=["tests.fakes.rewards.digit_count"]')


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def same_path(a: str, b: Path) -> bool:
    return Path(a).is_absolute() and Path(a).resolve() == b.resolve()


@pytest.mark.trainer
def test_relative_store_trains_through_a_checkpoint_resumes_and_reports(
        tiny_model_dir, tmp_path, monkeypatch, runner):
    """Orbax >= 0.12.8 refuses a relative checkpoint path: ``./runs`` used to crash at
    the first checkpoint. Stopped after one, the run resumes to the end from ./runs."""
    from rlctl.core.trainer import loop

    work = tmp_path / "project"
    work.mkdir()
    monkeypatch.chdir(work)
    write_jsonl(work / "train.jsonl",
                [{"question": f"What is {a} + {a + 1}?", "answer": 2 * a + 1} for a in range(12)])
    model = os.path.relpath(tiny_model_dir, work)  # a local folder, given relative
    real_step = loop.Trainer.step

    def ctrl_c_at_step_2(self, k: int):
        if k == 2:  # after the checkpoint at step 2
            raise KeyboardInterrupt
        return real_step(self, k)

    monkeypatch.setattr(loop.Trainer, "step", ctrl_c_at_step_2)
    r = runner.invoke(app, ["train", "grpo", "--name", "rel", "--model", model,
                            "--dataset", "jsonl", "--data-path", "train.jsonl", "--steps", "3",
                            "--set", "checkpoint.interval=2", *TINY])
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
        "==== attempt 1: rlctl train rel", "run interrupted after step 2; latest checkpoint 2",
        "==== attempt 2: rlctl resume rel", "run completed: 3 steps"]
    assert log.index("restoring checkpoint 2") < log.index(
        "step 3: compiling and running (the first step is slower)") < log.index(
        next(x for x in log if x.startswith("step 3/3  ")))

    r = runner.invoke(app, ["status", "rel", "-o", "json"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.stdout)
    assert (info["phase"], info["step"], info["latest_checkpoint"]) == ("completed", 3, 3)


def test_a_bad_data_row_exits_2_naming_file_and_row(tiny_model_dir, tmp_path, monkeypatch,
                                                   runner):
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "gsm8k.jsonl", [{"question": "a", "answer": "so #### 4"},
                                           {"question": "b", "answer": "so #### ?"}])
    r = runner.invoke(app, ["train", "grpo", "--model", str(tiny_model_dir), "--dataset",
                            "gsm8k", "--data-path", "gsm8k.jsonl", *TINY])
    assert r.exit_code == 2, r.output
    assert "gsm8k.jsonl:2" in r.output and "no number after '####'" in r.output
    assert "Traceback" not in r.output
    assert not (tmp_path / "runs").exists()  # refused before anything was written
