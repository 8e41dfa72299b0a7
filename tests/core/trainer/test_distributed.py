"""Multi-host training, on this machine: two JAX processes on CPU joined over
127.0.0.1 run the pod entrypoint as a two-host JobSet would, with the model and
optimizer sharded across them."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlctl.cli.app import app
from rlctl.core.errors import ConfigError
from rlctl.core.trainer.runtime.distributed import InitPlan, Topology, plan_from_env
from tests.core.trainer.test_train import TIMING
from tests.fakes.jax_processes import finish, new_run, start

# builds a model, compiles or trains: out of the fast loop (tests/test_marks.py)
pytestmark = pytest.mark.slow


class TestPlanFromEnv:
    def test_a_laptop_is_one_process(self):
        assert plan_from_env({}) == InitPlan("single")

    def test_the_gpu_jobset_variables_join_explicitly(self):
        env = {
            "JAX_COORDINATOR_ADDRESS": "run-gpu-0-0.run:1234",
            "JAX_NUM_PROCESSES": "4",
            "JAX_PROCESS_ID": "3",
        }
        assert plan_from_env(env) == InitPlan("explicit", "run-gpu-0-0.run:1234", 4, 3)

    def test_one_process_needs_no_coordinator(self):
        assert plan_from_env({"JAX_NUM_PROCESSES": "1"}) == InitPlan("single")

    def test_a_multi_host_tpu_slice_lets_jax_detect_it(self):
        env = {"TPU_WORKER_HOSTNAMES": "h0,h1,h2,h3", "TPU_WORKER_ID": "2"}
        assert plan_from_env(env) == InitPlan("tpu-auto")

    def test_single_host_slices_over_dcn_join_too(self):
        env = {"TPU_WORKER_HOSTNAMES": "h0", "MEGASCALE_NUM_SLICES": "2"}
        assert plan_from_env(env) == InitPlan("tpu-auto")

    def test_one_single_host_slice_is_one_process(self):
        assert plan_from_env({"TPU_WORKER_HOSTNAMES": "h0"}) == InitPlan("single")

    def test_pathways_is_a_single_controller(self):
        env = {"JAX_PLATFORMS": "proxy", "TPU_WORKER_HOSTNAMES": "h0,h1"}
        assert plan_from_env(env) == InitPlan("pathways")

    def test_pathways_without_pathwaysutils_says_what_to_install(self, monkeypatch):
        import jax

        from rlctl.core.errors import MissingDependencyError
        from rlctl.core.trainer.runtime.distributed import initialize

        monkeypatch.setitem(sys.modules, "pathwaysutils", None)  # not installed
        monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
        with pytest.raises(MissingDependencyError, match="needs pathwaysutils in the image"):
            initialize({"JAX_PLATFORMS": "proxy"})

    def test_ray_initialized_it_already(self):
        env = {"JAX_NUM_PROCESSES": "8"}
        assert plan_from_env(env, already_initialized=True) == InitPlan("external")

    @pytest.mark.parametrize(
        "env, words",
        [
            ({"JAX_NUM_PROCESSES": "two"}, "JAX_NUM_PROCESSES='two' is not an integer"),
            ({"JAX_NUM_PROCESSES": "0"}, "must be at least 1"),
            ({"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"}, "JAX_COORDINATOR_ADDRESS is not"),
            ({"JAX_NUM_PROCESSES": "2", "JAX_COORDINATOR_ADDRESS": "h:1"}, "JAX_PROCESS_ID is not"),
            (
                {"JAX_NUM_PROCESSES": "2", "JAX_COORDINATOR_ADDRESS": "h:1", "JAX_PROCESS_ID": "2"},
                "outside 0..1",
            ),
            ({"MEGASCALE_NUM_SLICES": "x"}, "MEGASCALE_NUM_SLICES='x' is not an integer"),
        ],
    )
    def test_bad_variables_are_config_errors(self, env, words):
        with pytest.raises(ConfigError, match=words):
            plan_from_env(env)

    def test_only_process_zero_writes(self):
        assert Topology(0, 2, 8).is_writer and not Topology(1, 2, 8).is_writer
        assert Topology(1, 2, 8).multi_process and not Topology(0, 1, 8).multi_process


# --- real multi-process runs -------------------------------------------------------
pytest.importorskip("tunix")


def make_run(root: Path, name: str, model: Path, steps: int = 4, *extra: str) -> None:
    # float32 matmuls on every machine: FSDP's sharded sums round differently from one
    # device's, and bfloat16 inputs (model.compute_dtype=auto on a CPU with AVX512-BF16)
    # turn that rounding into 0.2% of the grad norm by step 3, beyond the check's 1e-4
    new_run(
        root,
        name,
        model,
        "model.compute_dtype=float32",
        "eval.size=4",
        "eval.batch_size=4",
        "training.prompts_per_step=2",
        "rollout.num_generations=4",
        "rollout.max_new_tokens=12",
        "training.learning_rate=3e-3",
        f"training.steps={steps}",
        "checkpoint.interval=2",
        "training.seed=3",
        *extra,
    )


def rows(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in lines]


def assert_same_training(a: list[dict], b: list[dict]) -> None:
    """Same rollouts and rewards exactly; floats of sharded math to rounding."""
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for x, y in zip(a, b, strict=True):
        for k in ("reward_mean", "reward_std", "completion_tokens", "accuracy"):
            assert x[k] == y[k], (x["step"], k)
        for k in ("loss", "entropy", "grad_norm", "kl"):
            assert y[k] == pytest.approx(x[k], rel=1e-4, abs=1e-6), (x["step"], k)


@pytest.fixture(scope="module")
def one_process(tiny_model_dir, tmp_path_factory) -> Path:
    """The yardstick: the same run trained by one process on one device."""
    run = tmp_path_factory.mktemp("reference") / "one"
    make_run(run.parent, run.name, tiny_model_dir)
    finish(start(run, 1))
    return run


@pytest.mark.trainer
class TestTwoProcesses:
    def test_two_processes_train_like_one_and_resume_after_sigkill(
        self, tiny_model_dir, one_process, tmp_path
    ):
        root = tmp_path / "runs"
        for name in ("two", "killed"):
            make_run(root, name, tiny_model_dir)
        # a limit above 2 GiB crosses processes intact (as int64 it wrapped to < 0)
        outs = finish(start(root / "two", 2, RLCTL_MEMORY_LIMIT="5GB"))

        # the same training as one process, written once, by process 0
        assert_same_training(rows(one_process), rows(root / "two"))
        status = json.loads((root / "two" / "status.json").read_text())
        assert status["phase"] == "completed" and status["processes"] == 2
        assert status["devices"] == 2 and status["pid"] != 0
        assert "process 1 of 2, 2 devices in all" in outs[1]
        shown = CliRunner().invoke(app, ["status", "two", "--runs-dir", str(root)])
        assert "devices     2 on 2 host(s)" in shown.stderr + shown.stdout
        assert "precision   float32 matmuls" in shown.stderr + shown.stdout
        assert sorted(p.name for p in (root / "two" / "checkpoints").iterdir()) == ["2", "4"]
        final = json.loads((root / "two" / "eval" / "final.json").read_text())
        assert final == {
            **json.loads((one_process / "eval" / "final.json").read_text()),
            "seconds": final["seconds"],
        }

        # both pods killed after the first checkpoint, restarted: the same metrics
        procs = start(root / "killed", 2)
        ckpt = root / "killed" / "checkpoints" / "2"
        deadline = time.time() + 300
        while not ckpt.is_dir() and time.time() < deadline and procs[0].poll() is None:
            time.sleep(0.05)
        assert ckpt.is_dir(), procs[0].communicate()[0][-3000:]
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.communicate()
        assert max(r["step"] for r in rows(root / "killed")) < 4, "finished before the kill"

        outs = finish(start(root / "killed", 2))
        assert "resuming killed from checkpoint at step 2" in outs[0]
        assert_same_training(rows(root / "two"), rows(root / "killed"))

    def test_a_checkpoint_of_two_processes_restores_on_one(
        self, tiny_model_dir, one_process, tmp_path
    ):
        """Checkpoints hold whole arrays: an elastic job that lost hosts, or a laptop,
        continues a run saved by more processes."""
        root = tmp_path / "runs"
        # (and the sampler on the model's FSDP shards, not the default whole copy)
        make_run(root, "shrunk", tiny_model_dir, 2, "rollout.sampler_weights=sharded")
        finish(start(root / "shrunk", 2))

        spec = root / "shrunk" / "spec.yaml"
        spec.write_text(spec.read_text().replace("\n  steps: 2\n", "\n  steps: 4\n"))
        (root / "shrunk" / "status.json").write_text('{"phase": "interrupted"}')
        outs = finish(start(root / "shrunk", 1))
        assert "resuming shrunk from checkpoint at step 2" in outs[0]
        assert_same_training(rows(one_process), rows(root / "shrunk"))


@pytest.mark.trainer
def test_several_devices_in_one_process_shard_the_model(tiny_model_dir, one_process, tmp_path):
    """A multi-GPU machine, or Pathways' single controller: one process, one mesh."""
    root = tmp_path / "runs"
    make_run(root, "sharded", tiny_model_dir)
    finish(start(root / "sharded", 1, XLA_FLAGS="--xla_force_host_platform_device_count=2"))
    assert_same_training(rows(one_process), rows(root / "sharded"))
    status = json.loads((root / "sharded" / "status.json").read_text())
    assert status["devices"] == 2 and status["processes"] == 1
