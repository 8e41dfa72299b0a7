"""The CLI as a script drives it: ``rlctl`` in a subprocess, pointed at the GCP fake
(started on its own with ``python -m tests.fakes.serve``) through the environment
only, renders every backend's manifests with ``--dry-run -o json``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KINDS = {"jobset": "JobSet", "pathways": "PathwaysJob", "ray": "RayJob"}


@pytest.fixture(scope="module")
def fake_url(tmp_path_factory) -> Iterator[str]:
    url_file = tmp_path_factory.mktemp("fake") / "url"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.fakes.serve",
            "--port",
            "0",
            "--cluster",
            "rl",
            "--accelerator",
            "v6e-16 x2",
            "--dcn-networks",
            "2",
            "--url-file",
            str(url_file),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not url_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the fake did not start: {proc.stderr.read() if proc.stderr else ''}")
            time.sleep(0.05)
        url = url_file.read_text().strip()
        assert proc.stdout is not None and proc.stdout.readline().strip() == url
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _rlctl(args: list[str], url: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("RLCTL_", "GOOGLE_", "CLOUDSDK_"))
    }
    env.update(
        HOME=str(home),
        CLOUDSDK_CONFIG=str(home / "gcloud"),
        RLCTL_AUTH_DISABLE_CREDENTIALS="true",
        **{f"RLCTL_API_ENDPOINT_OVERRIDES_{s}": url for s in ("COMPUTE", "CONTAINER", "STORAGE")},
    )
    return subprocess.run(
        [sys.executable, "-m", "rlctl", *args],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("backend", sorted(KINDS))
def test_dry_run_renders_each_backend_against_the_fake(backend, fake_url, tmp_path):
    r = _rlctl(
        [
            "train",
            "grpo",
            "--cluster",
            "rl",
            "--project",
            "p",
            "--region",
            "us-central1",
            "--runs-dir",
            "gs://rl-runs/runs",
            "--image",
            "us-docker.pkg.dev/p/r/rlctl:1",
            "--backend",
            backend,
            "--dry-run",
            "-o",
            "json",
        ],
        fake_url,
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    manifests = json.loads(r.stdout)  # stdout is only JSON
    kinds = [m["kind"] for m in manifests]
    assert KINDS[backend] in kinds and ("ConfigMap" in kinds) == (backend == "ray")
    assert "Traceback" not in r.stderr and "nothing changed" in r.stderr


def test_a_misspelt_override_is_one_line_and_exit_2(fake_url, tmp_path):
    r = _rlctl(["cluster", "list", "--project", "p", "--region", "us-central1"], fake_url, tmp_path)
    assert r.returncode == 0, r.stderr
    env_typo = subprocess.run(
        [sys.executable, "-m", "rlctl", "cluster", "list", "--project", "p"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "RLCTL_API_ENDPOINT_OVERRIDES_CONTAINR": fake_url},
    )
    assert env_typo.returncode == 2, env_typo.stderr
    assert "unknown service 'containr'" in env_typo.stderr
    assert "Traceback" not in env_typo.stderr
