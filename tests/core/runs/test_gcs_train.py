"""End to end without a cluster: the trainer with its run store on fake-gcs-server,
SIGKILLed after a committed checkpoint, resumed from gs:// to the same metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.core.trainer.test_train import REPO, TIMING, tiny_args
from tests.sigkill import kill_when

HF_SENTINEL = "hf_SENTINEL_trainer_env_52b1"
pytest.importorskip("tunix")
pytestmark = pytest.mark.trainer


def rows(client, bucket: str, run: str) -> list[dict]:
    text = client.bucket(bucket).blob(f"runs/{run}/metrics.jsonl").download_as_text()
    return [
        {k: v for k, v in json.loads(line).items() if k not in TIMING} for line in text.splitlines()
    ]


def test_sigkill_then_resume_from_gcs_reproduces_an_uninterrupted_run(
    gcs, gcs_server_url, tiny_model_dir, tmp_path
):
    client, bucket = gcs
    root = f"gs://{bucket}/runs"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "STORAGE_EMULATOR_HOST": gcs_server_url,
        "RLCTL_STAGING_DIR": str(tmp_path / "staging"),
        "HF_TOKEN": HF_SENTINEL,
    }
    common = ("--steps", "6", "--set", "checkpoint.interval=2", "--seed", "3")

    def rlctl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "rlctl", *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    whole = rlctl(*tiny_args(tiny_model_dir, root, "whole", "grpo", *common))  # type: ignore[arg-type]
    assert whole.returncode == 0, whole.stderr

    marker = client.bucket(bucket).blob("runs/killed/checkpoints/2/COMMITTED")
    kill_when(
        tiny_args(tiny_model_dir, root, "killed", "grpo", *common),  # type: ignore[arg-type]
        marker.exists,
        env,
    )
    done = [r["step"] for r in rows(client, bucket, "killed")]
    assert done and max(done) < 6, "the run finished before it was killed"

    resumed = rlctl("resume", "killed", "--runs-dir", root, "-o", "json")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming killed from checkpoint at step" in resumed.stderr
    assert json.loads(resumed.stdout)["phase"] == "completed"
    assert rows(client, bucket, "killed") == rows(client, bucket, "whole")
    finals = [
        json.loads(client.bucket(bucket).blob(f"runs/{n}/eval/final.json").download_as_text())[
            "accuracy"
        ]
        for n in ("killed", "whole")
    ]
    assert finals[0] == finals[1]
    steps = sorted(
        {
            b.name.split("/")[3]
            for b in client.list_blobs(bucket, prefix="runs/killed/checkpoints/")
            if b.name.endswith("/COMMITTED")
        }
    )
    assert "6" in steps
    assert client.bucket(bucket).blob("runs/killed/tensorboard").exists() is False
    assert list(client.list_blobs(bucket, prefix="runs/killed/tensorboard/events"))

    # train.log through the store: the killed attempt up to its last step, the resume
    text = client.bucket(bucket).blob("runs/killed/train.log").download_as_text()
    log = text.splitlines()
    markers = [x.split("  ", 1)[1].split(" (pid")[0] for x in log if "==== attempt" in x]
    assert markers == ["==== attempt 1: rlctl train killed", "==== attempt 2: rlctl resume killed"]
    attempt_1 = log[: log.index(next(x for x in log if "==== attempt 2" in x))]
    assert any("step 2/6" in x for x in attempt_1), attempt_1
    assert log[-1].endswith("run completed: 6 steps")
    shown = rlctl("logs", "killed", "--runs-dir", root, "--tail", "3")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == log[-3:]

    # the pod entrypoint on the same run: already completed, so it exits 0 at once
    pod = subprocess.run(
        [sys.executable, "-m", "rlctl.core.runs.pod", "--run", f"{root}/killed"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert pod.returncode == 0, pod.stderr
    assert "already completed" in pod.stdout

    # the token in the trainer's environment reaches no log and no run store object
    logs = whole.stdout + whole.stderr + resumed.stdout + resumed.stderr + pod.stdout + pod.stderr
    assert HF_SENTINEL not in logs
    for blob in client.list_blobs(bucket):
        assert HF_SENTINEL.encode() not in blob.download_as_bytes(), blob.name
