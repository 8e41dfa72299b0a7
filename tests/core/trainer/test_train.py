"""End-to-end runs of the trainer on a tiny random Llama (CPU, seconds per run)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.sigkill import kill_when

pytest.importorskip("tunix")
pytestmark = pytest.mark.trainer

REPO = Path(__file__).resolve().parents[3]
TIMING = {"step_seconds", "rollout_seconds", "tokens_per_s"}


def tiny_args(model: Path, root: Path, name: str, algo: str = "grpo", *extra: str) -> list[str]:
    return [
        "train",
        algo,
        "--model",
        str(model),
        "--runs-dir",
        str(root),
        "--name",
        name,
        "--eval-size",
        "4",
        "--prompts-per-step",
        "2",
        "-G",
        "4",
        "--max-new-tokens",
        "12",
        "--lr",
        "3e-3",
        "--set",
        'rewards=["tests.fakes.rewards.digit_count"]',
        "--set",
        "eval.batch_size=4",
        *extra,
    ]


def rlctl(*args: str, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "RLCTL_CACHE": os.environ.get("RLCTL_CACHE", "")}
    return subprocess.run(
        [sys.executable, "-m", "rlctl", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        **kw,
    )


def metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def in_process(model: Path, root: Path, name: str, algo: str, *extra: str) -> list[dict]:
    from typer.testing import CliRunner

    from rlctl.cli.app import app

    result = CliRunner().invoke(app, tiny_args(model, root, name, algo, *extra))
    assert result.exit_code == 0, result.output
    return metrics(root / name)


class TestLocalRun:
    def test_run_writes_the_whole_layout(self, tiny_model_dir, tmp_path):
        rows = in_process(
            tiny_model_dir,
            tmp_path,
            "full",
            "grpo",
            "--steps",
            "3",
            "--set",
            "checkpoint.interval=2",
            "--set",
            "eval.interval=2",
            "-o",
            "json",
        )
        run = tmp_path / "full"
        assert [r["step"] for r in rows] == [1, 2, 3]
        assert {
            "loss",
            "reward_mean",
            "reward_min",
            "reward_max",
            "format_rate",
            "kl",
            "grad_norm",
            "completion_length",
        } <= set(rows[0])
        assert any(r["grad_norm"] > 0 for r in rows)  # the tiny model gets a learning signal
        status = json.loads((run / "status.json").read_text())
        assert (status["phase"], status["step"], status["latest_checkpoint"]) == ("completed", 3, 3)
        assert status["engine"] == "vanilla"  # rollout.engine=auto on CPU
        from rlctl.core.trainer.model.precision import choose

        assert status["precision"] == choose("auto", "float32", "cpu").dtype  # this CPU's
        assert status["sampling_precision"] == choose("auto", "float32", "cpu").sampling
        assert "engine_logp_diff" not in rows[0]  # vLLM's check only
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["2", "3"]
        for which in ("baseline", "step-2", "final"):
            ev = json.loads((run / "eval" / f"{which}.json").read_text())
            assert ev["n"] == 4 and ev["greedy"] and len(ev["samples"]) == 4
            assert all(isinstance(x["correct"], bool) for x in ev["samples"])
        assert list((run / "tensorboard").glob("events.out.tfevents.*"))
        assert (run / "spec.yaml").read_text().startswith("name: full")

    def test_name_in_use_is_refused(self, tiny_model_dir, tmp_path):
        from typer.testing import CliRunner

        from rlctl.cli.app import app

        (tmp_path / "taken").mkdir()
        (tmp_path / "taken" / "spec.yaml").write_text("name: taken\n")
        r = CliRunner().invoke(app, tiny_args(tiny_model_dir, tmp_path, "taken"))
        assert r.exit_code == 4
        assert "already exists" in r.output and "rlctl resume taken" in r.output


class TestBfloat16:
    def test_a_bfloat16_model_trains_through_its_checkpoints(self, tiny_model_dir, tmp_path):
        """``model.dtype=bfloat16`` used to crash at the first update: the shared-prefix
        KV cache was float32 while the model wrote bfloat16 keys and values."""
        rows = in_process(
            tiny_model_dir,
            tmp_path,
            "bf16",
            "grpo",
            "--steps",
            "2",
            "--set",
            "model.dtype=bfloat16",
            "--set",
            "checkpoint.interval=1",
        )
        assert [r["step"] for r in rows] == [1, 2]
        assert all(isinstance(r["loss"], float) and r["loss"] == r["loss"] for r in rows)
        status = json.loads((tmp_path / "bf16" / "status.json").read_text())
        assert status["phase"] == "completed" and status["latest_checkpoint"] == 2

    def test_bfloat16_matmuls_train_checkpoint_and_resume(self, tiny_model_dir, tmp_path):
        """``model.compute_dtype=bfloat16`` is opt-in on a CPU (``auto`` keeps float32
        there): the whole run with it, not only its layers (test_mixed.py), says so,
        records it and resumes in it."""
        name = "mixed"
        r = rlctl(
            *tiny_args(
                tiny_model_dir,
                tmp_path,
                name,
                "grpo",
                "--steps",
                "1",
                "--set",
                "model.compute_dtype=bfloat16",
            )
        )
        assert r.returncode == 0, r.stderr
        assert (
            "precision: bfloat16 matmuls summed in float32, float32 weights and optimizer "
            "(model.compute_dtype=bfloat16)" in r.stderr
        ), r.stderr
        r = rlctl("resume", name, "--runs-dir", str(tmp_path), "--steps", "2")
        assert r.returncode == 0, r.stderr
        assert "precision: bfloat16 matmuls" in r.stderr, r.stderr
        rows = metrics(tmp_path / name)
        assert [x["step"] for x in rows] == [1, 2]
        assert all(x["loss"] == x["loss"] and x["grad_norm"] > 0 for x in rows)
        status = json.loads((tmp_path / name / "status.json").read_text())
        assert (status["phase"], status["precision"]) == ("completed", "bfloat16")

    def test_float32_updates_sample_in_bfloat16(self, tiny_model_dir, tmp_path):
        """The split that ``auto`` picks on a CPU with native bfloat16, asked for on any
        CPU: said, recorded, shown by ``status``, and the update still learns."""
        name = "split"
        r = rlctl(
            *tiny_args(
                tiny_model_dir,
                tmp_path,
                name,
                "grpo",
                "--steps",
                "1",
                "--set",
                "model.compute_dtype=float32",
                "--set",
                "rollout.compute_dtype=bfloat16",
            )
        )
        assert r.returncode == 0, r.stderr
        assert (
            "precision: float32 matmuls (model.compute_dtype=float32); sampling reads "
            "bfloat16 (rollout.compute_dtype=bfloat16)" in r.stderr
        ), r.stderr
        status = json.loads((tmp_path / name / "status.json").read_text())
        assert (status["precision"], status["sampling_precision"]) == ("float32", "bfloat16")
        assert metrics(tmp_path / name)[0]["grad_norm"] > 0
        shown = rlctl("status", name, "--runs-dir", str(tmp_path))
        assert "precision   float32 matmuls (sampling bfloat16)" in shown.stdout, shown.stdout

    def test_adam_moments_and_log_probs_are_float32(self, tiny_model_dir):
        import jax
        import jax.numpy as jnp
        from flax import nnx

        from rlctl.core.config.models import TrainingSpec
        from rlctl.core.trainer import tunix_adapter as ta
        from rlctl.core.trainer.update.step import make_optimizer

        model, info = ta.load_model(tiny_model_dir, "bfloat16")
        params = jax.tree.leaves(nnx.state(model, nnx.Param))
        assert {x.dtype for x in params} == {jnp.dtype(jnp.bfloat16)}
        moments = [
            x
            for x in jax.tree.leaves(nnx.state(make_optimizer(model, TrainingSpec())))
            if x.ndim > 0
        ]
        assert len(moments) == 2 * len(params)  # mu and nu of every parameter
        assert {x.dtype for x in moments} == {jnp.dtype(jnp.float32)}
        prompts, comps = jnp.ones((1, 4), jnp.int32), jnp.ones((2, 3), jnp.int32)
        logps, _ = ta.shared_prefix_logps(
            model, prompts, comps, group=2, pad_id=0, temperature=1.0, info=info
        )
        assert logps.dtype == jnp.float32


class TestGspo:
    def test_equals_grpo_with_one_iteration(self, tiny_model_dir, tmp_path):
        one = (
            "--steps",
            "1",
            "--set",
            "training.num_iterations=1",
            "--set",
            "training.epsilon=0.2",
            "--set",
            "training.epsilon_high=0.2",
            "--eval-size",
            "0",
        )
        grpo = in_process(tiny_model_dir, tmp_path, "g1", "grpo", *one)
        gspo = in_process(tiny_model_dir, tmp_path, "s1", "gspo", *one)
        assert grpo[0]["loss"] == pytest.approx(gspo[0]["loss"], abs=1e-7)

    def test_differs_from_grpo_with_two_iterations(self, tiny_model_dir, tmp_path):
        two = ("--steps", "1", "--set", "training.num_iterations=2", "--eval-size", "0")
        grpo = in_process(tiny_model_dir, tmp_path, "g2", "grpo", *two)
        gspo = in_process(tiny_model_dir, tmp_path, "s2", "gspo", *two)
        assert grpo[0]["reward_mean"] == gspo[0]["reward_mean"]  # same data and samples
        assert abs(grpo[0]["loss"] - gspo[0]["loss"]) > 1e-6


class TestResume:
    def test_sigkill_then_resume_reproduces_an_uninterrupted_run(self, tiny_model_dir, tmp_path):
        common = ("--steps", "6", "--set", "checkpoint.interval=2", "--seed", "3")
        whole = rlctl(*tiny_args(tiny_model_dir, tmp_path, "whole", "grpo", *common))
        assert whole.returncode == 0, whole.stderr

        ckpt = tmp_path / "killed" / "checkpoints" / "2"
        kill_when(
            tiny_args(tiny_model_dir, tmp_path, "killed", "grpo", *common),
            ckpt.is_dir,
            {**os.environ, "PYTHONPATH": str(REPO)},
        )
        done = [r["step"] for r in metrics(tmp_path / "killed")]
        assert done and max(done) < 6, "the run finished before it was killed"

        resumed = rlctl("resume", "killed", "--runs-dir", str(tmp_path), "-o", "json")
        assert resumed.returncode == 0, resumed.stderr
        assert json.loads(resumed.stdout)["phase"] == "completed"
        assert metrics(tmp_path / "killed") == metrics(tmp_path / "whole")
        ev = [
            json.loads((tmp_path / n / "eval" / "final.json").read_text())["accuracy"]
            for n in ("killed", "whole")
        ]
        assert ev[0] == ev[1]

    def test_sigkill_during_a_background_save_resumes_from_the_previous_checkpoint(self, tmp_path):
        """The accelerators' row saves in the background (RLCTL_NUMERICS=gpu, here on
        the CPU): killed while checkpoint 4 is being written (its temporary folder on
        disk, the run already at step 5), the run resumes from checkpoint 2, the
        complete one, and ends with the uninterrupted run's metrics."""
        from tests.fakes.tiny_model import write_tiny_llama

        # wide enough that a save takes a moment to write (about 50 MB of state)
        model = write_tiny_llama(tmp_path / "wide", hidden=256, ffn=1024, layers=4)
        env = {**os.environ, "PYTHONPATH": str(REPO), "RLCTL_NUMERICS": "gpu"}
        common = ("--steps", "6", "--set", "checkpoint.interval=2", "--seed", "3")

        def run(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, "-m", "rlctl", *args],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )

        whole = run(*tiny_args(model, tmp_path, "whole", "grpo", *common))
        assert whole.returncode == 0, whole.stderr
        assert re.search(
            r"checkpoint 4 saved \([\d.]+ [KMG]i?B\) in the background in ", whole.stderr
        ), whole.stderr
        ckpts = tmp_path / "killed" / "checkpoints"

        def writing_4() -> bool:
            names = [p.name for p in ckpts.iterdir()] if ckpts.is_dir() else []
            return any(n.startswith("4.orbax-checkpoint-tmp") for n in names)

        kill_when(tiny_args(model, tmp_path, "killed", "grpo", *common), writing_4, env)
        assert not (ckpts / "4").exists()
        resumed = run("resume", "killed", "--runs-dir", str(tmp_path), "-o", "json")
        assert resumed.returncode == 0, resumed.stderr
        assert "resumed from checkpoint 2" in resumed.stderr, resumed.stderr
        assert metrics(tmp_path / "killed") == metrics(tmp_path / "whole")
        ev = [
            json.loads((tmp_path / n / "eval" / "final.json").read_text())["accuracy"]
            for n in ("killed", "whole")
        ]
        assert ev[0] == ev[1]
        assert sorted(p.name for p in ckpts.iterdir()) == ["4", "6"]  # keep: 2

    def test_ctrl_c_during_a_background_save_waits_for_it(self, tmp_path):
        """Ctrl-C while checkpoint 4 is being written in the background: the stop waits
        for it (complete, its manifest intact), checkpoints the last completed step,
        exits 130, and resume completes the run as an uninterrupted one would."""
        from rlctl.core.store.manifest import verify
        from tests.fakes.tiny_model import write_tiny_llama

        model = write_tiny_llama(tmp_path / "wide", hidden=256, ffn=1024, layers=4)
        env = {**os.environ, "PYTHONPATH": str(REPO), "RLCTL_NUMERICS": "gpu"}
        common = ("--steps", "8", "--set", "checkpoint.interval=4", "--seed", "5")
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlctl", *tiny_args(model, tmp_path, "bg", "grpo", *common)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        ckpts = tmp_path / "bg" / "checkpoints"
        deadline = time.time() + 300
        while (
            time.time() < deadline
            and proc.poll() is None
            and not (
                ckpts.is_dir()
                and any(p.name.startswith("4.orbax-checkpoint-tmp") for p in ckpts.iterdir())
            )
        ):
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 130, err
        assert "stopping: waiting for checkpoint 4 to be written" in err, err
        assert verify(ckpts / "4") is None
        done = json.loads((tmp_path / "bg" / "status.json").read_text())["step"]
        assert sorted(p.name for p in ckpts.iterdir()) == sorted({"4", str(done)})
        resumed = subprocess.run(
            [sys.executable, "-m", "rlctl", "resume", "bg", "--runs-dir", str(tmp_path)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert resumed.returncode == 0, resumed.stderr
        whole = subprocess.run(
            [sys.executable, "-m", "rlctl", *tiny_args(model, tmp_path, "whole", "grpo", *common)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert whole.returncode == 0, whole.stderr
        assert metrics(tmp_path / "bg") == metrics(tmp_path / "whole")

    @pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
    def test_ctrl_c_or_sigterm_stops_cleanly_and_resumes(self, tiny_model_dir, tmp_path, sig):
        """SIGTERM (kill, systemd, docker stop) is handled as Ctrl-C: exit 130, status
        ``interrupted``, no partial checkpoint left, and resume completes."""
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rlctl",
                *tiny_args(
                    tiny_model_dir,
                    tmp_path,
                    "ctrlc",
                    "grpo",
                    "--steps",
                    "40",
                    "--set",
                    "checkpoint.interval=2",
                ),
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # a shell without job control starts background jobs with SIGINT ignored, and an
            # ignored SIGINT survives exec: give the child the disposition a terminal gives
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        ckpt = tmp_path / "ctrlc" / "checkpoints" / "2"
        deadline = time.time() + 300
        while not ckpt.is_dir() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err
        assert "interrupted" in err and "rlctl resume ctrlc" in err and "Traceback" not in err
        status = json.loads((tmp_path / "ctrlc" / "status.json").read_text())
        assert status["phase"] == "interrupted" and status["latest_checkpoint"] >= 2
        st = rlctl("status", "ctrlc", "--runs-dir", str(tmp_path), "-o", "json")
        assert json.loads(st.stdout)["phase"] == "interrupted"
        left = [p.name for p in (tmp_path / "ctrlc" / "checkpoints").iterdir()]
        assert not [n for n in left if "tmp" in n], left

    def test_resume_of_a_completed_run_is_refused(self, tiny_model_dir, tmp_path):
        in_process(tiny_model_dir, tmp_path, "done", "grpo", "--steps", "1", "--eval-size", "0")
        r = rlctl("resume", "done", "--runs-dir", str(tmp_path))
        assert r.returncode == 4 and "already completed" in r.stderr
        assert "Traceback" not in r.stderr


LONG = "What is 9 + 9? Think about it carefully. Think about it carefully."  # ~137 tokens


def ctrl_c_at(monkeypatch, at: int) -> None:
    """Ctrl-C as the trainer starts step ``at`` (0-based), in this process."""
    from rlctl.core.trainer.run import loop

    real = loop.Trainer.step

    def step(self, k: int):
        if k == at:
            raise KeyboardInterrupt
        return real(self, k)

    monkeypatch.setattr(loop.Trainer, "step", step)


class TestPromptWidth:
    def test_the_longest_prompt_of_the_data_sets_every_step_and_the_resumed_run(
        self, tiny_model_dir, tmp_path, monkeypatch
    ):
        """The long prompt is drawn at step 1 only, yet every step, and every step of a
        run resumed at step 2, pads to its width: one compiled shape for the run."""
        from typer.testing import CliRunner

        from rlctl.cli.app import app
        from rlctl.core.config.models import DataSpec
        from rlctl.core.trainer.data import load_source
        from rlctl.core.trainer.rollout import rollout
        from rlctl.core.trainer.run import loop

        data = tmp_path / "train.jsonl"
        rows = [{"question": f"What is {a} + {a + 1}?", "answer": 2 * a + 1} for a in range(1, 8)]
        data.write_text("\n".join(json.dumps(r) for r in [*rows, {"question": LONG, "answer": 18}]))
        src = load_source(DataSpec(name="jsonl", path=str(data), seed=7), 0)
        assert [any(p.question == LONG for p in src.batch(k, 2)) for k in range(4)] == [
            False,
            True,
            False,
            False,
        ], "data seed 7 no longer draws the long prompt at step 1"

        widths: list[int] = []
        sample = rollout.Rollout.sample

        def recording(self, prompts, width, seed, greedy=False):
            widths.append(width)
            return sample(self, prompts, width, seed, greedy)

        monkeypatch.setattr(rollout.Rollout, "sample", recording)
        common = (
            "--steps",
            "4",
            "--eval-size",
            "0",
            "--set",
            "checkpoint.interval=2",
            "--set",
            "data.name=jsonl",
            "--data-path",
            str(data),
            "--set",
            "data.seed=7",
        )
        whole = in_process(tiny_model_dir, tmp_path, "whole", "grpo", *common)
        assert len(widths) == 4 and len(set(widths)) == 1, widths
        assert widths[0] >= 137  # LONG, drawn at step 1 only

        real_step = loop.Trainer.step
        ctrl_c_at(monkeypatch, 2)  # after the checkpoint at step 2
        r = CliRunner().invoke(app, tiny_args(tiny_model_dir, tmp_path, "cut", "grpo", *common))
        assert r.exit_code == 130, r.output
        assert [row["step"] for row in metrics(tmp_path / "cut")] == [1, 2]
        monkeypatch.setattr(loop.Trainer, "step", real_step)
        r = CliRunner().invoke(app, ["resume", "cut", "--runs-dir", str(tmp_path)])
        assert r.exit_code == 0, r.output
        assert metrics(tmp_path / "cut") == whole
        assert len(set(widths)) == 1, widths

    def test_a_prompt_longer_than_the_limit_is_refused_before_training(
        self, tiny_model_dir, tmp_path
    ):
        data = tmp_path / "train.jsonl"
        rows = [{"question": f"What is {a} + 1?", "answer": a + 1} for a in range(8)]
        data.write_text("\n".join(json.dumps(r) for r in [*rows, {"question": LONG, "answer": 18}]))
        r = rlctl(
            *tiny_args(
                tiny_model_dir,
                tmp_path,
                "long",
                "grpo",
                "--eval-size",
                "0",
                "--set",
                "data.name=jsonl",
                "--data-path",
                str(data),
                "--set",
                "rollout.max_prompt_tokens=128",
            )
        )
        assert r.returncode == 2, r.stderr
        assert "1 of the data's 9 prompts are longer than rollout.max_prompt_tokens=128" in r.stderr
        assert "Traceback" not in r.stderr
        assert not (tmp_path / "long").exists()  # refused in preflight: no run folder


class TestBaselineOnResume:
    def test_a_lost_baseline_is_re_created_from_the_initial_weights(
        self, tiny_model_dir, tmp_path, monkeypatch
    ):
        """eval/ deleted, resume from checkpoint 2: the baseline written again must be
        the one of the untrained model, not of the restored step-2 weights."""
        import shutil

        from typer.testing import CliRunner

        from rlctl.cli.app import app
        from rlctl.core.trainer.run import loop

        real_step = loop.Trainer.step
        ctrl_c_at(monkeypatch, 2)  # after the checkpoint at step 2
        r = CliRunner().invoke(
            app,
            tiny_args(
                tiny_model_dir,
                tmp_path,
                "lost",
                "grpo",
                "--steps",
                "4",
                "--set",
                "checkpoint.interval=2",
            ),
        )
        assert r.exit_code == 130, r.output
        run = tmp_path / "lost"
        original = json.loads((run / "eval" / "baseline.json").read_text())
        shutil.rmtree(run / "eval")
        monkeypatch.setattr(loop.Trainer, "step", real_step)
        r = CliRunner().invoke(app, ["resume", "lost", "--runs-dir", str(tmp_path)])
        assert r.exit_code == 0, r.output
        again = json.loads((run / "eval" / "baseline.json").read_text())
        original.pop("seconds"), again.pop("seconds")
        assert again == original
        final = json.loads((run / "eval" / "final.json").read_text())
        trained = [s["completion"] for s in final["samples"]]
        assert trained != [s["completion"] for s in again["samples"]], (
            "training changed no completion: the test cannot tell the weights apart"
        )


def test_prompt_width_is_a_function_of_the_batch_alone():
    from rlctl.core.trainer.rollout.rollout import prompt_width

    assert prompt_width(112, 99) == 112  # within the probe
    assert prompt_width(112, 137) == 144  # a longer batch gets its own bucket
    assert prompt_width(112, 113) == 128


def test_an_accelerators_row_compiles_its_sampler_and_checks_memory_before_step_1(
    tiny_model_dir, tmp_path, monkeypatch
):
    """On an accelerator (its numerics row; here RLCTL_NUMERICS=gpu on the CPU) the
    rollout's and the eval's sampler compile with the update, before the first step, and
    the run says what the device holds at their peaks; step 1 compiles nothing of its
    own (it runs the precompiled programs)."""
    monkeypatch.setenv("RLCTL_NUMERICS", "gpu")
    r = rlctl(*tiny_args(tiny_model_dir, tmp_path, "acc", "grpo", "--steps", "2"))
    assert r.returncode == 0, r.stderr
    log = (tmp_path / "acc" / "train.log").read_text().splitlines()
    fit = next(i for i, ln in enumerate(log) if "device memory: fits: " in ln)
    assert "per machine, this machine" in log[fit]
    training = next(i for i, ln in enumerate(log) if "training acc: steps 1..2" in ln)
    # compiled, or loaded from the compilation cache where an earlier test compiled it
    samplers = [
        i
        for i, ln in enumerate(log)
        if "compiled the sampler" in ln
        or ("loaded the sampler" in ln and "from the compilation cache" in ln)
    ]
    assert len(samplers) == 2 and max(samplers) < fit < training, "\n".join(log)  # rollout, eval
