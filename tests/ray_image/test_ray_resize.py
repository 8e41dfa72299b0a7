"""An elastic Ray job that really resizes: it grows when a host joins and shrinks when
one is lost, and the run continues from its checkpoints with every step's metrics once.

Runs only in the environment ``.ci/ray-image`` makes (the TPU image's lock, as
test_ray_image.py says). The RayJob is rendered for two GPU hosts (``a3-highgpu-8g``,
one slice each) with ``--min-slices 1``, so its driver asks Ray for
``num_workers=(1, 2)``, ``use_gpu=True``, 8 GPUs a worker: the accelerator path as it
runs on GKE, not the driver's one-worker CPU mode. Each host is a Ray worker node
started with the worker group's rendered ``ray start`` line (KubeRay v1.6.1 adds
``num-gpus=8`` from the container's ``nvidia.com/gpu`` limit), standing in for a GPU
host with ``JAX_PLATFORMS=cpu``: Ray Train's JAX backend then joins the workers into one
JAX job over CPU (ray 2.60.0, train/v2/jax/config.py ``_setup_jax_distributed_environment``,
its ``cpu`` branch: ``jax.distributed.initialize(coordinator, num_workers, index)``),
the same call it makes on GPUs.

What happens, as on a cluster whose second host is added, then preempted:
1. one node: Ray's elastic policy starts the group with 1 worker (the minimum);
2. after the first checkpoint a second node joins; at the policy's next look
   (``RLCTL_RAY_RESIZE_CHECK_S``, 60 s by default) the group restarts with 2 workers,
   which restore the checkpoint onto a mesh of 2 devices and go on;
3. after a checkpoint of the 2-host group the second node is killed (its process group,
   as a preempted VM's): the worker on it dies, Ray counts one failure and starts the
   group again on what is left, 1 worker, from the last checkpoint;
4. the run completes. status.json records both resizes (``rlctl status`` shows them),
   and metrics.jsonl holds each step once: the steps a restart repeated were truncated
   on resume.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.core.runs.test_ray_driver import tiny_spec, write_run
from tests.fakes import controllers as kuberay
from tests.fakes.shapes import h100_8
from tests.ray_image.test_ray_image import (
    _answers,
    _env_of,
    _free,
    _groups,
    _mounted,
    _node_env,
    _probe_url,
    _render,
    _stop,
)

pytestmark = [pytest.mark.trainer, pytest.mark.slow]
RUN = "ray-elastic"
STEPS = 30
# each worker node's own ports (on GKE every pod has its own network namespace)
NODE_PORTS = [
    {
        "metrics-export-port": str(28080 + i),
        "dashboard-agent-listen-port": str(52366 + 10 * i),
        "dashboard-agent-grpc-port": str(52367 + 10 * i),
        "runtime-env-agent-port": str(52368 + 10 * i),
        "node-manager-port": str(52369 + 10 * i),
    }
    for i in range(2)
]


def _status(bucket) -> dict:
    blob = bucket.blob(f"runs/{RUN}/status.json")
    try:
        return json.loads(blob.download_as_text())
    except Exception:  # not written yet, or mid-upload: the next look reads it
        return {}


def _wait(what: str, seconds: float, ok, job: subprocess.Popen, log: Path) -> dict:
    """Poll ``ok()`` (a status dict, or None) until it answers, the job ends, or time
    is up; fail with the tail of the job's and the nodes' output."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = ok()
        if got:
            return got
        if job.poll() is not None:
            break
        time.sleep(1)
    raise AssertionError(
        f"{what}: not within {seconds:.0f} s (job exit {job.poll()})\n" + log.read_text()[-8000:]
    )


def test_an_elastic_job_grows_and_shrinks_and_keeps_every_step_once(
    gcs, gcs_server_url, tiny_model_dir, tmp_path
):
    from rlctl.core.store import open_store

    client, bucket_name = gcs
    bucket = client.bucket(bucket_name)
    store = open_store(f"gs://{bucket_name}/runs")
    spec = tiny_spec(
        RUN, store.uri, str(tiny_model_dir), 'rewards=["tests.fakes.rewards.paced_digit_count"]'
    )
    spec = spec.model_copy(update={"training": spec.training.model_copy(update={"steps": STEPS})})
    rayjob, files = _render(spec, store, h100_8(1, 2), max_restarts=2)
    write_run(spec, store)

    head, head_c, group, worker_c = _groups(rayjob)
    assert (group["minReplicas"], group["maxReplicas"]) == (1, 2)
    driver = files["ray_driver.py"]
    assert "MIN_WORKERS = 1\n" in driver and "MAX_WORKERS = 2\n" in driver
    assert "use_gpu=True" in driver

    entry = _mounted(rayjob, files, tmp_path)
    pace = tmp_path / "pace"
    pace.touch()
    ray_tmp = tempfile.mkdtemp(prefix="rlel")  # AF_UNIX paths stay short
    # the worker pods' env (RLCTL_RUN, RAY_TRAIN_V2_ENABLED; JAX on the CPU standing in
    # for the GPU hosts, see above)
    env = _node_env(_env_of(worker_c), gcs_server_url, tmp_path, ray_tmp)
    env.update(
        {
            "RLCTL_RAY_RESIZE_CHECK_S": "5",
            # the steps held at 2 s or more until the second host is gone (the tiny
            # model's steps take about 1 s here: the run would end before a resize)
            "RLCTL_TEST_PACE": str(pace),
        }
    )
    head_cmd = kuberay.ray_start_command(
        head["rayStartParams"], head=True, limits=head_c["resources"].get("limits")
    )

    def worker_cmd(i: int) -> list[str]:
        # the rendered params and limits; its own ports; 1 CPU and 4 GiB, not a3's 208
        params = {
            **group["rayStartParams"],
            "address": "127.0.0.1:6379",
            **NODE_PORTS[i],
            "num-cpus": "1",
            "memory": str(4 << 30),
        }
        return kuberay.ray_start_command(
            params, head=False, limits=worker_c["resources"].get("limits")
        )

    assert "--num-gpus=8" in worker_cmd(0)  # from the nvidia.com/gpu limit, as KubeRay
    busy = [
        p
        for p in (6379, kuberay.DASHBOARD_PORT, kuberay.AGENT_PORT, 10001, kuberay.METRICS_PORT)
        if not _free(p)
    ] + [int(v) for ports in NODE_PORTS for v in ports.values() if not _free(int(v))]
    assert not busy, f"ports {busy} are taken: is another Ray running here? ('ray stop')"

    log_path = tmp_path / "nodes.log"
    log = log_path.open("w")
    job_log = tmp_path / "job.log"
    nodes: list[subprocess.Popen] = []

    def start(cmd: list[str]) -> subprocess.Popen:
        p = subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        nodes.append(p)
        return p

    job = None
    try:
        start(head_cmd)
        ready = _probe_url(head_c["readinessProbe"])
        assert _answers(ready, 90) == 200, log_path.read_text()[-4000:]
        start(worker_cmd(0))
        probe = _probe_url(worker_c["readinessProbe"])
        assert _answers(probe.replace(f":{kuberay.AGENT_PORT}/", ":52366/"), 60) == 200

        dashboard = f"127.0.0.1:{kuberay.DASHBOARD_PORT}"
        line = kuberay.submitter_command(
            {**rayjob, "spec": {**rayjob["spec"], "entrypoint": entry}},
            dashboard,
            f"{RUN}-abcde",
        )
        out = job_log.open("w")
        job = subprocess.Popen(["bash", "-ec", line], env=env, stdout=out, stderr=subprocess.STDOUT)

        # 1. one host: the group starts at its minimum and checkpoints
        first = _wait(
            "a first checkpoint on one host",
            300,
            lambda: (
                (s := _status(bucket)).get("processes") == 1
                and (s.get("latest_checkpoint") or 0) >= 1
                and s
            ),
            job,
            job_log,
        )
        # 2. a second host joins: the group grows to two, from that checkpoint on
        start(worker_cmd(1))
        grown = _wait(
            "the group grown to two hosts, and a checkpoint of theirs",
            300,
            lambda: (
                (s := _status(bucket)).get("processes") == 2
                and (s.get("latest_checkpoint") or 0)
                > (s.get("resizes") or [{}])[0].get("step", 99)
                and s
            ),
            job,
            job_log,
        )
        assert grown["phase"] == "running", (grown, job_log.read_text()[-4000:])
        # 3. the second host is lost: Ray starts the group again on what is left
        _stop_now(nodes[-1])
        _wait(
            "the group started again on the one host left",
            300,
            lambda: len((s := _status(bucket)).get("resizes") or []) == 2 and s,
            job,
            job_log,
        )
        pace.unlink()  # the rest at full speed
        job.wait(timeout=480)
        out.close()
    finally:
        if job is not None and job.poll() is None:
            job.kill()
        for p in reversed(nodes):
            _stop(p)
        log.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)

    said = job_log.read_text()
    assert job.returncode == 0, said[-8000:]
    status = _status(bucket)
    assert (status["phase"], status["step"]) == ("completed", STEPS), status
    steps = [r["step"] for r in status["resizes"]]
    assert [r["hosts"] for r in status["resizes"]] == [[1, 2], [2, 1]], status["resizes"]
    assert first["latest_checkpoint"] <= steps[0] < steps[1] < STEPS, status["resizes"]
    # every step's metrics once, in order: what a restart repeated was truncated
    rows = bucket.blob(f"runs/{RUN}/metrics.jsonl").download_as_text().splitlines()
    assert [json.loads(r)["step"] for r in rows] == list(range(1, STEPS + 1))
    # each attempt says where it resumed and on how many hosts
    train_log = bucket.blob(f"runs/{RUN}/train.log").download_as_text()
    assert "resized: 1 -> 2 hosts (1 -> 2 devices)" in train_log, train_log[-4000:]
    assert "resized: 2 -> 1 hosts (2 -> 1 devices)" in train_log, train_log[-4000:]


def _stop_now(p: subprocess.Popen) -> None:
    """A preempted host: its whole process group (raylet, workers) killed at once."""
    import signal

    os.killpg(p.pid, signal.SIGKILL)
    p.wait(30)
