"""Kueue, as rlctl submits into it and reads it back: the job labels, and why it waits.

As kubernetes-sigs/kueue v0.19.2 (8eab6877) has it: a job object carrying
``kueue.x-k8s.io/queue-name`` (and ``kueue.x-k8s.io/priority-class``, a
WorkloadPriorityClass; ``pkg/controller/constants/constants.go``) is suspended on create
by Kueue's webhook (``jobframework.ApplyDefaultForSuspend``) and gets a Workload
(``kueue.x-k8s.io/v1beta2``, owned by the job: ``jobframework.ConstructWorkload``). While
it waits, its ``QuotaReserved`` condition is False with the scheduler's reason (``Pending``
in v0.19.2) and message, e.g. ``couldn't assign flavors to pod set slice: insufficient
quota for google.com/tpu in flavor v6e, ...`` (``pkg/scheduler/flavorassigner``); once
quota is reserved and the checks pass, ``Admitted`` is True and Kueue unsuspends the job.
"""

from __future__ import annotations

from typing import Any

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
WORKLOAD_API = "kueue.x-k8s.io/v1beta2"


def queue_of(job: dict[str, Any] | None) -> str | None:
    """The LocalQueue a job object was submitted to (None: not queued)."""
    return (((job or {}).get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL)


def missing_queue(local_queues: list[dict[str, Any]], queue: str, namespace: str) -> str | None:
    """One line when the LocalQueue a run would wait in is not there: Kueue would keep
    the job suspended for ever (``LocalQueue %s doesn't exist``)."""
    if any((q.get("metadata") or {}).get("name") == queue for q in local_queues):
        return None
    return (
        f"the cluster has no Kueue LocalQueue {queue} in namespace {namespace}, where the "
        f"run would wait suspended for ever: pass one of 'kubectl get localqueues -n "
        f"{namespace}', or leave --queue out (Kueue: kubectl apply --server-side -f "
        "https://github.com/kubernetes-sigs/kueue/releases/download/v0.19.2/manifests.yaml)"
    )


def _owned_by(workload: dict[str, Any], job: dict[str, Any]) -> bool:
    """The Workload's controller reference is this job (by UID: a job deleted and made
    again under its name is another owner)."""
    md = job.get("metadata") or {}
    return any(
        r.get("kind") == job.get("kind")
        and r.get("name") == md.get("name")
        and (not md.get("uid") or r.get("uid") == md.get("uid"))
        for r in (workload.get("metadata") or {}).get("ownerReferences") or []
    )


def waiting_reason(workloads: list[dict[str, Any]], job: dict[str, Any]) -> str | None:
    """Why Kueue has not admitted the job yet, as its Workload says; None when it is
    admitted, or when no Workload of it exists (Kueue is not watching its kind)."""
    for w in workloads:
        if not _owned_by(w, job):
            continue
        conds = {c.get("type"): c for c in (w.get("status") or {}).get("conditions") or []}
        if (conds.get("Admitted") or {}).get("status") == "True":
            return None
        reserved = conds.get("QuotaReserved") or {}
        if reserved.get("status") == "False":
            return str(reserved.get("message") or reserved.get("reason") or "no quota yet")
        admitted = conds.get("Admitted") or {}
        return str(admitted.get("message") or "not admitted yet")
    return None
