"""The Ray backend's driver, run for real: no stub of Ray, of the trainer or of the store.

The run's objects are rendered as ``submit`` renders them (``render_run``, which
validates them too); the driver is the ConfigMap's ``ray_driver.py``, written to a
file and run as the RayJob runs it (``python ray_driver.py``). ``RLCTL_RAY_DEVICE=cpu``
is the driver's one switch for a machine without accelerators: a small local Ray and
one CPU worker instead of the TPU/GPU workers. The worker runs the cluster pods'
entrypoint (``rlctl.core.runs.pod``) on a gs:// run store served by fake-gcs-server,
trains the tiny model for two steps and checkpoints each one.

Ray's own ``storage_path`` (``RUN/ray``) goes through pyarrow's GCS client, which
honours ``CLOUD_STORAGE_EMULATOR_ENDPOINT`` but still signs its requests: a throwaway
service-account key lets it sign them itself (a self-signed JWT, no token server)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("tunix")
pytest.importorskip("ray.train.v2.jax")
pytestmark = [pytest.mark.trainer, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
RUN = "ray-tiny"


def _throwaway_key(path: Path) -> Path:
    """A service-account key nobody trusts, generated here (pyarrow's GCS client needs
    credentials it can sign with; fake-gcs-server accepts any)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    path.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "test",
                "private_key_id": "test",
                "private_key": pem,
                "client_email": "rlctl-test@test.iam.gserviceaccount.com",
                "client_id": "1",
                "token_uri": "https://oauth2.googleapis.com/token",
            }
        )
    )
    return path


def rendered_driver(spec, store, max_restarts: int = 0, shape=None) -> str:
    """ray_driver.py as ``submit`` renders it for a one-slice v6e-16 cluster (or
    ``shape``'s)."""
    from rlctl.core.k8s import backends
    from rlctl.core.runs.submit import ClusterOptions, render_run
    from tests.fakes.shapes import v6e_16

    # a cluster run reads gs:// inputs through the pods' GCS FUSE mounts; the driver
    # does not depend on them (only on the run, its store, the shape and the restarts)
    bucket = store.uri[len("gs://") :].split("/", 1)[0]
    on_gcs = spec.model_copy(
        update={
            "model": spec.model.model_copy(update={"source": f"gs://{bucket}/models/tiny-llama"})
        }
    )
    # no restarts by default: a failing worker fails the job at once
    opts = ClusterOptions(image="us-docker.pkg.dev/p/r/rlctl:1", max_restarts=max_restarts)
    objs = render_run(on_gcs, backends.get("ray"), shape or v6e_16(1), store, opts)
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap"]
    (rj,) = [o for o in objs if o["kind"] == "RayJob"]
    assert rj["spec"]["entrypoint"] == "python /etc/rlctl/ray_driver.py"
    return cm["data"]["ray_driver.py"]


def write_run(spec, store) -> None:
    """The run store as ``submit_run`` leaves it: spec.yaml and a pending status.json.
    The model is the local folder where a pod would have the bucket's mount."""
    from rlctl.core.runs.spec import write_new_run
    from rlctl.core.store.base import STATUS, Phase

    run = write_new_run(store, spec)
    run.write_json(
        STATUS,
        {
            "name": spec.name,
            "phase": Phase.PENDING,
            "algorithm": spec.algorithm,
            "total_steps": spec.training.steps,
            "step": 0,
            "latest_checkpoint": None,
            "backend": "ray",
        },
    )


def run_driver(
    driver: str, tmp_path: Path, gcs_url: str, **env_extra: str
) -> subprocess.CompletedProcess:
    script = tmp_path / "ray_driver.py"
    script.write_text(driver)
    # Ray's sockets live under its temp dir: keep the path short (AF_UNIX's 107 bytes)
    ray_tmp = tempfile.mkdtemp(prefix="rlray")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(
        {
            "PYTHONPATH": str(REPO),  # this rlctl and tests.fakes.rewards in the workers
            "RLCTL_RAY_DEVICE": "cpu",
            "JAX_PLATFORMS": "cpu",
            "STORAGE_EMULATOR_HOST": gcs_url,  # rlctl's run store (google-cloud-storage)
            "CLOUD_STORAGE_EMULATOR_ENDPOINT": gcs_url,  # Ray's storage_path (pyarrow)
            "GOOGLE_APPLICATION_CREDENTIALS": str(_throwaway_key(tmp_path / "key.json")),
            "RLCTL_STAGING_DIR": str(tmp_path / "staging"),
            "RAY_TMPDIR": ray_tmp,
            "RAY_USAGE_STATS_ENABLED": "0",
            "PYTHONUNBUFFERED": "1",
            **env_extra,
        }
    )
    try:
        return subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=420,
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def tiny_spec(name: str, root: str, model: str | None = None, *overrides: str):
    """Two steps of GRPO, a checkpoint after each (the tiny model's run, as
    tests/core/trainer/test_train.py makes it), in the run store ``root``."""
    from rlctl.core.runs.spec import resolve_run_spec

    return resolve_run_spec(
        "grpo",
        overrides=[
            'rewards=["tests.fakes.rewards.digit_count"]',
            "checkpoint.interval=1",
            "eval.size=0",
            *overrides,
        ],
        flags={
            "name": name,
            "model.source": model,
            "training.steps": 2,
            "training.prompts_per_step": 2,
            "rollout.num_generations": 4,
            "rollout.max_new_tokens": 8,
            "training.learning_rate": 3e-3,
            "output.root": root,
        },
    )


def test_rendered_ray_driver_trains_a_run_on_a_local_ray(
    gcs, gcs_server_url, tiny_model_dir, tmp_path
):
    from rlctl.core.store import open_store

    client, bucket = gcs
    store = open_store(f"gs://{bucket}/runs")
    spec = tiny_spec(RUN, store.uri, str(tiny_model_dir))
    driver = rendered_driver(spec, store)
    write_run(spec, store)

    t0 = time.monotonic()
    r = run_driver(driver, tmp_path, gcs_server_url)
    took = time.monotonic() - t0
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]

    b = client.bucket(bucket)
    status = json.loads(b.blob(f"runs/{RUN}/status.json").download_as_text())
    assert (status["phase"], status["step"], status["latest_checkpoint"]) == ("completed", 2, 2), (
        status
    )
    assert b.blob(f"runs/{RUN}/checkpoints/2/COMMITTED").exists()
    # the pod entrypoint ran inside the Ray worker and said so on its stdout
    assert '"event": "done"' in out, out[-6000:]
    # Ray Train kept its own run state under the run, in the same store
    assert list(client.list_blobs(bucket, prefix=f"runs/{RUN}/ray/"))
    print(f"driver took {took:.1f} s")


def test_a_generator_task_serves_the_learner_on_its_own_worker(
    gcs, gcs_server_url, tiny_model_dir, tmp_path
):
    """rollout.placement=process on the Ray backend (issue 54): the driver, as rendered
    for two GPU machines, starts the generator (``generate --pod``) as a Ray task and
    Ray Train's one learner worker beside it, on a real local Ray (CPU workers standing
    in for the machines). The learner waits for the generator's trajectories through the
    gs:// store (``RLCTL_GENERATOR=pods``, as the worker group's env sets it), the run
    completes, the generator keeps its log in the store and stops once the learner is
    done."""
    from rlctl.core.config import catalog
    from rlctl.core.k8s.shapes import slice_shape
    from rlctl.core.store import open_store

    _, bucket = gcs
    store = open_store(f"gs://{bucket}/runs")
    spec = tiny_spec(
        "ray-gen",
        store.uri,
        str(tiny_model_dir),
        "rollout.placement=process",
        "rollout.max_staleness=1",
    )
    two_gpus = slice_shape(catalog.lookup("a3-highgpu-8g"), 2)
    driver = rendered_driver(spec, store, shape=two_gpus)
    assert "GENERATOR = True" in driver
    write_run(spec, store)

    r = run_driver(driver, tmp_path, gcs_server_url, RLCTL_GENERATOR="pods")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    run = store.run("ray-gen")
    status = run.read_json("status.json")
    assert (status["phase"], status["step"]) == ("completed", 2), status
    rows = [json.loads(x) for x in run.read_text("metrics.jsonl").splitlines()]
    assert [x["staleness"] for x in rows] == [0, 1]
    log = run.read_text("generator.log")
    assert "step 2 sampled from version 0" in log and "the learner is done: stopping" in log


def test_a_failing_pod_entry_fails_the_ray_job_at_once(gcs, gcs_server_url, tmp_path):
    """The pod entrypoint's non-zero exit (here: the run has no spec.yaml in the store)
    fails the worker, so the driver, hence the RayJob, fails instead of reporting the
    run done; and since it is rlctl's own error (exit code 3, not found), Ray does not
    retry it, though two restarts are allowed (the JobSet's podFailurePolicy does the
    same: FailJob on 2, 3, 4). The error is rlctl's exit code 2 (a damaged run)."""
    from rlctl.core.store import open_store

    _, bucket = gcs
    store = open_store(f"gs://{bucket}/runs")
    spec = tiny_spec("ray-missing", store.uri)  # never written
    driver = rendered_driver(spec, store, max_restarts=2)

    r = run_driver(driver, tmp_path, gcs_server_url)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-6000:]
    # rlctl's own error (2: the run is damaged), failed by the worker once: the worker
    # group was not started again (three attempts before: 1 + max_restarts)
    tried = re.findall(
        r"RuntimeError: rlctl trainer \(rlctl.core.runs.pod\) exited with code (\d)", out
    )
    assert tried == ["2"], out[-6000:]
    assert "error: run 'ray-missing'" in out  # the pod entry's own one-line error
    assert "[FailurePolicy] RAISE" in out and "not retried" in out


def _driver_module(tmp_path: Path, slices: int):
    """The rendered ray_driver.py of a ``slices`` x v6e-16 run, imported (not run)."""
    import importlib.util

    from rlctl.core.k8s import backends
    from rlctl.core.k8s.render import make_view, render_workload
    from tests.fakes.shapes import v6e_16

    view = make_view(
        run="r1",
        backend="ray",
        image="us-docker.pkg.dev/p/r/rlctl:1",
        run_uri="gs://bkt/runs/r1",
        shape=v6e_16(slices),
        hf_secret="r1-hf-token",
        min_slices=1,
    )
    objs = render_workload(view)
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap"]
    assert backends.get("ray").kind == objs[-1]["kind"]
    path = tmp_path / "ray_driver.py"
    path.write_text(cm["data"]["ray_driver.py"])
    spec = importlib.util.spec_from_file_location("rendered_ray_driver", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_shrink_to_one_slice_drops_the_stale_slice_coordinates(tmp_path):
    """After a preemption shrinks a two-slice run to one, Ray Train sets no megascale
    variable for the new group (ray 2.60.0, train/v2/jax/config.py
    ``_JaxBackend.on_start``: only when num_slices > 1), so the ones the worker still
    has would make libtpu wait for the lost slice: the train loop drops them."""
    driver = _driver_module(tmp_path, 2)
    stale = {
        "MEGASCALE_NUM_SLICES": "2",
        "MEGASCALE_SLICE_ID": "1",
        "MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.2",
        "MEGASCALE_PORT": "9915",
    }
    one_slice = dict(stale)
    assert sorted(driver.drop_stale_slices(one_slice, world_size=4)) == sorted(
        ["MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID", "MEGASCALE_COORDINATOR_ADDRESS"]
    )
    assert one_slice == {"MEGASCALE_PORT": "9915"}
    both = dict(stale)  # two slices: Ray's own fresh values, kept
    assert driver.drop_stale_slices(both, world_size=8) == []
    assert both == stale


def test_a_slice_count_that_is_not_the_groups_is_refused_not_waited_on(tmp_path):
    """A count no one fixed (a Ray that stopped writing them, a pod spec that sets
    them) fails the worker with a line saying so, never retried, instead of libtpu
    waiting for slices that are not there."""
    driver = _driver_module(tmp_path, 2)  # v6e-16 x2: 4 hosts a slice
    driver.check_slices({"MEGASCALE_NUM_SLICES": "2"}, world_size=8)  # Ray's own
    driver.check_slices({}, world_size=4)  # one slice, dropped
    with pytest.raises(RuntimeError, match="MEGASCALE_NUM_SLICES=2 on a worker group of 1 "):
        driver.check_slices({"MEGASCALE_NUM_SLICES": "2"}, world_size=4)
    with pytest.raises(RuntimeError, match=driver.NOT_RETRIED):
        driver.check_slices({"MEGASCALE_NUM_SLICES": "3"}, world_size=8)


JOINED_BY_RAY = """
import socket
from ray.train.v2.jax.config import _setup_jax_distributed_environment
from rlctl.core.k8s import backends
from rlctl.core.trainer.runtime.distributed import initialize

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
# what Ray Train's JAX backend runs on each worker before the train loop (on CPU here:
# JAX_PLATFORMS=cpu takes its third branch, the same jax.distributed.initialize call)
_setup_jax_distributed_environment(f"127.0.0.1:{port}", 1, 0, use_tpu=False, use_gpu=False,
                                   resources_per_worker={})
# a multi-slice TPU worker's env, which alone would make rlctl initialize JAX itself
topo = initialize({"MEGASCALE_NUM_SLICES": "2"})
print("topology", topo.process_index, topo.process_count)
"""


def test_the_pod_entry_keeps_the_jax_job_ray_joined(tmp_path):
    """Ray Train's own setup function (the one JaxTrainer runs on every TPU/GPU worker)
    initializes jax.distributed; the pod entry's ``distributed.initialize`` then takes
    it as it is instead of initializing a second time (which JAX refuses)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    r = subprocess.run(
        [sys.executable, "-c", JOINED_BY_RAY],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "topology 0 1" in r.stdout
