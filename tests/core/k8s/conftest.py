from __future__ import annotations

import pytest

HF_SENTINEL = "hf_SENTINEL_do_not_leak_7f3a9c"


@pytest.fixture(scope="session")
def crds():
    from rlctl.core.k8s.validate import CrdSchemas

    found = CrdSchemas.find()
    if found is None:
        pytest.skip("CRD schemas not found: set RLCTL_CRD_SCHEMAS or put them at ../shared/crds")
    pytest.importorskip("kubernetes_validate")
    pytest.importorskip("jsonschema")
    return found


def make_spec(name: str = "r1", **flags):
    from rlctl.core.runs.spec import resolve_run_spec

    return resolve_run_spec("grpo", flags={"name": name, "training.steps": 4, **flags})
