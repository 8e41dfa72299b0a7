"""Adding a backend is one ``Backend`` subclass and one template.

A throwaway fourth backend (a plain Indexed batch/v1 Job: a core kind, so no CRD
schema; its template in a temporary folder) renders, validates strictly, is admitted
by the fit check, applied, found, described and deleted on the fake API server, and
passes the cluster submit's backend check, with nothing but the class below,
``backends.register`` and the template. tests/core/k8s/test_backend_conformance.py
runs the same steps over every registered backend.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.core.errors import ConfigError
from rlctl.core.k8s import backends
from rlctl.core.k8s.apply import (
    apply_objects,
    delete_objects,
    describe_workload,
    find_workload,
    list_run_objects,
    run_kinds,
    trainer_logs,
)
from rlctl.core.k8s.backends.base import Backend
from rlctl.core.k8s.render import make_view, render_workload
from rlctl.core.k8s.validate import validate_manifests
from tests.core.k8s.conftest import make_spec
from tests.fakes.shapes import h100_8, v6e_16

# The whole of the fourth backend: the Contributing part's template
# (docs/contributing/templates/backend: the class and job.yaml.j2), as a contributor
# copies it.
TEMPLATE = Path(__file__).resolve().parents[3] / "docs" / "contributing" / "templates" / "backend"


def _template_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("backend_template", TEMPLATE / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


JobBackend = _template_module().JobBackend


@pytest.fixture()
def job():
    entry = backends.register(JobBackend())
    yield entry
    backends.unregister("job")


def view(backend: str = "job", **kw):
    fields = dict(
        run="r1",
        backend=backend,
        image="us-docker.pkg.dev/p/r/rlctl:1",
        run_uri="gs://bkt/runs/r1",
        shape=v6e_16(),
        hf_secret="r1-hf-token",
    )
    return make_view(**{**fields, **kw})


class TestRegistry:
    def test_the_built_in_backends(self):
        assert backends.names()[:4] == ("jobset", "lws", "pathways", "ray")
        ray = backends.get("ray")
        assert (ray.template, ray.workload_kind, ray.plural) == (
            "rayjob.yaml.j2",
            ("ray.io/v1", "RayJob"),
            "rayjobs",
        )
        assert backends.get("pathways").plural == "pathwaysjobs"

    def test_an_unknown_name_lists_the_known_ones(self):
        with pytest.raises(ConfigError, match="must be one of jobset, lws, pathways, ray, not 'x'"):
            backends.get("x")
        assert not backends.is_backend("x") and not backends.is_backend(None)

    def test_a_backend_that_forgets_a_piece_cannot_be_made(self):
        class NoPods(JobBackend):  # would leave the fit check with no pods to place
            pod_groups = Backend.pod_groups  # type: ignore[assignment]

        with pytest.raises(TypeError, match="abstract method '?pod_groups"):
            NoPods()

    def test_a_name_is_registered_once(self, job):
        with pytest.raises(ValueError, match="already registered"):
            backends.register(job)

    def test_unregistered_it_is_gone(self):
        backends.register(JobBackend())
        backends.unregister("job")
        assert "job" not in backends.names()
        assert ("batch/v1", "Job") not in run_kinds()
        with pytest.raises(ConfigError, match="'job' is not a backend"):
            view("job")


class TestAFourthBackend:
    def test_renders_and_validates_strictly(self, crds, job):
        objs = render_workload(view())
        assert [o["kind"] for o in objs] == ["ServiceAccount", "Job"]
        validate_manifests(objs, crds)
        pod = objs[-1]["spec"]["template"]["spec"]
        assert objs[-1]["spec"]["parallelism"] == 4  # v6e-16: 4 hosts
        assert [g.total for g in backends.pod_groups(objs)] == [4]  # the fit check sees them
        assert pod["containers"][0]["resources"]["limits"] == {
            "google.com/tpu": 4,
            "memory": "628Gi",
        }

    def test_its_entry_decides_what_else_is_rendered(self, job):
        objs = render_workload(view(dcn_networks=["dcn-a"]))  # dcn_claim=False: no claim
        assert "ResourceClaimTemplate" not in [o["kind"] for o in objs]
        with pytest.raises(ConfigError, match="the job backend runs on TPU slices only"):
            view(shape=h100_8())

    def test_apply_find_describe_logs_and_delete(self, kube, api, job):
        applied = apply_objects(api, render_workload(view()))
        assert applied[-1] == "Job/r1 (applied)"
        assert ("batch/v1", "jobs", "default", "r1") in kube.objects
        assert find_workload(api, "r1", job)["kind"] == "Job"
        assert find_workload(api, "r1")["kind"] == "Job"  # any backend's kind
        assert describe_workload(api, "r1", job).phase == "pending"  # no pods yet
        kube.put(
            "v1",
            "pods",
            {
                "metadata": {
                    "name": "r1-0",
                    "labels": {"managed-by": "rlctl", "rlctl.dev/run": "r1"},
                },
                "spec": {"containers": [{"name": "trainer"}]},
                "status": {"phase": "Running"},
            },
        )
        kube.logs[("default", "r1-0")] = "step 1\n"
        assert describe_workload(api, "r1", job).phase == "running"
        assert trainer_logs(api, "r1") == ("r1-0", "step 1\n")
        found = list_run_objects(api, "r1")
        assert found[0] == ("batch/v1", "Job", "r1")
        assert "Job/r1" in delete_objects(api, found)
        assert find_workload(api, "r1", job) is None

    def test_a_cluster_submit_accepts_it(self, job):
        from rlctl.core.runs.cluster import ClusterRef, is_cluster_run, submit

        assert is_cluster_run({"backend": "job"})
        spec = make_spec("r1")
        with pytest.raises(ConfigError, match="jobset, lws, pathways, ray, job, not 'nope'"):
            submit(None, ClusterRef(), spec, "nope", "img")  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="no cluster given"):  # past the backend check
            submit(None, ClusterRef(), spec, "job", "img")  # type: ignore[arg-type]
