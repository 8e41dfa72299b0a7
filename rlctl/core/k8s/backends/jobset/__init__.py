"""The default backend: a JobSet, every host runs the trainer.

What its controller makes of it follows JobSet v0.12.0 (commit f22e565a), the
controller ``rlctl cluster create`` installs: ``pkg/controllers/jobset_controller.go``
(one Job per replica of each replicated job; ``exclusive-topology`` copied from the
JobSet's or the replicated job template's annotations), ``pkg/webhooks/pod_webhook.go``
(the leader pod, completion index 0, gets a required pod affinity to its own job and
an anti-affinity to other jobs on ``topologyKey``; each follower is admitted only once
the leader has a node, with ``nodeSelector[topologyKey]`` = the leader node's value:
every pod of a job lands in the leader's domain). ``jobset_groups`` is also what a
PathwaysJob's pods come from (its controller makes a JobSet).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from rlctl.core.k8s.backends.base import (
    Backend,
    Controller,
    condition_phase,
    pod_template,
    run_selector,
)

if TYPE_CHECKING:  # pydantic, imported where used: the CLI reads the registry for --help
    from rlctl.core.k8s.admission import PodGroup
    from rlctl.core.phases import Phase

EXCLUSIVE_KEY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
# The JobSet controller labels every pod of a JobSet with its name.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"

# A pipelined run's generator pods (rollout.placement=process): not in the success
# policy, so the JobSet completes with its learner and then deletes them
# (jobset_controller.go reconcile: deleteJobs of the active jobs once finished, v0.12.0)
GENERATOR_JOB = "generator"

JOBSET_CONTROLLER = Controller(
    "jobset",
    "v0.12.0",
    "jobset-v0.12.0.yaml",
    ("jobsets.jobset.x-k8s.io",),
    "JobSet controller",
)


def _exclusive(jobset: dict[str, Any], rjob: dict[str, Any]) -> str | None:
    """jobset_controller.go: the replicated job template's annotation wins over the
    JobSet's; pod template annotations reach the pods too (pathways-job puts it there)."""
    tmpl = rjob.get("template") or {}
    pod_tmpl = (tmpl.get("spec") or {}).get("template") or {}
    for ann in (
        (pod_tmpl.get("metadata") or {}).get("annotations"),
        (tmpl.get("metadata") or {}).get("annotations"),
        (jobset.get("metadata") or {}).get("annotations"),
    ):
        if ann and ann.get(EXCLUSIVE_KEY):
            return str(ann[EXCLUSIVE_KEY])
    return None


def jobset_groups(jobset: dict[str, Any], roles: dict[str, str] | None = None) -> list[PodGroup]:
    """One group per replicated job: ``replicas`` Jobs of ``parallelism`` pods."""
    from rlctl.core.k8s.admission import group

    name = jobset["metadata"]["name"]
    out = []
    for rjob in jobset["spec"]["replicatedJobs"]:
        job = rjob["template"]["spec"]
        pod = job["template"]
        out.append(
            group(
                f"{jobset['kind']} {name}, replicated job {rjob['name']}",
                (roles or {}).get(rjob["name"], "trainer"),
                pod.get("metadata") or {},
                pod["spec"],
                jobs=int(rjob.get("replicas", 1)),
                pods=int(job.get("parallelism", 1)),
                pinned=_exclusive(jobset, rjob),
            )
        )
    return out


def jobset_templates(obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each replicated job's Job template and its pod template."""
    for i, rj in enumerate((obj.get("spec") or {}).get("replicatedJobs") or []):
        t = rj.get("template") or {}
        yield (
            f"spec.replicatedJobs[{i}].template",
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": "embedded", **(t.get("metadata") or {})},
                "spec": t.get("spec") or {},
            },
        )
        yield pod_template(
            f"spec.replicatedJobs[{i}].template.spec.template",
            (t.get("spec") or {}).get("template") or {},
        )


class JobSetBackend(Backend):
    name = "jobset"
    template = "jobset.yaml.j2"
    api_version = "jobset.x-k8s.io/v1alpha2"
    kind = "JobSet"
    help = "a JobSet, every host runs the trainer"
    crd_schema = "jobset-jobset.x-k8s.io-v1alpha2.json"
    controllers = (JOBSET_CONTROLLER,)
    generator_group = True  # a replicated job "generator" (jobset.yaml.j2)

    def pod_groups(
        self, obj: dict[str, Any], controller_version: tuple[int, ...] | None = None
    ) -> list[PodGroup]:
        return jobset_groups(obj, {GENERATOR_JOB: "generator"})

    def phase(self, workload: dict[str, Any]) -> tuple[Phase | None, str | None]:
        return condition_phase(workload)

    def pod_selectors(self, run: str) -> tuple[str, ...]:
        return (run_selector(run),)  # the pods carry the template's labels

    def embedded_templates(self, obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        return jobset_templates(obj)


BACKEND = JobSetBackend()
