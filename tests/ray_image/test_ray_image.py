"""The Ray backend as the TPU image runs it: its exact lock, KubeRay's commands, for real.

Runs only in the environment ``.ci/ray-image`` makes (the TPU image's lock installed with
``--no-deps`` on the image's CPython, as its Dockerfile does; ``RLCTL_IMAGE_LOCK`` names
that lock): tests/conftest.py leaves this folder out of every other venv.

What a RayJob does on GKE, minus the cluster: the head pod's ``ray start`` (its rendered
``rayStartParams`` completed as KubeRay v1.6.1 completes them, tests/fakes/controllers.py),
the head's rendered readiness and liveness probes answered (KubeRay marks the head Ready,
and only then submits), a worker node as a worker pod starts it, then the submitter's own
shell line (``ray job submit --no-wait`` + ``ray job logs --follow``) with the rendered
entrypoint and driver, training the tiny model to a checkpoint in a gs:// run store on
fake-gcs-server.

Local stand-ins, each because two pods become one machine here: the worker node's ports
are moved off the head's (every pod has its own network namespace on GKE), it offers 2
CPUs instead of its TPU host (the driver's ``RLCTL_RAY_DEVICE=cpu``: one CPU worker), the
ConfigMap's mount ``/etc/rlctl`` is a temporary folder, and the run store's endpoint and
a throwaway key are in the nodes' environment (tests/core/runs/test_ray_driver.py says why).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.core.runs.test_ray_driver import _throwaway_key, tiny_spec, write_run
from tests.fakes import controllers as kuberay

pytestmark = [pytest.mark.trainer, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
RUN = "ray-image"
BIN = Path(sys.executable).parent  # the image venv's ray, python


def test_this_venv_is_the_images_lock():
    """Every package of the lock, at its version, and nothing of ray[default] missing:
    the environment is the image's, not a developer's."""
    from importlib.metadata import version

    from rlctl.core.image.context import canonical
    from rlctl.core.image.lock import parse_lock

    lock = Path(os.environ["RLCTL_IMAGE_LOCK"])
    pinned = parse_lock(lock.read_text())
    wrong = {
        n: (v, _installed(version, n)) for n, v in pinned.items() if _installed(version, n) != v
    }
    assert not wrong, f"installed versions differ from {lock.name}: {wrong}"
    assert canonical("ray") in pinned


def _installed(version, name: str) -> str | None:
    try:
        return version(name)
    except Exception:
        return None


def _render(spec, store, shape=None, max_restarts: int = 0):
    """The run's objects as ``render_run`` renders them, less its schema validation (the
    image has no 'k8s' extra: that runs where rlctl submits, and in the main suite), on
    one v6e-16 slice unless ``shape`` is given."""
    from rlctl.core.k8s.render import render_workload
    from rlctl.core.runs.submit import ClusterOptions, _named, build_view
    from tests.fakes.shapes import v6e_16

    bucket = store.uri[len("gs://") :].split("/", 1)[0]
    on_gcs = _named(
        spec.model_copy(
            update={
                "model": spec.model.model_copy(
                    update={"source": f"gs://{bucket}/models/tiny-llama"}
                )
            }
        ),
        store,
    )
    objs = render_workload(
        build_view(
            on_gcs,
            "ray",
            shape or v6e_16(1),
            store.run(spec.name).uri,
            ClusterOptions(image="us-docker.pkg.dev/p/r/rlctl:1", max_restarts=max_restarts),
            False,
        )
    )
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap"]
    (rj,) = [o for o in objs if o["kind"] == "RayJob"]
    return rj, cm["data"]


def _env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}


def _groups(rayjob: dict) -> tuple[dict, dict, dict, dict]:
    """(the head group, its container, the one worker group, its container)."""
    cluster = rayjob["spec"]["rayClusterSpec"]
    head = cluster["headGroupSpec"]
    (group,) = cluster["workerGroupSpecs"]
    return (
        head,
        head["template"]["spec"]["containers"][0],
        group,
        group["template"]["spec"]["containers"][0],
    )


def _mounted(rayjob: dict, files: dict[str, str], tmp_path: Path) -> str:
    """The ConfigMap's files where the pods mount it (a folder here); the entrypoint
    pointed there."""
    etc = tmp_path / "etc-rlctl"
    etc.mkdir()
    for name, text in files.items():
        (etc / name).write_text(text)
    entry = rayjob["spec"]["entrypoint"].replace("/etc/rlctl/", f"{etc}/")
    assert entry != rayjob["spec"]["entrypoint"]
    return entry


def _node_env(pod_env: dict[str, str], gcs_url: str, tmp_path: Path, ray_tmp: str) -> dict:
    """The Ray nodes' environment: this one's (no RAY_*), the pods' own variables, and
    the local stand-ins: the run store's endpoint and a throwaway key, the image venv's
    ray on PATH, JAX on the CPU, a fresh home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(pod_env)
    env.update(
        {
            "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
            "PYTHONPATH": str(REPO),  # tests.fakes.rewards in the workers
            "JAX_PLATFORMS": "cpu",
            "STORAGE_EMULATOR_HOST": gcs_url,
            "CLOUD_STORAGE_EMULATOR_ENDPOINT": gcs_url,
            "GOOGLE_APPLICATION_CREDENTIALS": str(_throwaway_key(tmp_path / "key.json")),
            "RLCTL_STAGING_DIR": str(tmp_path / "staging"),
            "RAY_TMPDIR": ray_tmp,
            "RAY_USAGE_STATS_ENABLED": "0",
            # a pod's fresh home: Ray 2.60 turns token auth on by itself where ~/.ray/auth_token
            # exists (any local ray.init() writes one), which no pod of the image has
            "HOME": str(tmp_path / "home"),
        }
    )
    (tmp_path / "home").mkdir(exist_ok=True)
    return env


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def _answers(url: str, seconds: float) -> int:
    """The first non-connection-refused status of ``url`` within ``seconds`` (0: none)."""
    deadline = time.monotonic() + seconds
    code = 0
    while time.monotonic() < deadline:
        code = _get(url)
        if code == 200:
            return code
        time.sleep(1)
    return code


def _free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _stop(p: subprocess.Popen) -> None:
    import signal

    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(wait)
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):  # the group outlives its leader: the
        os.killpg(p.pid, signal.SIGKILL)  # raylet, GCS, dashboard


def _probe_url(probe: dict) -> str:
    get = probe["httpGet"]
    return f"http://127.0.0.1:{get['port']}{get['path']}"


def test_the_rayjob_starts_probes_and_trains_from_the_images_lock(
    gcs, gcs_server_url, tiny_model_dir, tmp_path
):
    from rlctl.core.store import open_store

    client, bucket = gcs
    store = open_store(f"gs://{bucket}/runs")
    spec = tiny_spec(RUN, store.uri, str(tiny_model_dir))
    rayjob, files = _render(spec, store)
    write_run(spec, store)

    head, head_c, group, worker_c = _groups(rayjob)
    entry = _mounted(rayjob, files, tmp_path)
    ray_tmp = tempfile.mkdtemp(prefix="rlimg")  # AF_UNIX paths stay short
    # the pods' own env (RLCTL_RUN, ...); the driver's one-CPU-worker mode
    env = _node_env(_env_of(head_c), gcs_server_url, tmp_path, ray_tmp)
    env["RLCTL_RAY_DEVICE"] = "cpu"
    head_cmd = kuberay.ray_start_command(
        head["rayStartParams"], head=True, limits=head_c["resources"].get("limits")
    )
    # the worker pod's start: the rendered params, its own ports (another pod on GKE),
    # and 2 CPUs for the TPU host's resources
    worker_params = {
        **group["rayStartParams"],
        "address": "127.0.0.1:6379",
        "metrics-export-port": "28080",
        "dashboard-agent-listen-port": "52366",
        "dashboard-agent-grpc-port": "52367",
        "runtime-env-agent-port": "52368",
        "node-manager-port": "52369",
        "num-cpus": "2",
        "memory": str(2 << 30),
    }
    worker_cmd = kuberay.ray_start_command(worker_params, head=False)
    # the pods' own ports: another Ray on this machine would answer in their place
    busy = [
        port
        for port in (
            6379,
            kuberay.DASHBOARD_PORT,
            kuberay.AGENT_PORT,
            10001,
            kuberay.METRICS_PORT,
            52366,
        )
        if not _free(port)
    ]
    assert not busy, f"ports {busy} are taken: is another Ray running here? ('ray stop')"
    procs: list[subprocess.Popen] = []
    log = (tmp_path / "nodes.log").open("w")
    try:
        procs.append(
            subprocess.Popen(
                head_cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )
        ready, alive = _probe_url(head_c["readinessProbe"]), _probe_url(head_c["livenessProbe"])
        assert {ready: _answers(ready, 90), alive: _answers(alive, 30)} == {
            ready: 200,
            alive: 200,
        }, (tmp_path / "nodes.log").read_text()[-4000:]

        procs.append(
            subprocess.Popen(
                worker_cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )
        worker_probe = _probe_url(worker_c["readinessProbe"]).replace(
            f":{kuberay.AGENT_PORT}/", ":52366/"
        )
        assert _answers(worker_probe, 60) == 200, (tmp_path / "nodes.log").read_text()[-4000:]

        dashboard = f"127.0.0.1:{kuberay.DASHBOARD_PORT}"
        job_id = f"{RUN}-abcde"
        line = kuberay.submitter_command(
            {**rayjob, "spec": {**rayjob["spec"], "entrypoint": entry}}, dashboard, job_id
        )
        t0 = time.monotonic()
        sub = subprocess.run(
            ["bash", "-ec", line], env=env, capture_output=True, text=True, timeout=480
        )
        took = time.monotonic() - t0
        out = sub.stdout + sub.stderr
        status = subprocess.run(
            [str(BIN / "ray"), "job", "status", "--address", f"http://{dashboard}", job_id],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert sub.returncode == 0 and f"Job '{job_id}' succeeded" in status.stdout, (
            out[-6000:] + status.stdout + status.stderr
        )
    finally:  # each node's process group, as a pod's end stops it ('ray stop' would
        # stop every Ray on the machine)
        for p in reversed(procs):
            _stop(p)
        log.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)

    b = client.bucket(bucket)
    st = json.loads(b.blob(f"runs/{RUN}/status.json").download_as_text())
    assert (st["phase"], st["step"], st["latest_checkpoint"]) == ("completed", 2, 2), st
    assert b.blob(f"runs/{RUN}/checkpoints/2/COMMITTED").exists()
    # the trainer's lines in the run's own log (what rlctl logs reads for every backend)
    train_log = b.blob(f"runs/{RUN}/train.log").download_as_text()
    assert "step 2/2" in train_log, train_log[-3000:]
    # and in the submitter's output ('ray job logs --follow'): the pod-log fallback
    assert '"event": "done"' in out, out[-6000:]
    print(f"submitted job ran {took:.1f} s")
