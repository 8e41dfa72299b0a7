"""The image holds what the workloads run in it: every command of every backend's rendered
containers, and what KubeRay runs in the Ray containers on its own (``ray start`` through
bash, its wget probes), is provided by the base image or installed by the Dockerfile
(apt) or the lock; the pod entry module is in rlctl's wheel and imports from it; and the
Dockerfile resolves nothing while it builds."""

from __future__ import annotations

import functools
import io
import os
import shlex
import subprocess
import sys
import zipfile

import pytest

from rlctl.core.image.context import (
    ACCELERATORS,
    build_wheel,
    canonical,
    install_format_args,
    pins,
    read_lock,
    render_dockerfile,
    requirements,
)
from rlctl.core.image.lock import parse_lock
from rlctl.core.k8s.render import render_workload
from tests.core.k8s.test_render import CASES, pod_specs, view

IMAGE = "us-docker.pkg.dev/p/r/rlctl:1"  # the image view() renders (tests/core/k8s/test_render.py)

# python:3.11-slim-bookworm: the official Python image puts CPython (python, python3, pip)
# in /usr/local/bin on debian:bookworm-slim, whose essential packages bring bash, dash (sh),
# grep and coreutils
BASE = {"python", "python3", "pip", "bash", "sh", "grep"}
# what the Dockerfile's apt packages put on PATH (Debian's wget package: /usr/bin/wget)
APT = {"wget": {"wget"}}
# what the lock's wheels put on PATH (ray's console_scripts entry point 'ray')
WHEELS = {"ray": {"ray"}}
# What KubeRay (ray-project/kuberay, ray-operator) runs in the Ray containers, which carry no
# command of ours: each Ray node starts with /bin/bash -lc -- "ulimit -n 65536; ray start ..."
# (controllers/ray/common/pod.go); the probes it injects where the template sets none are
# exec 'bash -c "wget -T 2 -q -O- http://localhost:52365/api/local_raylet_healthz | grep
# success"' (and, on the head, .../8265/api/gcs_healthz; utils/constant.go,
# BaseWgetHealthCommand); the RayJob's submitter (K8sJobMode) runs 'ray job submit' in a
# Job whose image is the head's
KUBERAY = {"bash", "ray", "wget", "grep"}


@functools.cache
def wheel_files() -> frozenset[str]:
    with zipfile.ZipFile(io.BytesIO(build_wheel())) as z:
        return frozenset(z.namelist())


def dockerfile(acc: str):
    from dockerfile_parse import DockerfileParser

    return DockerfileParser(fileobj=io.BytesIO(render_dockerfile(acc).encode()))


def runs(acc: str) -> list[list[str]]:
    """The Dockerfile's RUN instructions, each as its '&&'-separated commands (words)."""
    return [
        [shlex.split(c) for c in i["value"].split("&&")]
        for i in dockerfile(acc).structure
        if i["instruction"] == "RUN"
    ]


def apt_installed(acc: str) -> set[str]:
    return {
        w
        for run in runs(acc)
        for cmd in run
        if cmd[:2] == ["apt-get", "install"]
        for w in cmd[2:]
        if not w.startswith("-")
    }


def system(acc: str) -> set[str]:
    """The commands on the image's PATH that are not from the lock, and why they are there."""
    return BASE | {x for pkg in apt_installed(acc) for x in APT.get(pkg, ())}


def from_lock(acc: str) -> set[str]:
    """The commands on the image's PATH that the lock's wheels bring."""
    locked = parse_lock(read_lock(acc))
    return {x for dist, exes in WHEELS.items() if dist in locked for x in exes}


def needed(objs: list[dict]) -> set[str]:
    """The commands the workload runs in the image: each container's own (and its exec
    probes'), KubeRay's in the Ray containers, and a RayJob's entrypoint."""
    out: set[str] = set()
    for o in objs:
        for spec in pod_specs(o):
            for c in [*spec["containers"], *spec.get("initContainers", [])]:
                if c["image"] != IMAGE:
                    continue
                if c.get("command"):
                    out.add(c["command"][0])
                elif o["kind"] == "RayJob":
                    out |= KUBERAY
                else:
                    pytest.fail(f"{o['kind']} container {c['name']} runs the image's CMD")
                for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                    if "exec" in c.get(probe, {}):
                        out.add(c[probe]["exec"]["command"][0])
        if o["kind"] == "RayJob":
            out.add(shlex.split(o["spec"]["entrypoint"])[0])
    return out


@pytest.mark.parametrize(("backend", "kind", "slices"), CASES)
def test_every_command_the_workload_runs_is_in_its_image(backend, kind, slices):
    objs = render_workload(view(backend, kind, slices))
    want = needed(objs)
    assert want, "no container of the image found"
    wheel_exes = {x for exes in WHEELS.values() for x in exes}
    missing = want - system(kind) - wheel_exes
    assert not missing, f"not in the {kind} image: {sorted(missing)}"
    assert want & wheel_exes <= from_lock(kind), f"not locked: {sorted(want - from_lock(kind))}"
    for o in objs:  # 'python -m MODULE': the module is in rlctl's wheel
        for spec in pod_specs(o):
            for c in spec["containers"]:
                cmd = c.get("command") or []
                if cmd[:2] == ["python", "-m"]:
                    assert cmd[2].replace(".", "/") + ".py" in wheel_files(), cmd


@pytest.mark.parametrize("acc", ACCELERATORS)
class TestTheDockerfile:
    def test_wget_comes_from_apt_with_no_lists_left(self, acc):
        """KubeRay's probes need wget, which the slim base image lacks."""
        run = next((r for r in runs(acc) if any(c[:2] == ["apt-get", "install"] for c in r)), None)
        assert run, "the Dockerfile installs no Debian package (wget for KubeRay's probes)"
        install = next(c for c in run if c[:2] == ["apt-get", "install"])
        assert run[0] == ["apt-get", "update"]
        assert {"-y", "--no-install-recommends", "wget"} <= set(install)
        assert run[-1] == ["rm", "-rf", "/var/lib/apt/lists/*"]
        assert "wget" in system(acc) and "wget" not in BASE

    def test_ray_is_locked_and_on_path(self, acc):
        assert "ray" in parse_lock(read_lock(acc))
        assert ["ray", "--version"] in [c for r in runs(acc) for c in r]  # checked at build

    def test_it_installs_the_lock_and_resolves_nothing(self, acc):
        """Every pip install is --no-deps; the lock (the context's requirements.txt) goes in
        with wheels only but the named sdists; rlctl's wheel has no extras to resolve."""
        pips = [c for r in runs(acc) for c in r if c[:2] == ["pip", "install"]]
        resolving = [" ".join(c) for c in pips if "--no-deps" not in c]
        assert pips and not resolving, f"pip resolves while the image builds: {resolving}"
        lock_install = next(c for c in pips if "-r" in c)
        assert lock_install[lock_install.index("-r") + 1] == "/tmp/rlctl/requirements.txt"
        fmt = [w for w in lock_install if w.startswith(("--only-binary", "--no-binary"))]
        assert fmt == install_format_args()
        tools = next(c for c in pips if "-c" in c)  # the build tools, at the lock's versions
        assert tools[tools.index("-c") + 1] == "/tmp/rlctl/requirements.txt"
        assert [w for w in tools if not w.startswith("-")][2:] == [
            "/tmp/rlctl/requirements.txt",
            *pins().build_tools,
        ]
        assert requirements(acc) == read_lock(acc)
        wheel = next(c for c in pips if any(w.endswith(".whl") for w in c))
        assert wheel[-1].endswith("-py3-none-any.whl")  # no [extras]
        locked = parse_lock(read_lock(acc))
        assert all(canonical(t) in locked for t in pins().build_tools)


def test_the_pod_entry_module_imports_from_the_wheel(tmp_path):
    """The containers run 'python -m rlctl.core.runs.pod': it is in the wheel, and that
    copy (not this checkout's) imports."""
    with zipfile.ZipFile(io.BytesIO(build_wheel())) as z:
        assert "rlctl/core/runs/pod.py" in z.namelist()
        z.extractall(tmp_path)
    code = (
        "import rlctl.core.runs.pod as m, sys; "
        f"assert m.__file__.startswith({str(tmp_path)!r}), m.__file__; print('ok')"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
