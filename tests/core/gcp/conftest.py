from __future__ import annotations

import pytest


@pytest.fixture
def spec():
    """The seeds' shape: two v6e-16 slices, two DCN networks, a bucket, in one region."""
    from rlctl.core.config.infra import build_infra_spec

    return build_infra_spec(
        flags={
            "project": "p",
            "region": "us-central1",
            "zone": "us-central1-b",
            "cluster": "rl",
            "accelerators": ["v6e-16 x2"],
            "dcn": {"count": 2},
            "bucket": {"name": "rl-runs"},
            "namespace": "train",
            "service_account": "trainer",
        },
        env={},
    )
