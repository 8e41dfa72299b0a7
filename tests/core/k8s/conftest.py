from __future__ import annotations

import pytest

HF_SENTINEL = "hf_SENTINEL_do_not_leak_7f3a9c"


def make_spec(name: str = "r1", **flags):
    from rlctl.core.runs.spec import resolve_run_spec

    return resolve_run_spec("grpo", flags={"name": name, "training.steps": 4, **flags})


@pytest.fixture()
def kube():
    pytest.importorskip("kubernetes")
    from tests.fakes.k8s import FakeKube

    with FakeKube() as k:
        yield k


KUBE_TOKEN = "ya29.SENTINEL-access-token-91c2"


@pytest.fixture()
def api(kube):
    from rlctl.core.k8s.apply import KubeApi
    from rlctl.core.k8s.kubeconfig import api_client, build_configuration

    return KubeApi(api_client(build_configuration(kube.url, None, KUBE_TOKEN)), "default")
