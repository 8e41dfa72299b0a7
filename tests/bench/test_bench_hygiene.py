"""The benchmarks as a package: every script imports as ``bench.NAME`` and runs by its
path too, without editing ``sys.path``, and none rebinds anything of ``rlctl`` (a bench
that patched the package measured a package nobody runs, and left it patched for
whatever ran after it in the process)."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# the scripts and the modules of bench's own packages (bench/fuzz/: the fuzzer's parts)
SCRIPTS = sorted(p for p in (REPO / "bench").rglob("*.py") if p.name != "__init__.py")


def _module(path: Path) -> str:
    """``bench/fuzz/loader.py`` -> ``bench.fuzz.loader``."""
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def _id(path: Path) -> str:
    return str(path.relative_to(REPO / "bench"))


def _rlctl_names(tree: ast.Module) -> set[str]:
    """The names a file binds to rlctl's modules and classes (``import rlctl...``,
    ``from rlctl... import X [as Y]``), at any depth."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "rlctl":
                    names.add(a.asname or "rlctl")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "rlctl":
            names.update(a.asname or a.name for a in node.names)
    return names


def _root(node: ast.AST) -> str | None:
    """The name an attribute chain starts from (``a`` of ``a.b.c``)."""
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _flat(targets: list[ast.expr]) -> list[ast.expr]:
    """Assignment targets with tuples and lists unpacked (``a.x, b = ...``)."""
    out: list[ast.expr] = []
    for t in targets:
        out += _flat(list(t.elts)) if isinstance(t, ast.Tuple | ast.List) else [t]
    return out


def offences(source: str) -> list[str]:
    """Each line of ``source`` that edits ``sys.path`` or rebinds something of rlctl."""
    tree = ast.parse(source)
    rlctl = _rlctl_names(tree)
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "path"
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        ):
            found.append(f"{node.lineno}: sys.path")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
        ):
            found.append(f"{node.lineno}: {node.func.id}")  # a bench has no use for either
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            for t in _flat(targets):
                while isinstance(t, ast.Subscript):  # ``ck.TABLE["cpu"] = ...`` too
                    t = t.value
                if isinstance(t, ast.Attribute) and _root(t) in rlctl:
                    found.append(f"{node.lineno}: {ast.unparse(t)} rebound")
    return sorted(found, key=lambda line: int(line.split(":")[0]))


@pytest.mark.parametrize("script", SCRIPTS, ids=_id)
def test_no_bench_edits_the_path_or_rebinds_rlctl(script):
    assert offences(script.read_text()) == []


def test_the_check_catches_each_form():
    caught = offences(
        "import sys\n"
        "import rlctl.core.trainer.run.loop\n"
        "from rlctl.core.trainer import checkpointing as ck\n"
        "from rlctl.core.trainer.update.step import Update\n"
        "sys.path.insert(0, 'x')\n"
        "sys.path[:0] = ['bench']\n"
        "ck.SAVE_IN_FLIGHT = 1\n"
        "Update.apply = len\n"
        "rlctl.core.trainer.run.loop.Trainer.step = len\n"
        "setattr(ck.Checkpoints, 'save', len)\n"
        "def f(cls):\n"
        "    setattr(cls, 'x', 1)\n"
    )
    assert [c.split(":")[0] for c in caught] == ["5", "6", "7", "8", "9", "10", "12"], caught
    # an object of its own a bench may set up as it likes
    assert (
        offences("from rlctl.core.trainer.run.loop import Trainer\nt = Trainer()\nt.x = 1\n") == []
    )


@pytest.mark.parametrize("script", [p for p in SCRIPTS if not p.name.startswith("_")], ids=_id)
def test_each_bench_imports_as_a_module_of_the_package(script):
    importlib.import_module(_module(script))


def test_a_bench_run_by_its_path_runs_as_the_module():
    """``python bench/NAME.py`` from anywhere, with nothing on PYTHONPATH: it runs again
    as ``python -m bench.NAME`` from its checkout (bench/_by_path.py), so its sibling
    and test-fake imports resolve, and the checkout's rlctl is the one it runs."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = "import bench, rlctl; print(bench.__file__); print(rlctl.__file__)"
    r = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_distributed.py"), "--help"],
        cwd="/",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "usage:" in r.stdout and "bench_distributed" in r.stdout
    where = subprocess.run(
        [sys.executable, "-c", code],
        cwd="/",
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert where.stdout.splitlines() == [
        str(REPO / "bench" / "__init__.py"),
        str(REPO / "rlctl" / "__init__.py"),
    ]
