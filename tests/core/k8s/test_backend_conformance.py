"""Every registered backend does every step of a cluster run, the same way.

One row per backend (``ROWS``): the roles of the pods its controller makes. Each
backend then renders, validates against its shipped CRD schema and
``kubernetes-validate --strict``, is admitted by the fit check (which must see its
pods: a backend whose ``pod_groups`` returned nothing would pass the check silently),
passes the pre-submit readiness check on a ready cluster and names its fix on a bare
one, is applied to the fake cluster (whose controllers make its pods), found,
diagnosed running, has its leader's log read, and is deleted with its pods.

A backend registered without a row fails ``test_every_backend_has_a_row``; one that
leaves out a method of the protocol cannot be made (``test_backends.py``).
"""

from __future__ import annotations

import inspect
from importlib import resources

import pytest

from rlctl.core.config import catalog
from rlctl.core.k8s import backends
from rlctl.core.k8s.apply import (
    apply_objects,
    delete_objects,
    describe_workload,
    find_workload,
    list_run_objects,
    run_pods,
    trainer_logs,
)
from rlctl.core.k8s.backends.base import Backend
from rlctl.core.k8s.controllers import CONTROLLERS_DIR, missing_for_run
from rlctl.core.k8s.fit import check
from rlctl.core.k8s.render import environment, make_view, render_workload
from rlctl.core.k8s.shapes import slice_shape
from rlctl.core.k8s.validate import CRDS_DIR, validate_manifests
from rlctl.core.phases import Phase
from tests.core.k8s.test_fit import cluster_pools

# backend -> the roles of its pod groups, in order, for a 2-slice run
ROWS: dict[str, tuple[str, ...]] = {
    "jobset": ("trainer",),
    "lws": ("trainer",),
    "pathways": ("pathways-head", "pathways-worker"),
    "ray": ("ray-head", "ray-worker", "ray-submitter"),
}
TPU, GPU = "v6e-16", "a3-highgpu-8g"
SLICES = 2
BUILT_IN = backends.registered()  # collected before any test registers a throwaway one


def cases() -> list[tuple[Backend, str]]:
    return [(b, acc) for b in BUILT_IN for acc in ((TPU,) if b.tpu_only else (TPU, GPU))]


def case_id(x: object) -> str:
    return x.name if isinstance(x, Backend) else str(x)


def render(b: Backend, accelerator: str) -> list[dict]:
    shape = slice_shape(catalog.lookup(accelerator), SLICES)
    view = make_view(
        run="r1",
        backend=b,
        image="us-docker.pkg.dev/p/r/rlctl:1",
        run_uri="gs://bkt/runs/r1",
        shape=shape,
        hf_secret="r1-hf-token",
        dcn_networks=["dcn-a", "dcn-b"] if shape.kind == "tpu" else [],
    )
    return render_workload(view)


def chips(accelerator: str) -> tuple[str, int]:
    acc = catalog.lookup(accelerator)
    shape = slice_shape(acc, SLICES)
    key = "google.com/tpu" if shape.kind == "tpu" else "nvidia.com/gpu"
    return key, shape.num_slices * shape.hosts_per_slice * shape.chips_per_host


def test_every_backend_has_a_row():
    assert sorted(ROWS) == sorted(b.name for b in BUILT_IN)


@pytest.mark.parametrize("b", BUILT_IN, ids=case_id)
class TestProtocol:
    def test_implements_every_method(self, b):
        assert isinstance(b, Backend) and not inspect.isabstract(type(b))
        assert b.name and b.help and b.api_version and b.kind and b.plural
        assert backends.get(b.name) is b

    def test_its_package_data_ships(self, b):
        environment().get_template(b.template)  # in rlctl/templates or its template_dir
        for extra in b.config_files.values():
            environment().get_template(extra)
        if b.crd_schema is not None:
            assert resources.files("rlctl").joinpath(CRDS_DIR, b.crd_schema).is_file()
        for c in b.controllers:
            assert resources.files("rlctl").joinpath(CONTROLLERS_DIR, c.manifest).is_file()

    def test_a_fresh_workload_is_not_finished(self, b):
        phase, _ = b.phase({"apiVersion": b.api_version, "kind": b.kind, "metadata": {}})
        assert phase is None or not phase.finished

    def test_names_the_fix_for_its_missing_crd(self, b, kube, api):
        kube.seed_ready(crds=())
        lines = missing_for_run(api, "c", b, "default", "rlctl", "us-east5")
        if b.crd is None:
            assert lines == []
        else:
            assert lines == [
                f"the cluster has no {b.crd} CRD {b.crd_fix('c', ' --region us-east5')}"
            ]
            assert "c --region us-east5" in lines[0]


@pytest.mark.parametrize(("b", "accelerator"), cases(), ids=case_id)
class TestARun:
    def test_renders_and_validates_strictly(self, b, accelerator, crds):
        objs = render(b, accelerator)
        assert objs[-1]["kind"] == b.kind and objs[-1]["apiVersion"] == b.api_version
        validate_manifests(objs, crds)
        if b.crd_schema is not None:
            assert crds.knows(b.api_version, b.kind)
            assert list(b.embedded_templates(objs[-1]))  # its pod templates are checked too

    def test_the_fit_check_sees_its_pods(self, b, accelerator):
        objs = render(b, accelerator)
        groups = backends.pod_groups(objs)
        assert tuple(g.role for g in groups) == ROWS[b.name]
        assert all(g.total > 0 for g in groups)
        key, total = chips(accelerator)
        assert sum(g.total * g.requests.extended.get(key, 0) for g in groups) == total
        report = check(groups, cluster_pools(accelerator, SLICES))
        assert not report.misfits, report.misfits

    def test_applied_found_diagnosed_logged_and_deleted(self, b, accelerator, kube, api):
        kube.seed_ready(crds=tuple(c for c in [b.crd] if c))
        kube.nodes = cluster_pools(accelerator, SLICES)
        assert missing_for_run(api, "c", b, "default", "rlctl") == []
        objs = render(b, accelerator)
        applied = apply_objects(api, objs)
        assert applied[-1] == f"{b.kind}/r1 (applied)"
        assert find_workload(api, "r1", b)["kind"] == b.kind
        assert find_workload(api, "r1")["kind"] == b.kind  # a run of unknown backend

        pods = run_pods(api, "r1", b)
        assert len(pods) == sum(g.total for g in backends.pod_groups(objs))
        assert not kube.unschedulable
        assert describe_workload(api, "r1", b).phase == Phase.RUNNING

        for p in pods:
            kube.logs[("default", p["metadata"]["name"])] = f"log of {p['metadata']['name']}\n"
        pod, text = trainer_logs(api, "r1", backend=b)
        assert text == f"log of {pod}\n"
        (leader,) = [p for p in pods if p["metadata"]["name"] == pod]
        assert b.leader_container in [c["name"] for c in leader["spec"]["containers"]]

        found = list_run_objects(api, "r1")
        assert found[0] == (b.api_version, b.kind, "r1")
        assert f"{b.kind}/r1" in delete_objects(api, found)
        assert find_workload(api, "r1", b) is None
        assert run_pods(api, "r1", b) == []
        assert describe_workload(api, "r1", b).phase == Phase.ABSENT
