"""A pipelined run's generator pods of their own (``rollout.placement=process``, issue
54), for every backend that renders them (``Backend.generator_group``): one host of the
run's accelerator beside the learner's, validated strictly, seen by the fit check,
made into pods by the fake's controller, and never the pod whose log is the run's.

What the JobSet controller does with a replicated job outside the success policy
follows JobSet v0.12.0 (commit f22e565a): ``pkg/controllers/jobset_controller.go``
``reconcile`` deletes the active jobs once the JobSet finished (``deleteJobs``,
foreground), so the generator pods go when the learner completes; a generator pod
that fails is made again by its Job (``backoffLimit``) and the JobSet controller,
which reacts only to a Job's ``Failed`` condition (``executeFailurePolicy``), does
not restart the learner for it.
"""

from __future__ import annotations

import pytest

from rlctl.core.config import catalog
from rlctl.core.k8s import backends
from rlctl.core.k8s.apply import apply_objects, run_pods, trainer_logs
from rlctl.core.k8s.fit import check
from rlctl.core.k8s.render import make_view, render_workload
from rlctl.core.k8s.shapes import slice_shape
from rlctl.core.k8s.validate import validate_manifests
from rlctl.core.trainer.rollout.generator_process import GENERATOR_ENV
from tests.core.k8s.test_fit import cluster_pools

WITH_GENERATOR = [b for b in backends.registered() if b.generator_group]
# GPU machines: one learns, one generates (a TPU cluster cannot have a second slice of one
# host: runs/submit.py learner_shape refuses it before anything renders)
ACCELERATORS = ("a3-highgpu-8g", "g2-standard-8")


def render(b, accelerator: str) -> list[dict]:
    learner = slice_shape(catalog.lookup(accelerator), 1)
    return render_workload(
        make_view(
            run="r1",
            backend=b,
            image="us-docker.pkg.dev/p/r/rlctl:1",
            run_uri="gs://bkt/runs/r1",
            shape=learner,
            generator=True,
        )
    )


def containers(workload: dict) -> dict[str, dict]:
    return {
        c["name"]: c
        for rj in workload["spec"]["replicatedJobs"]
        for c in rj["template"]["spec"]["template"]["spec"]["containers"]
    }


def test_the_jobset_backend_renders_generator_pods():
    assert [b.name for b in WITH_GENERATOR] == ["jobset"]


@pytest.mark.parametrize("b", WITH_GENERATOR, ids=lambda b: b.name)
@pytest.mark.parametrize("accelerator", ACCELERATORS)
class TestGeneratorPods:
    def test_render_validate_and_the_fit_check_sees_both_groups(self, b, accelerator, crds):
        objs = render(b, accelerator)
        validate_manifests(objs, crds)
        groups = backends.pod_groups(objs)
        assert [(g.role, g.total) for g in groups] == [("trainer", 1), ("generator", 1)]
        report = check(groups, cluster_pools(accelerator, 2))
        assert not report.misfits, report.misfits
        # one more host than the learner's: a cluster of one host has no room for it
        assert check(groups, cluster_pools(accelerator, 1)).misfits

    def test_the_learner_waits_for_the_generator_pods_and_they_serve_its_run(self, b, accelerator):
        workload = render(b, accelerator)[-1]
        c = containers(workload)
        env = {e["name"]: e.get("value") for e in c["trainer"]["env"]}
        assert env[GENERATOR_ENV] == "pods"
        assert GENERATOR_ENV not in {e["name"] for e in c["generator"]["env"]}
        assert c["generator"]["command"] == [
            "python",
            "-m",
            "rlctl.core.trainer.run.generate",
            "--root",
            "gs://bkt/runs",
            "--name",
            "r1",
            "--pod",
        ]
        policy = workload["spec"]["successPolicy"]
        assert "generator" not in policy["targetReplicatedJobs"]  # done with its learner

    def test_applied_both_groups_have_pods_and_the_runs_log_is_the_learners(
        self, b, accelerator, kube, api
    ):
        kube.seed_ready(crds=tuple(c for c in [b.crd] if c))
        kube.nodes = cluster_pools(accelerator, 2)
        objs = render(b, accelerator)
        apply_objects(api, objs)
        pods = run_pods(api, "r1", b)
        assert sorted(c["name"] for p in pods for c in p["spec"]["containers"]) == [
            "generator",
            "trainer",
        ]
        assert not kube.unschedulable
        for p in pods:
            kube.logs[("default", p["metadata"]["name"])] = f"log of {p['metadata']['name']}\n"
        pod, _ = trainer_logs(api, "r1", backend=b)
        (leader,) = [p for p in pods if p["metadata"]["name"] == pod]
        assert [c["name"] for c in leader["spec"]["containers"]] == ["trainer"]
