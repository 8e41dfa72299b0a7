"""A workload backend for rlctl: copy this folder to rlctl/core/k8s/backends/<name>/.

This one is a plain Indexed batch/v1 Job, one pod per host, every host runs the
trainer: a core kind, so no CRD schema and no controller to install. Every folder of
rlctl/core/k8s/backends holding a ``BACKEND`` is registered by its name; then add its
row to ``ROWS`` in tests/core/k8s/test_backend_conformance.py (the roles of its pod
groups), and for a custom resource its CRD schema in rlctl/data/crds and its pinned
controller manifest in rlctl/data/controllers (docs/contributing/backends.md).

tests/core/k8s/test_backends.py registers this very class with its template and runs
it through render, strict validation, the fit check, apply, find, describe and delete
on the fake API server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlctl.core.k8s.admission import PodGroup, group
from rlctl.core.k8s.backends.base import Backend, condition_phase, run_selector
from rlctl.core.phases import Phase


class JobBackend(Backend):
    """A plain Indexed Job: one pod per host, its controller Kubernetes' own."""

    name = "job"
    template = "job.yaml.j2"
    api_version = "batch/v1"
    kind = "Job"
    help = "a plain Indexed Job"
    tpu_only = True
    dcn_claim = False

    def __init__(self, template_dir: Path | None = None) -> None:
        # its template beside this file (``*.j2`` in a backend's folder is package data)
        self.template_dir = template_dir or Path(__file__).parent

    def pod_groups(
        self, obj: dict[str, Any], kuberay_version: tuple[int, ...] = (1, 5, 2)
    ) -> list[PodGroup]:
        t = obj["spec"]["template"]
        return [
            group(
                f"Job {obj['metadata']['name']}",
                "trainer",
                t.get("metadata") or {},
                t["spec"],
                pods=int(obj["spec"].get("parallelism", 1)),
            )
        ]

    def phase(self, workload: dict[str, Any]) -> tuple[Phase | None, str | None]:
        return condition_phase(workload)

    def pod_selectors(self, run: str) -> tuple[str, ...]:
        return (run_selector(run),)

    def embedded_templates(self, obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        return iter(())  # a core kind: kubernetes-validate checks its template itself


# BACKEND = JobBackend()  # in rlctl/core/k8s/backends/<name>/__init__.py: registers it
