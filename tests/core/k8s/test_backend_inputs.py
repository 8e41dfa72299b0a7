"""What only one backend needs lives in its folder: the shared layers name no backend.

``render.py`` (the view every template reads), ``gcp/`` (the cluster plan), ``config/``
and ``runs/placement.py`` get a backend's own inputs through its hooks (``view_fields``,
``node_pools``, ``gke_addons``, ``misfit_hint``) and never name one. This reads their code
(identifiers and string values; comments and docstrings may cite a backend as an example)
and fails on any word that is a registered backend's name, its kinds, the pools it brings
or its template values. ``test_backend_names.py`` holds the weaker rule for the rest of
rlctl (no comparison with a backend's name).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import rlctl
from rlctl.core.config import catalog
from rlctl.core.k8s import backends
from rlctl.core.k8s.render import make_view
from rlctl.core.k8s.shapes import slice_shape

ROOT = Path(rlctl.__file__).parent
SHARED = [
    ROOT / "core" / "k8s" / "render.py",
    *(ROOT / "core" / "gcp").glob("*.py"),
    *(ROOT / "core" / "config").glob("*.py"),
    ROOT / "core" / "runs" / "placement.py",
]
# a word of an identifier or a string value that names a KubeRay or JobSet piece
ALSO = {"kuberay"}


# template values whose names say nothing of a backend (a view field any could have)
GENERIC = {"pool", "accelerator_type"}


def forbidden() -> set[str]:
    """Each backend's name, kinds and pools (as words of a name or a string), and its
    add-on fields and template values (as whole names)."""
    shape = slice_shape(catalog.lookup("v6e-16"), 2)
    words = set(ALSO)
    for b in backends.registered():
        view = make_view(run="r1", backend=b, image="i", run_uri="gs://b/r1", shape=shape)
        words |= {b.name, *(k.lower() for k in b.object_kinds)}
        words |= {p.name for p in b.node_pools}
        words |= {n for n in [*b.gke_addons, *b.view_fields(view)] if n not in GENERIC}
    return words


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            v = body[0].value
            if isinstance(v, ast.Constant) and isinstance(v.value, str):
                out.add(id(v))
    return out


def words_in(source: str) -> list[tuple[int, str]]:
    """(line, word) of every identifier and string value, whole and word by word."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.arg) or (isinstance(node, ast.keyword) and node.arg):
            names = [node.arg]
        elif isinstance(node, ast.alias):
            names = [node.asname or node.name]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [] if id(node) in docs else re.findall(r"[A-Za-z0-9_]+", node.value)
        line = getattr(node, "lineno", 0)
        for n in names:  # the whole name, then each of its words
            out += [(line, w.lower()) for w in {n, *re.split(r"[_.]", n)} if w]
    return out


def offenders(paths: list[Path], words: set[str]) -> list[str]:
    root = paths[0].parent if paths and ROOT not in paths[0].parents else ROOT
    return [
        f"{p.relative_to(root.parent)}:{line}: {w!r}"
        for p in sorted(paths)
        for line, w in words_in(p.read_text())
        if w in words
    ]


def test_the_shared_layers_name_no_backend():
    assert offenders(SHARED, forbidden()) == []


def test_the_words_are_each_backends_own():
    words = forbidden()
    assert {"jobset", "lws", "pathways", "ray", "rayjob", "leaderworkerset"} <= words
    assert {"ray_operator_config", "ray_version", "head_cpu"} <= words  # add-on, values


def test_it_would_catch_one(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        '"""A docstring may say Pathways."""\n'
        "# and so may a comment: ray\n"
        'POOL = "pathways"\n'
        "def f(ray_version):\n"
        "    return cur.addons_config.ray_operator_config\n"
    )
    assert sorted(o.split(": ")[-1] for o in offenders([bad], forbidden())) == [
        "'pathways'",
        "'ray'",
        "'ray'",
        "'ray_operator_config'",
        "'ray_version'",
    ]


@pytest.mark.parametrize(
    "acc", [a for a in catalog.all_types() if a.kind == "tpu"], ids=lambda a: a.name
)
def test_every_tpu_of_the_catalog_has_rays_name(acc):
    from rlctl.core.k8s.backends.ray import ray_accelerator_type

    assert ray_accelerator_type(acc.gke_accelerator).startswith("TPU-V")
