"""Below the registry, no code compares a backend's name or its workload's kind.

A backend is resolved once (``backends.get`` / ``backends.resolve`` where a run is
submitted or opened) and then asked; a ``backend == "pathways"`` or ``kind ==
"RayJob"`` elsewhere is a piece of a backend living outside its folder, which a new
backend would silently miss. This reads every module of rlctl (but the backends'
own folder) and fails on any comparison (``==``, ``!=``, ``in``, ``not in``, ``match``
case) of a value with a registered backend's name or object kind.
"""

from __future__ import annotations

import ast
from pathlib import Path

import rlctl
from rlctl.core.k8s import backends

ROOT = Path(rlctl.__file__).parent
ALLOWED = ROOT / "core" / "k8s" / "backends"


def forbidden() -> set[str]:
    out = set()
    for b in backends.registered():
        out.add(b.name)
        out.update(b.object_kinds)
    return out


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in _strings(e)]
    return []


def comparisons(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of each comparison of something with one of ``names``."""
    found = []
    for node in ast.walk(tree):
        operands: list[ast.AST] = []
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            operands = [node.value]
        for op in operands:
            found += [(op.lineno, s) for s in _strings(op) if s in names]
    return found


# (module, string) pairs where the string means something else, each with why
HOMONYMS = {
    # a jax.distributed mode (JAX's Pathways proxy), which any backend's pods may use
    ("rlctl/core/trainer/runtime/distributed.py", "pathways"),
}


def offenders(root: Path = ROOT, allowed: Path = ALLOWED) -> list[str]:
    names = forbidden()
    out = []
    for path in sorted(root.rglob("*.py")):
        if allowed in path.parents:
            continue
        where = str(path.relative_to(root.parent))
        tree = ast.parse(path.read_text(), str(path))
        out += [
            f"{where}:{line}: {s!r}"
            for line, s in comparisons(tree, names)
            if (where, s) not in HOMONYMS
        ]
    return out


def test_no_module_outside_the_backends_compares_a_backend_name_or_kind():
    assert offenders() == []


def test_it_would_catch_one(tmp_path):
    (tmp_path / "ok.py").write_text('x = backend.pod_groups(obj)\nname = "ray"\n')
    (tmp_path / "bad.py").write_text(
        'if backend == "pathways":\n    pass\n'
        'ok = kind in ("JobSet", "other")\n'
        'match b:\n    case "ray":\n        pass\n'
    )
    (tmp_path / "backends").mkdir()
    (tmp_path / "backends" / "mine.py").write_text('mine = kind == "RayJob"\n')
    assert offenders(tmp_path, tmp_path / "backends") == [
        f"{tmp_path.name}/bad.py:1: 'pathways'",
        f"{tmp_path.name}/bad.py:3: 'JobSet'",
        f"{tmp_path.name}/bad.py:5: 'ray'",
    ]
