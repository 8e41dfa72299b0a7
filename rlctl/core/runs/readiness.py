"""A cluster a run can start on: the GKE plan plus what Kubernetes needs inside it.

``rlctl cluster create`` made a cluster that every rendered manifest validated
against, yet no run could start on it: GKE ships neither the JobSet nor the
PathwaysJob controller, and the namespace given to ``--namespace`` was never made.
This module composes the Google Cloud plan (``core/gcp/cluster.py``) with the
in-cluster pieces (``core/k8s/controllers.py``): the two controllers at their
pinned versions, the namespace and the Kubernetes service account that the
bucket's Workload Identity binding names. It lives above ``core.gcp`` and
``core.k8s`` because it needs both (they may not import each other).

The in-cluster changes are ordinary plan ``Change``s (kind ``controller``,
``namespace``, ``serviceaccount``), shown in the plan with their versions and
applied by the same executor once the cluster is up; ``plan_delete`` removes the
controllers before the cluster (the namespace and KSA go with the cluster).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from rlctl.core.config.infra import DEFAULT_NAMESPACE, InfraSpec
from rlctl.core.errors import ConfigError, RlctlError
from rlctl.core.gcp import cluster as gke
from rlctl.core.gcp.api import GcpClients
from rlctl.core.gcp.operations import Event
from rlctl.core.k8s import backends, controllers
from rlctl.core.k8s.apply import KubeApi
from rlctl.core.plan import Change, Plan

CONTROLLER, NAMESPACE, KSA = "controller", "namespace", "serviceaccount"
KINDS = (CONTROLLER, NAMESPACE, KSA)


def _running(cur: Any) -> bool:
    return cur is not None and cur.status.name == "RUNNING"


def _kube(clients: GcpClients, cur: Any, namespace: str = DEFAULT_NAMESPACE) -> KubeApi:
    ca = cur.master_auth.cluster_ca_certificate or None
    return KubeApi(clients.kubernetes(cur.endpoint, ca), namespace)


def _controller_fields(c: controllers.Controller) -> dict[str, Any]:
    return {
        "version": c.version,
        "crds": list(c.crds),
        "objects": len(controllers.manifests(c)),
        "source": f"rlctl/{controllers.CONTROLLERS_DIR}/{c.manifest}",
    }


def kube_changes(
    api: KubeApi | None, spec: InfraSpec, after: list[str]
) -> tuple[list[Change], list[str]]:
    """(changes, notes) for the controllers, namespace and KSA. ``api`` None: the
    cluster is not up yet, so everything is to create (apply is idempotent anyway)."""
    changes: list[Change] = []
    notes: list[str] = []
    for c in controllers.CONTROLLERS:
        fields = _controller_fields(c)
        # e.g. the PathwaysJob controller creates JobSets: it comes after the JobSet CRD
        deps = [*after, *(f"controller/{name}" for name in c.after)]
        have = controllers.installed(api, c) if api is not None else None
        if have is None:
            changes.append(
                Change(
                    kind=CONTROLLER, name=c.name, action="create", fields=fields, depends_on=deps
                )
            )
        elif not have.ours:
            notes.append(
                f"{c.title}: {c.crds[0]} exists and was installed outside rlctl; left as is"
            )
            changes.append(
                Change(
                    kind=CONTROLLER,
                    name=c.name,
                    action="unchanged",
                    fields={**fields, "version": "not rlctl's"},
                )
            )
        elif have.version != c.version:
            changes.append(
                Change(
                    kind=CONTROLLER,
                    name=c.name,
                    action="update",
                    fields=fields,
                    diff={"version": (have.version, c.version)},
                    depends_on=deps,
                )
            )
        else:
            changes.append(Change(kind=CONTROLLER, name=c.name, action="unchanged", fields=fields))
    ns_key: list[str] = []
    if spec.namespace != DEFAULT_NAMESPACE:
        exists = api is not None and controllers.has_namespace(api, spec.namespace)
        changes.append(
            Change(
                kind=NAMESPACE,
                name=spec.namespace,
                action="unchanged" if exists else "create",
                fields={"labels": "managed-by=rlctl"},
                depends_on=after,
            )
        )
        ns_key = [f"{NAMESPACE}/{spec.namespace}"]
    exists = api is not None and controllers.has_service_account(
        api, spec.namespace, spec.service_account
    )
    changes.append(
        Change(
            kind=KSA,
            name=f"{spec.namespace}/{spec.service_account}",
            action="unchanged" if exists else "create",
            fields={"bound_to_bucket": spec.bucket.name or "none"},
            depends_on=[*after, *ns_key],
        )
    )
    return changes, notes


def plan_create(clients: GcpClients, spec: InfraSpec) -> Plan:
    """The GKE plan (networks, cluster, pools, bucket) plus controllers, namespace, KSA."""
    if spec.mode == "autopilot":
        # No half-working path: Autopilot provisions TPU/GPU nodes per workload from
        # node selectors and compute classes rlctl's workloads do not set, and a
        # cluster without accelerator pools cannot take a run ('train --cluster').
        raise ConfigError(
            "Autopilot clusters are not supported: rlctl runs on TPU/GPU "
            "node pools of a Standard cluster",
            hint="drop --autopilot (and mode: autopilot from the config); "
            "rlctl makes one node pool per slice",
        )
    plan = gke.plan_create(clients, spec, backends.cluster_needs())
    cur = gke.get_cluster(clients, spec.project, spec.location, spec.cluster)
    api = _kube(clients, cur) if _running(cur) else None
    changes, notes = kube_changes(api, spec, [f"cluster/{spec.cluster}"])
    return plan.model_copy(
        update={"changes": [*plan.changes, *changes], "notes": [*plan.notes, *notes]}
    )


def plan_delete(
    clients: GcpClients, project: str, region: str, cluster: str, keep_bucket: bool = False
) -> Plan:
    """The GKE delete plan, with rlctl's controllers removed first (before the cluster:
    their webhooks would otherwise outlive nothing, but a kept cluster, never)."""
    plan = gke.plan_delete(clients, project, region, cluster, keep_bucket)
    cur = gke.get_cluster(clients, project, region, cluster)
    if not _running(cur):
        return plan
    api = _kube(clients, cur)
    found = []
    try:
        for c in controllers.CONTROLLERS:
            have = controllers.installed(api, c)
            if have is not None and have.ours:
                found.append(
                    Change(
                        kind=CONTROLLER,
                        name=c.name,
                        action="delete",
                        fields={"version": have.version, "crds": list(c.crds)},
                    )
                )
    except RlctlError as e:
        # a delete must not hinge on the Kubernetes API (a private endpoint, an expired
        # role binding): the controllers go with the cluster anyway
        note = (
            f"the cluster's Kubernetes API did not answer ({e.message}); its "
            "controllers are deleted with the cluster"
        )
        return plan.model_copy(update={"notes": [*plan.notes, note]})
    if not found:
        return plan
    keys = [c.key for c in found]
    changes = [
        *found,
        *[
            c.model_copy(update={"depends_on": [*c.depends_on, *keys]})
            if c.kind == "cluster"
            else c
            for c in plan.changes
        ],
    ]
    return plan.model_copy(update={"changes": changes})


def _handlers(clients: GcpClients, plan: Plan) -> dict[str, Callable[..., None]]:
    """Appliers for the in-cluster kinds; the Kubernetes client is built once, when the
    first of them runs (the cluster exists by then: they depend on it)."""
    lock = threading.Lock()
    cache: dict[str, KubeApi] = {}

    def api() -> KubeApi:
        with lock:
            if "api" not in cache:
                cur = gke.get_cluster(clients, plan.project, plan.location, plan.target)
                if cur is None:
                    raise ConfigError(f"cluster {plan.target!r} is gone")
                cache["api"] = _kube(clients, cur)
            return cache["api"]

    def controller(c: Change, on_poll: Callable[[str], None]) -> None:
        ctl = controllers.by_name(c.name)
        if c.action == "delete":
            controllers.uninstall(api(), ctl)
        else:
            controllers.install(api(), ctl, on_poll, interval=clients.poll_interval)

    def namespace(c: Change, on_poll: Callable[[str], None]) -> None:
        controllers.ensure_namespace(api(), c.name)

    def service_account(c: Change, on_poll: Callable[[str], None]) -> None:
        ns, _, name = c.name.partition("/")
        controllers.ensure_service_account(api(), ns, name)

    return {CONTROLLER: controller, NAMESPACE: namespace, KSA: service_account}


def apply_plan(clients: GcpClients, plan: Plan, on_event: Event | None = None) -> dict[str, Any]:
    """Apply a plan of ``plan_create``/``plan_delete`` (Google Cloud and in-cluster)."""
    return gke.apply_plan(clients, plan, on_event, handlers=_handlers(clients, plan))
