"""Kueue's admission of a queued job, as the fake cluster's controllers do it.

Follows kubernetes-sigs/kueue v0.19.2 (8eab6877), the release its docs pin:
- a job object with ``kueue.x-k8s.io/queue-name`` is suspended on create
  (``jobframework.ApplyDefaultForSuspend``: JobSet's and RayJob's ``spec.suspend``);
- its Workload (``kueue.x-k8s.io/v1beta2``, in the job's namespace, owned by it, label
  ``kueue.x-k8s.io/job-uid``; ``jobframework.ConstructWorkload``) has one pod set per pod
  group, named as the job's (JobSet: its replicated jobs, ``(*JobSet).PodSets``);
- the LocalQueue names a ClusterQueue whose first flavor covering a resource holds its
  ``nominalQuota``; pod sets are assigned in order, and one whose request, added to the
  pod sets before it, is more than that quota is refused with the flavor assigner's
  message (``pkg/scheduler/flavorassigner/flavorassigner.go`` ``fitsResourceQuota``:
  ``insufficient quota for %s in flavor %s, previously considered podsets requests (%s) +
  current podset request (%s) > maximum capacity (%s)``, prefixed ``couldn't assign
  flavors to pod set %s: ``, ``(*Assignment).Message``) as ``QuotaReserved=False`` with
  reason ``Pending`` (``(*Scheduler).requeueAndUpdate``, the observability gate off as in
  v0.19.2); one that fits gets ``QuotaReserved=True`` (``Quota reserved in ClusterQueue
  %s``, ``workload.SetQuotaReservation``) and ``Admitted=True`` (``The workload is
  admitted``, ``SyncAdmittedCondition``), and the job runs.
- A missing LocalQueue: ``LocalQueue %s doesn't exist`` (reason ``Inadmissible`` in
  v0.19.2, ``getQueueBlocker``).
Not emulated: borrowing, preemption, priorities' order, LeaderWorkerSet's pod groups.
"""

from __future__ import annotations

import uuid
from typing import Any

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
API = "kueue.x-k8s.io/v1beta2"


def _quota(cq: dict[str, Any], resource: str) -> tuple[str, int] | None:
    """(flavor, nominal quota) of the ClusterQueue's first flavor covering ``resource``."""
    for group in (cq.get("spec") or {}).get("resourceGroups") or []:
        if resource not in (group.get("coveredResources") or []):
            continue
        for flavor in group.get("flavors") or []:
            for r in flavor.get("resources") or []:
                if r.get("name") == resource:
                    return flavor["name"], int(r["nominalQuota"])
    return None


def _condition(kind: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
    status = "True" if ok else "False"
    return {"type": kind, "status": status, "reason": reason, "message": message}


def admit(objects: dict, job: dict[str, Any], groups: list[Any]) -> bool:
    """Make the job's Workload in ``objects`` (the fake's store, its lock held) and say
    whether Kueue admits it now; a job that waits is suspended."""
    md = job["metadata"]
    ns, queue = md.get("namespace", "default"), md["labels"][QUEUE_LABEL]
    lq = objects.get((API, "localqueues", ns, queue))
    cq = None if lq is None else objects.get((API, "clusterqueues", "", lq["spec"]["clusterQueue"]))
    conds = []
    if lq is None:
        conds = [
            _condition("QuotaReserved", False, "Inadmissible", f"LocalQueue {queue} doesn't exist")
        ]
    elif cq is None:
        name = lq["spec"]["clusterQueue"]
        conds = [
            _condition("QuotaReserved", False, "Inadmissible", f"ClusterQueue {name} doesn't exist")
        ]
    else:
        used: dict[str, int] = {}
        for g in groups:
            for resource, per_pod in g.requests.extended.items():
                request = per_pod * g.total
                found = _quota(cq, resource)
                if found is None:
                    msg = f"resource {resource} unavailable in ClusterQueue"
                elif used.get(resource, 0) + request > found[1]:
                    msg = (
                        f"insufficient quota for {resource} in flavor {found[0]}, previously "
                        f"considered podsets requests ({used.get(resource, 0)}) + current "
                        f"podset request ({request}) > maximum capacity ({found[1]})"
                    )
                else:
                    used[resource] = used.get(resource, 0) + request
                    continue
                podset = g.name.rsplit(" ", 1)[-1]
                conds = [
                    _condition(
                        "QuotaReserved",
                        False,
                        "Pending",
                        f"couldn't assign flavors to pod set {podset}: {msg}",
                    )
                ]
                break
            if conds:
                break
        if not conds:
            conds = [
                _condition(
                    "QuotaReserved",
                    True,
                    "QuotaReserved",
                    f"Quota reserved in ClusterQueue {cq['metadata']['name']}",
                ),
                _condition("Admitted", True, "Admitted", "The workload is admitted"),
            ]
    name = f"{job['kind'].lower()}-{md['name']}-{uuid.uuid4().hex[:5]}"
    objects[(API, "workloads", ns, name)] = {
        "apiVersion": API,
        "kind": "Workload",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": str(uuid.uuid4()),
            "labels": {"kueue.x-k8s.io/job-uid": md.get("uid", "")},
            "ownerReferences": [
                {
                    "apiVersion": job["apiVersion"],
                    "kind": job["kind"],
                    "name": md["name"],
                    "uid": md.get("uid", ""),
                    "controller": True,
                }
            ],
        },
        "spec": {"queueName": queue},
        "status": {"conditions": conds},
    }
    admitted = any(c["type"] == "Admitted" and c["status"] == "True" for c in conds)
    if (not admitted and "suspend" in (job.get("spec") or {})) or not admitted:
        job.setdefault("spec", {})["suspend"] = True
    return admitted
