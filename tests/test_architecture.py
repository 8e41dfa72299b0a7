"""The layers of ARCHITECTURE.md, enforced: import-linter's contracts in
pyproject.toml (every module imports only downwards; no two siblings import each
other, directly or through others) hold for the package, and break as soon as one
upward import is added."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the package at ``root``, with pyproject.toml's contracts."""
    code = (
        "import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True))"
    )
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    shutil.copy(REPO / "pyproject.toml", root)
    shutil.copytree(
        REPO / "rlctl",
        root / "rlctl",
        ignore=shutil.ignore_patterns("__pycache__", "data", "templates"),
    )
    return root


def test_the_package_keeps_its_layers_and_has_no_circle():
    r = _lint_imports(REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Contracts: 3 kept, 0 broken." in r.stdout


@pytest.mark.parametrize(
    ("module", "upward", "contract"),
    [
        # the run store reaching up into the run lifecycle
        ("rlctl/core/store/base.py", "from rlctl.core.runs import status", "layers"),
        # the trainer reaching up into the run lifecycle (the old pod entry point did)
        ("rlctl/core/trainer/rewards/loading.py", "from rlctl.core.runs import local", "layers"),
        # configuration reaching up into a GCP module (the old catalog import)
        ("rlctl/core/config/infra.py", "from rlctl.core.gcp import operations", "layers"),
        # the trainer calling Google Cloud itself instead of through the run store
        (
            "rlctl/core/trainer/checkpoint/checkpointing.py",
            "from rlctl.core import clients",
            "the trainer never imports",
        ),
        # a circle between two sibling modules of one layer
        ("rlctl/core/k8s/shapes.py", "from rlctl.core.k8s import render", "no circles"),
    ],
)
def test_one_added_upward_import_breaks_a_contract(copy, module, upward, contract):
    path = copy / module
    original = path.read_text()
    path.write_text(original + f"\n{upward}  # noqa\n")
    try:
        r = _lint_imports(copy)
    finally:
        path.write_text(original)
    assert r.returncode == 1, r.stdout
    broken = [line for line in r.stdout.splitlines() if line.endswith("BROKEN")]
    assert any(line.startswith(contract) for line in broken), r.stdout


def _trainer_imports(path: Path) -> list[str]:
    """The trainer modules ``path`` imports (``from rlctl.core.trainer import x`` as
    ``rlctl.core.trainer.x``), wherever in the file the import is."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("rlctl.core.trainer")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "rlctl.core.trainer"
        ):
            if node.module == "rlctl.core.trainer":
                found += [f"rlctl.core.trainer.{a.name}" for a in node.names]
            else:
                found.append(node.module or "")
    return found


def test_the_run_driver_reaches_the_trainer_through_its_face_alone():
    """``rlctl.core.runs`` imports ``rlctl.core.trainer.api`` and no other trainer
    module: the trainer's modules stay its own to split and move."""
    seen = {
        str(p.relative_to(REPO)): _trainer_imports(p)
        for p in sorted((REPO / "rlctl/core/runs").glob("*.py"))
    }
    assert any(seen.values())  # the driver does use the trainer
    behind = {p: [m for m in ms if m != "rlctl.core.trainer.api"] for p, ms in seen.items()}
    assert not any(behind.values()), {p: ms for p, ms in behind.items() if ms}


def type_ignores_without_a_reason(root: Path) -> list[str]:
    """Each ``# type: ignore[...]`` in ``root`` that says no reason: none after it on its
    line, and no comment on the line before."""
    import re

    out = []
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            m = re.search(r"# type: ignore\[[^\]]*\](.*)$", line)
            if m is None:
                continue
            after = m.group(1).strip()
            before = lines[i - 1].strip() if i else ""
            if not (after.startswith("#") and len(after) > 3) and not before.startswith("#"):
                out.append(f"{path.relative_to(root.parent)}:{i + 1}")
    return out


def test_every_type_ignore_says_why(tmp_path):
    assert type_ignores_without_a_reason(REPO / "rlctl") == []
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "a = f()  # type: ignore[misc]\n"
        "b = f()  # type: ignore[misc]  # the library is untyped\n"
        "# the library is untyped\n"
        "c = f()  # type: ignore[misc]\n"
    )
    assert type_ignores_without_a_reason(pkg) == ["pkg/m.py:1"]
    assert (
        len(
            re.findall(
                "type: ignore", "\n".join(p.read_text() for p in (REPO / "rlctl").rglob("*.py"))
            )
        )
        < 20
    )


def test_measurements_live_in_the_docs_not_in_docstrings():
    """A ratio measured by a bench (``0.94x``) belongs to docs/decisions/ with its date
    and bench, where the code points; the numerics table's ``MEASURED`` is data, tested."""
    found = [
        f"{p.relative_to(REPO)}:{i + 1}"
        for p in sorted((REPO / "rlctl").rglob("*.py"))
        if p.name != "numerics.py"
        for i, line in enumerate(p.read_text().splitlines())
        if re.search(r"\b\d+\.\d+x\b", line)
    ]
    assert found == []
