"""A pipelined run's generator pods of their own (``rollout.placement=process``, issue
54), for every backend that renders them (``Backend.generator_group``): one machine of
the run's accelerator beside the learner's, validated strictly, seen by the fit check,
made into pods by the fake's controllers, and never the pod whose log is the run's.

JobSet: a second replicated job. What its controller does with a replicated job
outside the success policy follows JobSet v0.12.0 (commit f22e565a):
``pkg/controllers/jobset_controller.go`` ``reconcile`` deletes the active jobs once
the JobSet finished (``deleteJobs``, foreground), so the generator pods go when the
learner completes; a generator pod that fails is made again by its Job
(``backoffLimit``) and the JobSet controller, which reacts only to a Job's ``Failed``
condition (``executeFailurePolicy``), does not restart the learner for it.

Ray: a second worker group whose node offers a custom resource, where the driver runs
the generator as a Ray task (tests/core/runs/test_ray_driver.py runs it on a real Ray).
"""

from __future__ import annotations

import json

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
# backend -> its pod groups' (role, pods) with a generator of its own
ROLES = {
    "jobset": [("trainer", 1), ("generator", 1)],
    "ray": [("ray-head", 1), ("ray-worker", 1), ("ray-generator", 1), ("ray-submitter", 1)],
}
COMMAND = ["python", "-m", "rlctl.core.trainer.run.generate", "--root", "gs://bkt/runs"]


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


def envs(b, workload: dict) -> dict[str, dict[str, str | None]]:
    """Each embedded pod template's path -> its first container's env."""
    out = {}
    for path, tmpl in b.embedded_templates(workload):
        if tmpl["kind"] == "PodTemplate":
            (c, *_) = tmpl["template"]["spec"]["containers"]
            out[path] = {e["name"]: e.get("value") for e in c.get("env") or []}
    return out


def test_every_backend_with_generator_pods_has_a_row():
    assert sorted(b.name for b in WITH_GENERATOR) == sorted(ROLES)


@pytest.mark.parametrize("b", WITH_GENERATOR, ids=lambda b: b.name)
@pytest.mark.parametrize("accelerator", ACCELERATORS)
class TestGeneratorPods:
    def test_render_validate_and_the_fit_check_sees_both_groups(self, b, accelerator, crds):
        objs = render(b, accelerator)
        validate_manifests(objs, crds)
        groups = backends.pod_groups(objs)
        assert [(g.role, g.total) for g in groups] == ROLES[b.name]
        report = check(groups, cluster_pools(accelerator, 2))
        assert not report.misfits, report.misfits
        # one more machine than the learner's: a cluster of one has no room for it
        assert check(groups, cluster_pools(accelerator, 1)).misfits

    def test_only_the_learner_waits_for_generator_pods_that_serve_its_run(self, b, accelerator):
        objs = render(b, accelerator)
        waiting = [p for p, env in envs(b, objs[-1]).items() if env.get(GENERATOR_ENV)]
        assert len(waiting) == 1 and envs(b, objs[-1])[waiting[0]][GENERATOR_ENV] == "pods"
        text = json.dumps(objs)  # the generator's command: the JobSet's, or Ray's driver's
        if b.name == "jobset":
            (gen,) = [rj for rj in objs[-1]["spec"]["replicatedJobs"] if rj["name"] == "generator"]
            (c,) = gen["template"]["spec"]["template"]["spec"]["containers"]
            assert c["command"] == [*COMMAND, "--name", "r1", "--pod"]
            assert "generator" not in objs[-1]["spec"]["successPolicy"]["targetReplicatedJobs"]
        else:
            assert 'STORE_ROOT = \\"gs://bkt/runs\\"' in text and "GENERATOR = True" in text
            # each group's custom resource, in the form Ray's KubeRay guide gives
            # (cluster/kubernetes/user-guides/config.md: '"{\"Custom1\": 1}"')
            groups = objs[-1]["spec"]["rayClusterSpec"]["workerGroupSpecs"]
            assert [g["rayStartParams"]["resources"] for g in groups] == [
                '"{\\"rlctl_learner\\": 1}"',
                '"{\\"rlctl_generator\\": 1}"',
            ]

    def test_applied_both_groups_have_pods_and_the_runs_log_is_not_the_generators(
        self, b, accelerator, kube, api
    ):
        kube.seed_ready(crds=tuple(c for c in [b.crd] if c))
        kube.nodes = cluster_pools(accelerator, 2)
        objs = render(b, accelerator)
        apply_objects(api, objs)
        pods = run_pods(api, "r1", b)
        assert len(pods) == sum(g.total for g in backends.pod_groups(objs))
        assert not kube.unschedulable
        for p in pods:
            kube.logs[("default", p["metadata"]["name"])] = f"log of {p['metadata']['name']}\n"
        pod, _ = trainer_logs(api, "r1", backend=b)
        assert "generator" not in pod
