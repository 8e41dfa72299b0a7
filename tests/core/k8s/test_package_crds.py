"""The CRD schemas ship inside the package (rlctl/data/crds): an installed rlctl
validates manifests on its own, and nothing at run time reads ``../shared``."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from rlctl.core.k8s.validate import CrdSchemas

REPO = Path(__file__).resolve().parents[3]
PACKAGED = REPO / "rlctl" / "data" / "crds"
KINDS = {
    ("jobset.x-k8s.io/v1alpha2", "JobSet"),
    ("ray.io/v1", "RayJob"),
    ("ray.io/v1", "RayCluster"),
    ("pathways-job.pathways.domain/v1", "PathwaysJob"),
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"),
}


def test_the_package_finds_its_own_schemas_for_every_kind_it_renders():
    found = CrdSchemas.find()
    assert found is not None and len(found) == len(KINDS)
    for api, kind in KINDS:
        assert found.knows(api, kind), (api, kind)
    assert "site-packages" in str(found.folder) or str(found.folder).startswith(str(REPO / "rlctl"))


def test_each_packaged_schema_is_named_in_the_provenance_table():
    readme = (PACKAGED / "README.md").read_text()
    for f in PACKAGED.glob("*.json"):
        assert f"`{f.name}`" in readme, f.name
        assert json.loads(f.read_text())["type"] == "object"


def test_package_data_includes_the_schemas():
    import tomllib

    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "data/crds/*" in data["tool"]["setuptools"]["package-data"]["rlctl"]
    extras = data["project"]["optional-dependencies"]
    assert any(d.startswith("jsonschema") for d in extras["k8s"])
    assert any(d.startswith("kubernetes-validate") for d in extras["k8s"])


def test_no_runtime_code_looks_outside_the_package_for_data():
    """No ``shared`` folder, no ``RLCTL_CRD_SCHEMAS``, no walking up out of the package."""
    for path in (REPO / "rlctl").rglob("*.py"):
        text = path.read_text()
        assert "RLCTL_CRD_SCHEMAS" not in text, path
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                value = node.value
                assert (
                    "../shared" not in value and "shared/crds" not in value and value != "shared"
                ), (path, value)
            if isinstance(node, ast.Attribute) and node.attr == "parents":
                pytest.fail(f"{path}:{node.lineno}: Path.parents reaches outside the package")
