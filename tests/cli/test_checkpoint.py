"""``rlctl checkpoint-convert`` as a user runs it: a policy trained by ``rlctl train``
goes out as Hugging Face safetensors that transformers loads and runs exactly as the
trainer did; bad input is one error line and exit 2 with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlctl.cli.app import app

TINY = (
    "--prompts-per-step",
    "2",
    "-G",
    "2",
    "--max-new-tokens",
    "8",
    "--lr",
    "3e-2",
    "--eval-size",
    "0",
    "--set",
    'rewards=["tests.fakes.rewards.digit_count"]',
)


def test_help_shows_an_example(runner):
    r = runner.invoke(app, ["checkpoint-convert", "--help"])
    assert r.exit_code == 0
    assert "Example: rlctl checkpoint-convert" in r.stdout and "--verify" in r.stdout


class TestBadInput:
    """Each case: exit 2, one ``error:`` line (and its hint) on stderr, only the same
    error as JSON on stdout with -o json, and no DST or staging folder left."""

    def _run(self, runner, tmp_path: Path, *args: str):
        r = runner.invoke(app, ["checkpoint-convert", *args, "-o", "json"])
        assert r.exit_code == 2, r.output
        assert json.loads(r.stdout)["exit_code"] == 2
        lines = r.stderr.strip().splitlines()
        assert lines[0].startswith("error: ") and len(lines) <= 2
        assert "Traceback" not in r.output
        assert not list(tmp_path.glob("out*"))
        return lines[0]

    def test_not_a_checkpoint(self, runner, tmp_path):
        (tmp_path / "notes").mkdir()
        (tmp_path / "notes" / "a.txt").write_text("x")
        line = self._run(runner, tmp_path, str(tmp_path / "notes"), str(tmp_path / "out"))
        assert "is not a checkpoint" in line

    def test_unsupported_architecture_lists_supported(self, runner, tmp_path):
        pytest.importorskip("tokenizers")
        from tests.fakes.tiny_model import write_tiny_model

        src = write_tiny_model(tmp_path / "m", "llama")
        cfg = json.loads((src / "config.json").read_text())
        (src / "config.json").write_text(json.dumps({**cfg, "model_type": "phi3"}))
        r = runner.invoke(app, ["checkpoint-convert", str(src), str(tmp_path / "out")])
        assert r.exit_code == 2
        assert "'phi3' is not supported" in r.stderr
        from rlctl.core.families import FAMILIES

        # every registered family, by name (gemma4_text joined them: #52)
        assert "gemma3_text, gemma4_text, llama, mistral, qwen2, qwen3" in r.stderr
        assert f"supported model types: {', '.join(sorted(FAMILIES))}" in r.stderr

    def test_dst_exists(self, runner, tmp_path):
        pytest.importorskip("tokenizers")
        from tests.fakes.tiny_model import write_tiny_model

        src = write_tiny_model(tmp_path / "m", "llama")
        (tmp_path / "dst").mkdir()
        r = runner.invoke(app, ["checkpoint-convert", str(src), str(tmp_path / "dst")])
        assert r.exit_code == 2 and "already exists" in r.stderr and "--overwrite" in r.stderr
        assert list((tmp_path / "dst").iterdir()) == []

    def test_step_of_something_that_is_no_run(self, runner, tmp_path):
        pytest.importorskip("tokenizers")
        from tests.fakes.tiny_model import write_tiny_model

        src = write_tiny_model(tmp_path / "m", "llama")
        line = self._run(runner, tmp_path, str(src), str(tmp_path / "out"), "--step", "3")
        assert "--step applies to a run" in line

    def test_bad_dtype(self, runner, tmp_path):
        pytest.importorskip("tokenizers")
        from tests.fakes.tiny_model import write_tiny_model

        src = write_tiny_model(tmp_path / "m", "llama")
        r = runner.invoke(
            app, ["checkpoint-convert", str(src), str(tmp_path / "out"), "--dtype", "fp8"]
        )
        assert r.exit_code == 2 and "--dtype 'fp8'" in r.stderr
        assert not list(tmp_path.glob("out*"))


def _restore_run_policy(run: Path, source: Path):
    """The run's latest policy as the trainer restores it: the source model, then the
    Orbax checkpoint's ``model`` tree read by Orbax itself (not by the converter)."""
    import orbax.checkpoint as ocp
    from flax import nnx

    from rlctl.core.trainer import tunix_adapter as ta

    model, info = ta.load_model(source)
    step = max(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit())
    tree = ocp.PyTreeCheckpointer().restore(
        (run / "checkpoints" / str(step) / "default").absolute()
    )["model"]
    params = nnx.state(model, nnx.Param)
    pure = nnx.to_pure_dict(params)

    def like(t, ref):
        return {k: like(t[str(k)], v) for k, v in ref.items()} if isinstance(ref, dict) else t

    nnx.replace_by_pure_dict(params, like(tree, pure))
    nnx.update(model, params)
    return model, info, step


@pytest.mark.trainer
@pytest.mark.slow
def test_trained_policy_exported_to_hf_runs_the_same_in_transformers(tmp_path, monkeypatch, runner):
    pytest.importorskip("tunix")
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from safetensors.numpy import load_file

    from tests.core.checkpoints.test_transformers_parity import (
        hf_greedy,
        hf_logits,
        hf_model,
        jax_logits,
        prompt_ids,
        trainer_greedy,
    )
    from tests.fakes.tiny_model import write_tiny_model

    monkeypatch.chdir(tmp_path)
    src = write_tiny_model(tmp_path / "tiny", "llama")
    (tmp_path / "train.jsonl").write_text(
        "".join(
            json.dumps({"question": f"What is {a} + {a + 1}?", "answer": 2 * a + 1}) + "\n"
            for a in range(8)
        )
    )
    r = runner.invoke(
        app,
        [
            "train",
            "grpo",
            "--name",
            "pol",
            "--model",
            str(src),
            "--dataset",
            "jsonl",
            "--data-path",
            "train.jsonl",
            "--steps",
            "2",
            "--set",
            "checkpoint.interval=2",
            *TINY,
        ],
    )
    assert r.exit_code == 0, r.output

    r = runner.invoke(
        app, ["checkpoint-convert", "runs/pol", "exported", "--to", "hf", "--verify", "-o", "json"]
    )
    assert r.exit_code == 0, r.output
    result = json.loads(r.stdout)  # stdout is the JSON document alone
    assert (result["src_kind"], result["step"], result["verified"]) == ("run", 2, True)
    assert "tensors:" in r.stderr  # progress went to stderr
    out = tmp_path / "exported"
    for f in (
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors",
    ):
        assert (out / f).is_file(), f

    # the same policy by run name, by step, and from the step folder itself
    for src_arg, extra in (
        ("pol", ()),
        ("runs/pol", ("--step", "2")),
        ("runs/pol/checkpoints/2", ()),
    ):
        r = runner.invoke(
            app,
            [
                "checkpoint-convert",
                src_arg,
                f"again-{len(extra)}",
                "--overwrite",
                "-o",
                "json",
                *extra,
            ],
        )
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["step"] == 2
        assert (tmp_path / f"again-{len(extra)}" / "model.safetensors").read_bytes() == (
            out / "model.safetensors"
        ).read_bytes()
    r = runner.invoke(app, ["checkpoint-convert", "runs/pol", "x", "--step", "1"])
    assert r.exit_code == 2 and "no complete checkpoint 1" in r.stderr

    policy, info, step = _restore_run_policy(tmp_path / "runs" / "pol", src)
    assert step == 2
    before, after = (
        load_file(str(src / "model.safetensors")),
        load_file(str(out / "model.safetensors")),
    )
    assert any(not np.array_equal(before[k], after[k]) for k in before)  # it did train

    m = hf_model(out)
    ids = prompt_ids(out)
    ours, theirs = jax_logits(policy, ids), hf_logits(m, ids)
    np.testing.assert_allclose(ours, theirs, atol=2e-4, rtol=1e-3)
    assert torch.equal(torch.tensor(ours.argmax(-1)), torch.tensor(theirs.argmax(-1)))
    assert trainer_greedy(policy, info, out, 8) == hf_greedy(m, ids, 8)


@pytest.mark.trainer
@pytest.mark.parametrize("family", ["qwen3", "gemma3_text"])
def test_train_starts_from_a_trainer_folder(tmp_path, monkeypatch, runner, family):
    """``--to trainer`` output is a model.source (converted once, restored by Orbax at
    every start), and the new families train end to end through ``rlctl train``."""
    pytest.importorskip("tunix")
    from tests.fakes.tiny_model import write_tiny_model

    monkeypatch.chdir(tmp_path)
    src = write_tiny_model(tmp_path / "tiny", family)
    r = runner.invoke(app, ["checkpoint-convert", str(src), "conv", "--to", "trainer"])
    assert r.exit_code == 0, r.output
    assert not list((tmp_path / "conv").glob("*.safetensors"))
    (tmp_path / "train.jsonl").write_text(
        "".join(
            json.dumps({"question": f"What is {a} + 1?", "answer": a + 1}) + "\n" for a in range(4)
        )
    )
    r = runner.invoke(
        app,
        [
            "train",
            "grpo",
            "--name",
            "fromconv",
            "--model",
            "conv",
            "--dataset",
            "jsonl",
            "--data-path",
            "train.jsonl",
            "--steps",
            "1",
            "-o",
            "json",
            *TINY,
        ],
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["phase"] == "completed"


@pytest.mark.slow
def test_killed_conversion_leaves_no_dst_and_the_rerun_resumes(tmp_path):
    """SIGKILL mid-conversion (no cleanup runs at all): DST does not exist, and the
    same command again skips the arrays already written, then verifies."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pytest.importorskip("tensorstore")
    pytest.importorskip("tokenizers")
    from rlctl.core.checkpoints.convert import PROGRESS
    from rlctl.core.checkpoints.places import PARTIAL
    from tests.fakes.tiny_model import write_tiny_model

    src = write_tiny_model(
        tmp_path / "m", "llama", layers=16, hidden=512, heads=8, kv_heads=4, ffn=2048
    )  # ~240 MB: a few seconds to convert
    dst, progress = tmp_path / "out", tmp_path / f"out{PARTIAL}" / PROGRESS
    cmd = [
        sys.executable,
        "-m",
        "rlctl",
        "checkpoint-convert",
        str(src),
        str(dst),
        "--to",
        "trainer",
        "-o",
        "json",
    ]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None:
        if (
            progress.is_file()
            and len(json.loads(progress.read_text() or "{}").get("done", [])) >= 5
        ):
            break
        time.sleep(0.005)
    assert p.poll() is None, "finished before it could be killed"
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert not dst.exists()
    r = subprocess.run([*cmd, "--verify"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["resumed"] >= 5 and result["verified"] is True
    assert not (tmp_path / f"out{PARTIAL}").exists()
