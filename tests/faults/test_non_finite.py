"""#47 point 1, finite or stopped: a reward that returns 1e308 or NaN, or a model whose
loss goes NaN, stops the run at that step with one line naming the value and its
source; status says why; the last finite checkpoint is kept and nothing non-finite is
saved; a resume after the fix continues from it; checkpoint-convert refuses to export
a checkpoint holding NaN unless asked."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.faults.conftest import metrics, one_error

pytestmark = pytest.mark.trainer

# a reward that turns bad once the file named by $BAD_AFTER exists (a checkpoint of
# the run: so the trial call and the first steps see good values)
REWARD = """
import os

def flaky(completion, gold):
    if os.path.exists(os.environ.get("BAD_AFTER", "/nonexistent")):
        return float(os.environ["BAD_VALUE"])
    return sum(ch.isdigit() for ch in completion) / 10.0
"""


def _steps(run: Path) -> list[int]:
    return [m["step"] for m in metrics(run)] if (run / "metrics.jsonl").exists() else []


def _checkpoints(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir())


@pytest.mark.parametrize("value", ["1e308", "nan"])
def test_a_reward_gone_bad_stops_the_run_at_that_step_and_resume_continues(
    cli, tiny_args, tmp_path, value
):
    (tmp_path / "r.py").write_text(REWARD)
    root = tmp_path / "runs"
    run = root / "bad"
    args = tiny_args(
        root,
        "bad",
        "--steps",
        "4",
        "--set",
        "checkpoint.interval=1",
        "--set",
        "checkpoint.keep=5",
        "--set",
        'rewards=["./r.py:flaky"]',
    )
    r = cli(*args, env={"BAD_AFTER": str(run / "checkpoints" / "2"), "BAD_VALUE": value})
    line = one_error(
        r,
        2,
        "step 3:",
        f"reward '{tmp_path}/r.py:flaky' returned",
        "the run stopped before its update",
    )
    assert ("outside the range" in line) if value == "1e308" else ("not a finite" in line)
    assert "'rlctl resume bad' continues from checkpoint 2" in r.stderr
    status = json.loads((run / "status.json").read_text())
    assert status["phase"] == "failed" and "returned" in status["error"]
    assert status["latest_checkpoint"] == 2 and status["step"] == 2
    assert _checkpoints(run) == ["1", "2"] and _steps(run) == [1, 2]
    s = cli("status", "bad", "--runs-dir", str(root))
    assert "step 3: reward" in s.stdout, s.stdout

    r = cli("resume", "bad", "--runs-dir", str(root))  # the reward fixed: $BAD_AFTER unset
    assert r.returncode == 0, r.stderr
    assert _steps(run) == [1, 2, 3, 4]
    assert json.loads((run / "status.json").read_text())["phase"] == "completed"


def test_a_reward_out_of_range_on_its_trial_call_is_refused_before_the_run(
    cli, tiny_args, tmp_path
):
    (tmp_path / "r.py").write_text("def huge(completion, gold):\n    return 1e308\n")
    r = cli(*tiny_args(tmp_path / "runs", "r", "--set", 'rewards=["./r.py:huge"]'))
    one_error(r, 2, "returned 1e+308 (float)", "outside the range")
    assert not (tmp_path / "runs").exists()


def _nan_model(src: Path, dst: Path) -> Path:
    """The tiny model with one weight of its last norm made NaN: its loss is NaN."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    name = next(n for n in tensors if n.endswith("norm.weight"))
    tensors[name] = tensors[name].copy()
    tensors[name][0] = float("nan")
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_a_loss_gone_nan_stops_the_run_at_that_step_and_saves_nothing(
    cli, tiny_args, tiny_model_dir, tmp_path
):
    model = _nan_model(tiny_model_dir, tmp_path / "nan-model")
    root = tmp_path / "runs"
    r = cli(
        *tiny_args(
            root,
            "nan",
            "--steps",
            "3",
            "--set",
            "checkpoint.interval=1",
            "--eval-size",
            "0",
            model=model,
        )
    )
    one_error(r, 1, "step 1: the loss is nan (not finite)", "no checkpoint was saved yet")
    run = root / "nan"
    assert not (run / "checkpoints").exists() or _checkpoints(run) == []
    assert _steps(run) == []
    status = json.loads((run / "status.json").read_text())
    assert status["phase"] == "failed" and "the loss is nan" in status["error"]


def _nan_checkpoint(run: Path) -> None:
    """Checkpoint 3 of ``run``: its checkpoint 2 with one weight NaN, saved by Orbax
    (what an older rlctl saved once its loss had gone NaN)."""
    import numpy as np
    import orbax.checkpoint as ocp

    with ocp.CheckpointManager(run / "checkpoints") as manager:
        state = manager.restore(2, args=ocp.args.StandardRestore())
        leaf = state["model"]["final_norm"]["w"]
        state["model"]["final_norm"]["w"] = np.full(np.shape(leaf), np.nan, np.float32)
        manager.save(3, args=ocp.args.StandardSave(state))
        manager.wait_until_finished()


def test_checkpoint_convert_refuses_a_nan_checkpoint_unless_asked(cli, store, tmp_path):
    run = store / "ok"
    _nan_checkpoint(run)
    r = cli("checkpoint-convert", str(run), str(tmp_path / "hf"))
    one_error(r, 2, "checkpoint 3", "non-finite", "model.norm.weight")
    assert "--step N" in r.stderr and "--allow-non-finite" in r.stderr
    assert not (tmp_path / "hf").exists() and not list(tmp_path.glob("hf*"))
    r = cli("checkpoint-convert", str(run), str(tmp_path / "hf2"), "--step", "2")
    assert r.returncode == 0, r.stderr
    r = cli("checkpoint-convert", str(run), str(tmp_path / "hf3"), "--allow-non-finite")
    assert r.returncode == 0, r.stderr
