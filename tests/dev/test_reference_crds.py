"""The packaged CRD schemas against the developers' reference copies (``../shared/crds``).

Only where that folder is beside the checkout (the developers' machines and their CI):
tests/conftest.py does not collect tests/dev elsewhere, so a user's clone neither runs
nor skips it. Nothing at run time reads ``../shared``
(tests/core/k8s/test_package_crds.py)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGED = REPO / "rlctl" / "data" / "crds"
REFERENCE = REPO.parent / "shared" / "crds"


def test_the_packaged_copies_equal_the_reference_copies():
    ref = sorted(p.name for p in REFERENCE.glob("*.json"))
    assert ref == sorted(p.name for p in PACKAGED.glob("*.json"))
    for name in ref:
        assert (PACKAGED / name).read_bytes() == (REFERENCE / name).read_bytes(), name
