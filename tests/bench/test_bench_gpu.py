"""bench/bench_gpu.py: a whole run on the CPU with the tiny model, its figures, and the TRL
side's plumbing with a stand-in for bench/trl_grpo_child.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import bench_gpu as bg

REPO = Path(__file__).resolve().parents[2]


class TestWorkloads:
    def test_named_and_custom_shapes(self):
        assert bg.workload("default") == bg.Workload("default", 2, 8, 48, eval_size=None)
        assert (bg.workload("16x8x256").prompts, bg.workload("16x8x256").new_tokens) == (16, 256)
        one_b = bg.workload("1b")
        assert one_b.generated and one_b.label == "2x8x48" and one_b.eval_size == 0
        custom = bg.workload("3x4x5")
        assert (custom.prompts, custom.group, custom.new_tokens, custom.generated) == (
            3,
            4,
            5,
            None,
        )
        for bad in ("big", "2x8", "0x8x48", "2x8x48x1"):
            with pytest.raises(Exception, match="PxGxL"):
                bg.workload(bad)

    def test_the_1b_shape_has_the_tokenizers_vocabulary(self):
        from bench import bench_memory as bm

        shape = bg.one_b_shape()
        assert shape["vocab_size"] == 49152 and shape["hidden_size"] == 2048
        params = bm.param_count(bm.hf_config(shape, "float32"))
        assert 1.06e9 < params < 1.08e9  # the H200 run's 1.07B (docs/gpu.md)

    def test_the_default_run_keeps_its_evals_the_others_have_none(self, tmp_path):
        default = bg.rlctl_args(bg.NAMED["default"], None, 20, "float32", None, [], tmp_path)
        assert "--eval-size" not in default and "--model" not in default
        assert default[default.index("-G") + 1] == "8"
        assert default[default.index("--max-new-tokens") + 1] == "48"
        other = bg.rlctl_args(
            bg.workload("4x8x256"), "/m", 3, "bfloat16", None, ["training.remat=true"], tmp_path
        )
        assert other[other.index("--eval-size") + 1] == "0"
        assert other[other.index("--prompts-per-step") + 1] == "4"
        assert other[other.index("--model") + 1] == "/m"
        assert "model.dtype=bfloat16" in other and "training.remat=true" in other
        told = bg.rlctl_args(bg.NAMED["default"], None, 2, "float32", 4, [], tmp_path)
        assert told[told.index("--eval-size") + 1] == "4"


def test_figures_take_step_1_apart():
    rows = [
        {"step_seconds": 30.0, "rollout_seconds": 10.0, "completion_tokens": 100},
        {"step_seconds": 2.0, "rollout_seconds": 1.5, "completion_tokens": 40},
        {"step_seconds": 4.0, "rollout_seconds": 1.0, "completion_tokens": 80},
        {"step_seconds": 3.0, "rollout_seconds": 2.0, "completion_tokens": 60},
    ]
    f = bg.figures(rows)
    assert f["first_step_s"] == 30.0 and f["median_step_s"] == 3.0
    assert f["median_rollout_s"] == 1.5 and f["median_update_s"] == 1.0
    assert f["tokens_per_s"] == 20.0  # 180 tokens over 9 s, step 1 left out
    assert bg.figures(rows[:1])["median_step_s"] == 30.0  # one step: it is all there is


@pytest.mark.trainer
def test_a_run_on_the_cpu_with_the_tiny_model(tiny_model_dir, tmp_path):
    pytest.importorskip("tunix")
    env = {**os.environ, "PYTHONPATH": str(REPO), "RLCTL_CACHE": str(tmp_path / "cache")}
    env.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "bench_gpu.py"),
            "--model",
            str(tiny_model_dir),
            "--workload",
            "2x2x8",
            "--steps",
            "2",
            "-o",
            "json",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout)  # only JSON on stdout
    assert result["workload"]["label"] == "2x2x8" and result["steps"] == 2
    assert result["preallocate"] == "false"
    [run] = result["runs"]
    [raw] = result["raw"]
    assert run["name"] == "rlctl" and not run["error"]
    assert run["device"].startswith("cpu ")
    steps = raw["steps"]
    assert [s["step"] for s in steps] == [1, 2]
    assert all(0 < s["completion_tokens"] <= 2 * 2 * 8 for s in steps)
    assert run["first_step_s"] == steps[0]["step_seconds"] > 0
    assert run["median_step_s"] == steps[1]["step_seconds"] > 0
    assert run["median_rollout_s"] == steps[1]["rollout_seconds"] > 0
    assert run["median_update_s"] == pytest.approx(
        steps[1]["step_seconds"] - steps[1]["rollout_seconds"], abs=1e-3
    )
    assert run["tokens_per_s"] == pytest.approx(
        steps[1]["completion_tokens"] / steps[1]["step_seconds"], rel=1e-3
    )
    # the whole run holds both steps and the start-up around them
    assert run["wall_s"] > steps[0]["step_seconds"] + steps[1]["step_seconds"]
    # no device count on the CPU: host peak RSS stands in, and says so
    assert run["peak_device_bytes"] is None and "host peak RSS" in run["peak_memory_source"]
    assert run["peak_memory_bytes"] == run["peak_host_rss_bytes"] > 100 * 2**20
    # where the time went, from the run's own log: one update and one sampler compiled,
    # no eval, the final save in the step (the CPU's row saves in the step)
    p = run["phases"]
    assert p["update_compiles"] >= 1 and p["update_compile_s"] > 0
    assert p["sampler_compiles"] == 1 and p["sampler_compile_s"] > 0
    assert (p["evals"], p["evals_s"]) == (0, 0.0)
    assert p["saves"] == 1 and p["saves_in_steps_s"] > 0 == p["saves_in_background_s"]
    table = bg.report(result)
    assert "rlctl" in table and "2x2x8" in table
    assert "* host peak RSS: no device memory count on the CPU" in table
    assert "rlctl phases: update compile " in table


def test_phases_are_read_from_the_runs_log_and_eval_records(tmp_path):
    (tmp_path / "eval").mkdir()
    for which, seconds in (("baseline", 14.5), ("final", 3.25)):
        (tmp_path / "eval" / f"{which}.json").write_text(json.dumps({"seconds": seconds}))
    stamp = "2026-11-27T10:00:00Z  "
    (tmp_path / "train.log").write_text(
        "\n".join(
            stamp + x
            for x in [
                "==== attempt 1: rlctl train r (pid 1)",
                "compiled the update (jit(step)) in 41.2 s",
                "compiled the sampler (jit(sample_groups)) in 12.5 s",
                "compiled jit(step) again after warm-up (2.1 s): different input types",
                "loaded the sampler (jit(sample_groups)) from the compilation cache in 0.5 s",
                "checkpoint 2 saved in the background in 4.9 s (the step waited 0.05 s)",
                "checkpoint 4 saved (1.39 GiB) in 3.0 s",
            ]
        )
        + "\n"
    )
    assert bg.phases(tmp_path) == {
        "update_compile_s": 41.2,
        "update_compiles": 1,
        "sampler_compile_s": 13.0,
        "sampler_compiles": 2,
        "evals_s": 17.75,
        "evals": 2,
        "saves_in_steps_s": 3.05,
        "saves_in_background_s": 4.9,
        "saves": 2,
    }


class TestTheTrlSide:
    def test_a_checkout_without_the_trl_child_says_so_in_one_line(
        self, tmp_path, monkeypatch, capsys
    ):
        monkeypatch.setattr(bg, "TRL_CHILD", tmp_path / "trl_grpo_child.py")
        assert bg.main(["--trl", "--steps", "1", "--model", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1
        assert "bench/trl_grpo_child.py" in err and err.startswith("bench_gpu: --trl needs")

    def test_an_interpreter_without_trl_is_named(self, tmp_path, monkeypatch):
        for name in ("trl_grpo_child.py", "bench_vs_trl.py"):
            (tmp_path / name).write_text("")
        monkeypatch.setattr(bg, "TRL_CHILD", tmp_path / "trl_grpo_child.py")
        monkeypatch.setattr(bg, "TRL_PROMPTS", tmp_path / "bench_vs_trl.py")
        fake = tmp_path / "python"
        fake.write_text(
            "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'trl'\" >&2\nexit 1\n"
        )
        fake.chmod(0o755)
        problem = bg.trl_problem(fake)
        assert problem and str(fake) in problem and "No module named 'trl'" in problem

    @pytest.mark.slow
    def test_the_child_runs_on_the_device_torch_sees_and_its_steps_are_read(
        self, tmp_path, monkeypatch
    ):
        """A stand-in with the child's interface: the probe loads it by path, turns its
        use_cpu off when torch sees a GPU, and adds the device to its result."""
        pytest.importorskip("torch")
        child = tmp_path / "trl_grpo_child.py"
        child.write_text(
            "import argparse, json\n"
            "SETTINGS = {'fp32': {'bf16': False}}\n"
            "def config(setting, steps, output_dir, p, g, n):\n"
            "    return {'use_cpu': True, 'max_steps': steps}\n"
            "def main():\n"
            "    ap = argparse.ArgumentParser()\n"
            "    for o in ('--model', '--prompts', '--setting', '--out'):\n"
            "        ap.add_argument(o)\n"
            "    for o in ('--steps', '--prompts-per-step', '--group', '--max-new-tokens'):\n"
            "        ap.add_argument(o, type=int)\n"
            "    a = ap.parse_args()\n"
            "    c = config(a.setting, a.steps, '', a.prompts_per_step, a.group,\n"
            "               a.max_new_tokens)\n"
            "    steps = [{'step': i + 1, 'step_seconds': 2.0 - i, 'rollout_seconds': 0.5,\n"
            "              'completion_tokens': a.group * a.max_new_tokens}\n"
            "             for i in range(a.steps)]\n"
            "    json.dump({'steps': steps, 'config': c}, open(a.out, 'w'))\n"
        )
        monkeypatch.setattr(bg, "TRL_CHILD", child)
        assert bg.trl_settings() == {"fp32": {"bf16": False}}
        w = bg.workload("2x4x6")
        run = bg.run_trl(
            Path(sys.executable), "fp32", tmp_path / "p.jsonl", tmp_path, w, 2, tmp_path
        )
        assert not run.error, run.error
        assert [s["step"] for s in run.steps] == [1, 2]
        import torch

        cuda = torch.cuda.is_available()
        assert run.extra["config"]["use_cpu"] is (not cuda)
        assert run.device == "cpu" if not cuda else run.device.startswith("cuda ")
        s = bg.summary(run)
        assert s["tokens_per_s"] == 24.0  # 4 x 6 tokens in step 2's 1 s
        assert (s["peak_device_bytes"] is None) is (not cuda)
