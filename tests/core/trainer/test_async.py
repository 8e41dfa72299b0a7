"""Pipelined runs end to end on the tiny model (issue 54): the generator on its own CPU
device (``rollout.placement=split``: the CPU's second host device, which the trainer
asks XLA for itself) or colocated, sampling up to ``rollout.max_staleness`` versions
behind the learner."""

from __future__ import annotations

import json

import pytest

from tests.core.trainer.test_train import in_process, metrics, rlctl, tiny_args

pytest.importorskip("tunix")
pytestmark = pytest.mark.trainer

# the row's keys only a pipelined run has (update/step.py's StepMetrics)
PIPELINE = {
    "staleness",
    "dropped_samples",
    "generator_restarts",
    "generator_busy",
    "learner_busy",
    "weight_push_seconds",
    "weight_push_bytes",
}
SPLIT = ("--set", "rollout.placement=split")
STALE = ("--set", "rollout.max_staleness=1")
COMMON = ("--steps", "4", "--set", "model.compute_dtype=float32", "--set", "checkpoint.interval=2")


def learned(run) -> list[dict]:
    """A run's rows without timings and the pipeline's own figures."""
    return [{k: v for k, v in r.items() if k not in PIPELINE} for r in metrics(run)]


def in_subprocess(model, root, name: str, *extra: str) -> None:
    """A run in a process of its own: JAX there starts with the host devices the split
    asks for (this process's JAX has one device already)."""
    r = rlctl(*tiny_args(model, root, name, "grpo", *COMMON, *extra))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    """The synchronous run, and split runs with staleness 0 and 1, once for the module."""
    root = tmp_path_factory.mktemp("async")
    in_process(tiny_model_dir, root, "sync", "grpo", *COMMON)  # one device: no process needed
    in_subprocess(tiny_model_dir, root, "split0", *SPLIT)
    in_subprocess(tiny_model_dir, root, "split1", *SPLIT, *STALE)
    return root


def test_split_with_staleness_zero_is_the_synchronous_run_exactly(runs):
    """Every figure of every step equal, not close: the same rollouts, rewards, losses
    and gradient norms, the generator sampling on device 1 what the learner's device
    would have."""
    sync, split = learned(runs / "sync"), learned(runs / "split0")
    assert len(sync) == 4
    for a, b in zip(sync, split, strict=True):
        for key in a:
            assert a[key] == b[key], (a["step"], key, a[key], b[key])
    rows = metrics(runs / "split0")
    assert [r["staleness"] for r in rows] == [0, 0, 0, 0]
    # a push after every update but the last (nothing samples from the final version)
    assert [r.get("weight_push_bytes", 0) > 0 for r in rows] == [True, True, True, False]
    status = json.loads((runs / "split0" / "status.json").read_text())
    assert status["devices"] == 2
    placed = "split: generator on 1 cpu device [1], learner on 1 cpu device [0]"
    assert status["rollout"] == f"{placed}; at most 0 behind"
    log = (runs / "split0" / "train.log").read_text()
    assert placed in log
    assert "stale 0  gen " in log  # each step line says it


def test_status_shows_the_placement_and_the_last_steps_pipeline(runs):
    shown = rlctl("status", "split1", "--runs-dir", str(runs))
    assert shown.returncode == 0, shown.stderr
    assert "rollout     split: generator on 1 cpu device [1]" in shown.stdout
    assert "pipeline    stale 1  gen " in shown.stdout
    as_json = json.loads(rlctl("status", "split1", "--runs-dir", str(runs), "-o", "json").stdout)
    assert as_json["rollout"].endswith("at most 1 behind")
    assert as_json["latest_metrics"]["staleness"] == 1


def test_staleness_one_samples_each_step_from_the_policy_before(runs):
    rows = metrics(runs / "split1")
    assert [r["staleness"] for r in rows] == [0, 1, 1, 1]
    assert all(r["dropped_samples"] == 0 for r in rows)
    sync = learned(runs / "sync")
    # the first step's batch is the synchronous one's (version 0 either way) ...
    assert learned(runs / "split1")[0]["reward_mean"] == sync[0]["reward_mean"]
    # ... the later ones come from an older policy, so the rollouts differ
    assert [r["reward_mean"] for r in rows[1:]] != [r["reward_mean"] for r in sync[1:]]
    # the decoupled correction (the default): the ratio is the learner's own, so
    # nothing is clipped with one update a batch, and the importance weight of the
    # learner's policy over the sampler's is not 1 once the learner moved on
    assert all(r["clip_fraction"] == 0 for r in rows)
    assert all(abs(r["importance_weight"] - 1) > 1e-4 for r in rows[1:])


def test_the_behaviour_correction_clips_against_the_samplers_log_probs(
    runs, tiny_model_dir, tmp_path
):
    """rollout.correction=behaviour: the sampler's log-probs are pi_old, so the ratio
    moves off 1 with the lag and is clipped, and no weight is reported."""
    rows = in_process(
        tiny_model_dir,
        tmp_path,
        "behaviour1",
        "grpo",
        *COMMON,
        *STALE,
        "--set",
        "rollout.correction=behaviour",
    )
    assert any(r["clip_fraction"] > 0 for r in rows[1:])
    assert all("importance_weight" not in r for r in rows)
    # the same rollouts as the decoupled run's (the same versions sample each step)
    # until the two updates differ: step 1's batch and update are the same
    assert rows[0]["reward_mean"] == metrics(runs / "split1")[0]["reward_mean"]
    # pushes until the last step that samples from a new version (step 2 of 4 needs 1,
    # step 3 needs 2; 3 is never sampled from)
    assert [("weight_push_seconds" in r) for r in rows] == [True, True, False, False]


def test_colocated_staleness_one_learns_exactly_as_split_does(runs, tiny_model_dir, tmp_path):
    """Which version samples each step is fixed, not raced: the placement does not
    change a figure (one device here, in this process)."""
    colocated = in_process(tiny_model_dir, tmp_path, "colocated1", "grpo", *COMMON, *STALE)
    drop = PIPELINE
    assert [{k: v for k, v in r.items() if k not in drop} for r in colocated] == learned(
        runs / "split1"
    )


def test_a_split_run_is_refused_where_it_cannot_split(tiny_model_dir, tmp_path):
    """This process's JAX started with one CPU device: one line, with the fix."""
    from typer.testing import CliRunner

    from rlctl.cli.app import app

    result = CliRunner().invoke(app, tiny_args(tiny_model_dir, tmp_path, "one", "grpo", *SPLIT))
    assert result.exit_code != 0
    assert "needs at least 2 devices; this run has 1" in result.output
    assert "Traceback" not in result.output


def test_the_vllm_engine_is_refused_for_a_pipelined_run(tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from rlctl.cli.app import app

    args = tiny_args(
        tiny_model_dir, tmp_path, "vllm", "grpo", *STALE, "--set", "rollout.engine=vllm"
    )
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert "rollout.engine=vanilla" in result.output or "vLLM" in result.output


# --- a generator process of its own (rollout.placement=process) -----------------------
PROCESS = ("--set", "rollout.placement=process")


def test_a_generator_process_with_staleness_zero_is_the_synchronous_run_exactly(
    runs, tiny_model_dir, tmp_path
):
    """Weights and trajectories through the run store: every figure equal to the
    synchronous run's, and nothing of the exchange left behind."""
    in_subprocess(tiny_model_dir, tmp_path, "process0", *PROCESS)
    assert learned(tmp_path / "process0") == learned(runs / "sync")
    assert not (tmp_path / "process0" / "pipeline").exists()
    log = (tmp_path / "process0" / "generator.log").read_text()
    assert "generator: ready (pid " in log
    r = rlctl("logs", "process0", "--runs-dir", str(tmp_path), "--generator")
    assert r.returncode == 0 and r.stdout.splitlines() == log.splitlines(), r.stderr
    status = json.loads((tmp_path / "process0" / "status.json").read_text())
    assert status["rollout"].startswith("process: generator in a process of its own")


def test_a_killed_generator_process_is_restarted_and_the_run_learns_as_if_it_was_not(
    runs, tiny_model_dir, tmp_path
):
    """SIGKILL to the generator mid-run: the learner starts another, which samples the
    step again from the version the request names; every figure is the split run's.
    Then resume restores the policy version and drops what was in flight."""
    import os
    import re
    import signal
    import subprocess
    import sys
    import time

    from tests.core.trainer.test_train import REPO

    args = tiny_args(tiny_model_dir, tmp_path, "killed", "grpo", *COMMON, *PROCESS, *STALE)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlctl", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    log, metrics_file = tmp_path / "killed" / "generator.log", tmp_path / "killed" / "metrics.jsonl"
    deadline = time.time() + 300
    pid = None
    while time.time() < deadline and proc.poll() is None:
        found = re.search(r"ready \(pid (\d+)\)", log.read_text()) if log.is_file() else None
        if found and metrics_file.is_file() and metrics_file.read_text().strip():
            pid = int(found.group(1))
            break
        time.sleep(0.02)
    assert pid is not None, "the generator never became ready"
    os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert "restarting it (1 of 2)" in err and "Traceback" not in err
    assert learned(tmp_path / "killed") == learned(runs / "split1")
    rows = metrics(tmp_path / "killed")
    assert rows[-1]["generator_restarts"] == 1
    assert len(re.findall(r"ready \(pid", log.read_text())) == 2
    # resumed to 6: a new exchange, steps 5 and 6 from the restored version 4
    r = rlctl("resume", "killed", "--runs-dir", str(tmp_path), "--steps", "6")
    assert r.returncode == 0, r.stderr[-3000:]
    assert [x["staleness"] for x in metrics(tmp_path / "killed")] == [0, 1, 1, 1, 0, 1]
    assert not (tmp_path / "killed" / "pipeline").exists()


def test_a_generator_pod_and_a_learner_pod_exchange_through_gs(
    runs, tiny_model_dir, tmp_path, gcs, gcs_server_url
):
    """A cluster's split across pods, as processes here: the learner told the
    generator runs in pods of its own (``RLCTL_GENERATOR=pods``, as the workload sets
    it), the generator started by hand with ``--pod`` after it, both on a gs:// run
    store (fake-gcs-server). Every figure equals the synchronous run's; the generator's
    lines are in the store's generator.log; it stops once the learner is done; of the
    exchange only the plan and the stop stay in the bucket."""
    import os
    import subprocess
    import sys
    import time

    from rlctl.core.store import open_store
    from tests.core.trainer.test_train import REPO, TIMING

    _, bucket = gcs
    root = f"gs://{bucket}/runs"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "STORAGE_EMULATOR_HOST": gcs_server_url,
        "RLCTL_STAGING_DIR": str(tmp_path / "staging"),
    }
    learner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlctl",
            *tiny_args(tiny_model_dir, tmp_path, "pods", "grpo"),
            *COMMON,
            *PROCESS,
            "--runs-dir",
            root,
        ],
        cwd=REPO,
        env={**env, "RLCTL_GENERATOR": "pods"},
        # files, not pipes: nobody reads the learner's output until the generator is done
        stdout=(tmp_path / "learner.out").open("w"),
        stderr=(tmp_path / "learner.err").open("w"),
        text=True,
    )
    store = open_store(root)
    deadline = time.time() + 300
    while not store.run("pods").exists("spec.yaml") and learner.poll() is None:
        assert time.time() < deadline, "the learner never wrote its spec"
        time.sleep(0.1)
    pod = ("--root", root, "--name", "pods", "--pod")
    generator = subprocess.Popen(
        [sys.executable, "-m", "rlctl.core.trainer.run.generate", *pod],
        cwd=REPO,
        env=env,
        stdout=(tmp_path / "generator.out").open("w"),
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        learner.wait(timeout=600)
        err = (tmp_path / "learner.err").read_text()
        assert learner.returncode == 0, err[-3000:]
        generator.wait(timeout=60)  # it reads the learner's stop at its next look
    finally:
        for proc in (learner, generator):
            if proc.poll() is None:
                proc.kill()
    said = (tmp_path / "generator.out").read_text()
    assert generator.returncode == 0, said[-3000:]
    assert "the learner is done: stopping" in said
    run = store.run("pods")
    rows = [json.loads(line) for line in run.read_text("metrics.jsonl").splitlines()]
    drop = PIPELINE | set(TIMING)
    assert [{k: v for k, v in r.items() if k not in drop} for r in rows] == learned(runs / "sync")
    log = run.read_text("generator.log")
    assert "ready (pid" in log and "step 4 sampled from version 3" in log
    assert run.list("pipeline") == ["plan.json", "stop"]  # what the generator pods read
