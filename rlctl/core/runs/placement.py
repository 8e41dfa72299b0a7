"""Which node pool takes each pod of a cluster run, or why it would stay Pending.

``train --cluster`` (its ``--dry-run`` too) and ``resume`` call ``check_placement`` on
the rendered objects before anything is applied: each workload's backend
(``core/k8s/backends/``) says what pods its controller will make of them,
``core/k8s/fit.py`` places them on the
cluster's pools, and this module turns each misfit into one line with the flag or
command that fixes it for this user. No peer says this before submitting: with XPK
or KubeRay it shows in ``kubectl describe pod`` afterwards.
"""

from __future__ import annotations

from typing import Any

from rlctl.core.config.nodes import NodePool
from rlctl.core.errors import UnschedulableError
from rlctl.core.k8s.admission import PodGroup
from rlctl.core.k8s.backends import Backend, for_object
from rlctl.core.k8s.fit import FitReport, Placement, check, selects


def _hint(
    p: Placement,
    g: PodGroup,
    backend: Backend,
    pools: list[NodePool],
    cluster: str,
    region: str,
    accelerator: str,
) -> str:
    mine = [x for x in pools if selects(g, x)] or pools
    create = f"rlctl cluster create {cluster} --region {region}"
    own = backend.misfit_hint(g.role, p.reason or "", create, accelerator)
    if own is not None:  # a pod only its backend knows how to fix (the Pathways head)
        return own
    if g.requests.extended:  # an accelerator host's pod: --cpu and --memory size it
        if p.reason == "cpu":
            return f"pass --cpu {max(1, int(min(x.cpu for x in mine)))} (or leave --cpu out)"
        if p.reason == "memory":
            return (
                f"pass --memory {max(1, int(min(x.memory_gib for x in mine)))}Gi "
                "(or leave --memory out)"
            )
        if p.reason in ("selector", "accelerator"):
            return (
                f"add such a pool with '{create} -a TYPE', or run on one the cluster has "
                "with --accelerator"
            )
        if p.reason == "nodes":
            return (
                f"its pools have fewer nodes than its {accelerator} slices need: give "
                "them back their nodes ('gcloud container clusters resize "
                f"{cluster} --region {region} --node-pool POOL --num-nodes N')"
            )
    if p.reason in ("cpu", "memory", "nodes"):
        return (
            "no CPU node has room for it, and rlctl does not change an existing "
            "cluster's CPU pool: add a larger pool ('gcloud container node-pools create "
            f"POOL --cluster {cluster} --region {region} --machine-type n2-standard-16'), "
            "or make the cluster with --set cpu_machine_type=TYPE"
        )
    if p.reason == "pinned":
        return (
            "the workload's exclusive-topology key must name a domain every pod of a job "
            "fits in (cloud.google.com/gke-nodepool)"
        )
    return "the workload must tolerate the pool's taint, or select another pool"


def check_placement(
    objs: list[dict[str, Any]],
    pools: list[NodePool],
    unmodelled: list[str],
    cluster: str,
    region: str,
    accelerator: str,
) -> tuple[FitReport, list[str]]:
    """(placements, notes) of the run's pods on ``pools``; raises ``UnschedulableError``
    with a line per group that would stay Pending.

    Pools of machine types the catalog lacks are not modelled: with any of them a misfit
    is a note, not a refusal, since such a pool might take the pods.
    """
    owned = [
        (g, b)
        for o in objs
        if (b := for_object(o)) is not None and o.get("kind") == b.kind
        for g in b.pod_groups(o)
    ]  # what backends.pod_groups returns, with the backend of each group
    report = check([g for g, _ in owned], pools)
    by_name = {g.name: (g, b) for g, b in owned}
    lines = [
        f"{p.group} ({p.pods} pod{'s' * (p.pods != 1)}): {p.detail}: "
        + _hint(p, *by_name[p.group], pools, cluster, region, accelerator)
        for p in report.misfits
    ]
    notes: list[str] = []
    if lines and unmodelled:
        notes = [
            f"not checked: node pool(s) {', '.join(unmodelled)} (machine type not in "
            "rlctl's catalog) may take what the others cannot",
            *lines,
        ]
    elif lines:
        raise UnschedulableError(lines)
    return report, notes
