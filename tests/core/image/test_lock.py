"""Each image's lock (rlctl/data/image-<acc>.lock.txt): every package pinned, made from the
current inputs, complete, and installable on the image's platform.

The last two ask PyPI with pip, as ``python -m rlctl.core.image.lock`` does: a pin that
cannot be installed there, or a package the lock lacks, fails CI here instead of a
user's ``rlctl image build``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from rlctl.core.errors import ConfigError
from rlctl.core.image import lock
from rlctl.core.image.context import (
    canonical,
    image_names,
    install_format_args,
    pins,
    read_lock,
)

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("acc", image_names())
class TestTheRecordedLock:
    def test_every_line_is_one_exact_pin(self, acc):
        text = read_lock(acc)
        lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
        assert all(re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.+!_-]+", ln) for ln in lines)
        got = lock.parse_lock(text)
        assert len(got) == len(lines)  # no package twice

    def test_it_was_made_from_the_current_inputs(self, acc):
        """images.yaml's pins and rlctl's dependencies as the lock's header records them:
        a change to either without 'python -m rlctl.core.image.lock' fails here, offline."""
        want = lock.header_inputs(acc, lock.inputs(acc, lock.installed_requires_dist()))
        assert lock.recorded_inputs(read_lock(acc)) == want, (
            "stale lock: run 'python -m rlctl.core.image.lock'"
        )

    def test_it_holds_the_pins_and_what_the_image_runs(self, acc):
        got = lock.parse_lock(read_lock(acc))
        p = pins().images[acc]
        for req in [*p.requirements, *p.no_deps, *pins().sdists]:
            name, version = req.split("==")
            assert got[canonical(name.split("[")[0])] == version, req
        for tool in pins().build_tools:
            assert canonical(tool) in got
        # the trainer, Ray (its 'ray' command) and, for TPUs, the runtime jax[tpu] names
        assert {"google-tunix", "jax", "jaxlib", "ray"} <= set(got)
        assert ("libtpu" in got) == (acc == "tpu")
        assert ("vllm" in got) == acc.endswith("-vllm")

    def test_it_agrees_with_the_versions_the_tests_passed_with(self, acc):
        """The lock prefers constraints.txt (what rlctl's tests passed with): a package in
        both has one version, so the image runs the trainer stack CI checked."""
        tested = lock.parse_lock(
            "\n".join(ln for ln in (ROOT / "constraints.txt").read_text().splitlines())
        )
        got = lock.parse_lock(read_lock(acc))
        differ = {n: (got[n], tested[n]) for n in got.keys() & tested.keys() if got[n] != tested[n]}
        # but what images.yaml says the image cannot take (gpu-vllm: vLLM's numba)
        for name in pins().images[acc].unpreferred:
            differ.pop(canonical(name), None)
        assert not differ, (
            f"lock vs constraints.txt: {differ}; regenerate the lock: "
            "python -m rlctl.core.image.lock"
        )


class TestThePureHelpers:
    def test_rlctl_requirements_for_the_extras(self):
        rd = [
            "typer<0.30,>=0.29",
            'jax<0.11,>=0.10.2; extra == "train"',
            'kubernetes>=30; extra == "k8s"',
            'rlctl[gcp,k8s,train]; extra == "all"',
            'tomli>=2; python_version < "3.11"',
        ]
        assert lock.rlctl_requirements(rd, ["train", "gcp"]) == [
            "typer<0.30,>=0.29",
            "jax<0.11,>=0.10.2",
            'tomli>=2; python_version < "3.11"',
        ]
        with pytest.raises(ConfigError, match="names rlctl itself"):
            lock.rlctl_requirements(rd, ["all"])
        with pytest.raises(ConfigError, match="cannot tell"):
            lock.rlctl_requirements(['x; extra == "train" and os_name == "nt"'], ["train"])

    def test_pip_runs_without_this_machines_pip_settings(self):
        env = lock.pip_env(
            {
                "PIP_FIND_LINKS": "/opt/wheels",
                "PIP_INDEX_URL": "file:///m",
                "PIP_CONSTRAINT": "/etc/c.txt",
                "PIP_CERT": "/etc/ca.crt",
                "HOME": "/root",
            }
        )
        assert env["PIP_CONFIG_FILE"] == "/dev/null" and env["PIP_CERT"] == "/etc/ca.crt"
        assert not {"PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_CONSTRAINT"} & set(env)
        assert env["HOME"] == "/root"

    def test_wheels_only_but_the_named_sdists(self):
        # --only-binary=:all: must come first: pip applies format options in order
        assert install_format_args() == ["--only-binary=:all:", "--no-binary=promise"]

    def test_the_lock_names_only_exact_pins(self):
        assert lock.parse_lock("# c\nA_b==1.0  # x\n\n") == {"a-b": "1.0"}
        for bad in ("a>=1", "a", "a[x]==1", "a==1; os_name == 'nt'"):
            with pytest.raises(ConfigError, match="NAME==VERSION"):
                lock.parse_lock(bad)

    def test_render_lists_the_report_sorted_then_no_deps(self):
        report = {
            "install": [
                {"metadata": {"name": "Zeta", "version": "2"}},
                {"metadata": {"name": "alpha_x", "version": "1"}},
            ]
        }
        text = lock.render_lock("gpu", report, ["ray[train]==2.60.0"], "constraints.txt")
        body = [ln for ln in text.splitlines() if not ln.startswith("#")]
        assert body == ["alpha-x==1", "zeta==2", *pins().images["gpu"].no_deps]
        assert lock.recorded_inputs(text) == lock.header_inputs("gpu", ["ray[train]==2.60.0"])

    def test_the_generator_refuses_another_platform(self, monkeypatch):
        monkeypatch.setattr(sys, "platform", "darwin")
        with pytest.raises(ConfigError, match="Linux x86_64"):
            lock.check_host()


# --- against PyPI ------------------------------------------------------------------------
# Four pip runs that mostly wait on PyPI (about 7 minutes one after another on CI's
# machine, stop 59). They start beside the suite as soon as it is collected
# (``start_beside``, called by tests/conftest.py's ``pytest_collection_finish``) and each
# test reads its own run's result: their waiting overlaps the other tests. A test whose
# run was not started beside (PyPI unreachable then, or the module run alone) runs it
# itself, as before.
_BESIDE: dict[tuple[str, str], Future[Any]] = {}


def _pypi_reachable() -> bool:
    import socket

    from tests.conftest import _real_connect

    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        addr = socket.getaddrinfo("pypi.org", 443, socket.AF_INET, socket.SOCK_STREAM)[0][4]
        _real_connect(s, addr)  # the suite's sockets reach loopback only
        return True
    except OSError:
        return False
    finally:
        s.close()


def _installs(acc: str) -> tuple[int, str, dict[str, str] | None]:
    """pip's dry-run install of ``acc``'s lock on the image's platform: (exit status, its
    stderr's tail, the versions it would install)."""
    with tempfile.TemporaryDirectory(prefix="rlctl-lock-") as tmp:
        work = Path(tmp)
        report = work / "report.json"
        (work / "lock.txt").write_text(read_lock(acc))
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--quiet",
            "--no-deps",
            "--ignore-installed",
            "--target",
            str(work / "t"),
            "--report",
            str(report),
            *lock.platform_args(),
            *install_format_args(),
            "--index-url",
            lock.PYPI,
            "-r",
            str(work / "lock.txt"),
        ]
        r = subprocess.run(
            cmd, capture_output=True, text=True, timeout=540, env=lock.pip_env(os.environ)
        )
        got = lock.versions(json.loads(report.read_text())) if r.returncode == 0 else None
        return r.returncode, r.stderr[-3000:], got


def _resolves(acc: str) -> dict[str, str]:
    """The versions pip resolves for ``acc``'s inputs with its lock as constraints."""
    with tempfile.TemporaryDirectory(prefix="rlctl-lock-") as tmp:
        work = Path(tmp)
        (work / "lock.txt").write_text(read_lock(acc))
        reqs = lock.inputs(acc, lock.installed_requires_dist())
        return lock.versions(lock.resolve(reqs, work / "work", [work / "lock.txt"]))


_JOBS: dict[str, Callable[[str], Any]] = {
    "test_every_pin_installs_on_the_image_platform": _installs,
    "test_the_lock_is_complete_and_consistent": _resolves,
}


def start_beside(items: list[pytest.Item]) -> None:
    """Start the PyPI runs of the selected tests among ``items`` in threads (each a pip
    subprocess): once per session, only when PyPI answers, never on a host the lock
    generator refuses (its test skips there)."""
    wanted = [
        (item.originalname, item.callspec.params["acc"])
        for item in items
        if isinstance(item, pytest.Function)
        and item.originalname in _JOBS
        and item.module is sys.modules[__name__]
    ]
    if _BESIDE or not wanted or not _pypi_reachable():
        return
    try:
        lock.check_host()
    except ConfigError:
        wanted = [w for w in wanted if _JOBS[w[0]] is not _resolves]
    pool = ThreadPoolExecutor(max_workers=max(1, len(wanted)), thread_name_prefix="pypi")
    for name, acc in wanted:
        _BESIDE[(name, acc)] = pool.submit(_JOBS[name], acc)
    pool.shutdown(wait=False)


@pytest.fixture(autouse=True, scope="module")
def _started_beside(request):
    """Under pytest-xdist, the PyPI runs start with this module's first test (the
    conftest's collection hook leaves them to it there); a no-op once started."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        start_beside(request.session.items)


def _result(name: str, acc: str) -> Any:
    beside = _BESIDE.pop((name, acc), None)
    return beside.result() if beside is not None else _JOBS[name](acc)


@pytest.fixture()
def pypi(monkeypatch):
    """PyPI for this test (the suite allows only loopback); skipped when unreachable,
    which CI (CI=true) turns into a failure."""
    import socket

    from tests.conftest import _real_connect

    monkeypatch.setattr(socket.socket, "connect", _real_connect)
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
    except OSError:
        pytest.skip("PyPI is not reachable")


@pytest.mark.slow
@pytest.mark.parametrize("acc", image_names())
def test_every_pin_installs_on_the_image_platform(acc, pypi):
    """pip finds each pin of the lock for the base image's CPython and glibc (wheels only,
    but the named sdists), with the image's own options: what the Dockerfile installs."""
    returncode, stderr, got = _result("test_every_pin_installs_on_the_image_platform", acc)
    assert returncode == 0, stderr
    assert got == lock.parse_lock(read_lock(acc))


@pytest.mark.slow
@pytest.mark.parametrize("acc", image_names())
def test_the_lock_is_complete_and_consistent(acc, pypi):
    """Resolving the image's inputs with its lock as constraints (dependencies on) adds
    nothing and moves nothing: every package pip would install is in the lock at the
    lock's version, and the lock holds nothing else but images.yaml's no_deps."""
    try:
        lock.check_host()
    except ConfigError as e:
        pytest.skip(str(e))
    got = _result("test_the_lock_is_complete_and_consistent", acc)
    locked = lock.parse_lock(read_lock(acc))
    missing = {n: v for n, v in got.items() if n not in locked}
    moved = {n: (v, locked[n]) for n, v in got.items() if n in locked and locked[n] != v}
    assert not missing, f"resolved but not in the lock: {missing}"
    assert not moved, f"resolved at another version than the lock's: {moved}"
    no_deps = {canonical(n.split("==")[0]) for n in pins().images[acc].no_deps}
    assert set(locked) - no_deps == set(got), "in the lock but not needed"
