"""The GKE cluster and its node pools, and the whole-stack plans behind ``rlctl cluster``.

``plan_create`` composes network, cluster/node pool and storage changes into one
``Plan``; ``plan_delete`` finds everything carrying rlctl's labels for a cluster;
``apply_plan`` runs either, concurrently along the dependency edges, awaiting
every long-running operation. ``slices_from_pools`` reads the accelerators back
from existing node pools (the inverse of ``desired_pools``) for cluster runs.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rlctl.core.config import prices
from rlctl.core.config.catalog import Accelerator, all_types, lookup
from rlctl.core.config.infra import InfraSpec
from rlctl.core.config.nodes import NodePool, Taint, node_pool
from rlctl.core.config.pools import ClusterNeeds
from rlctl.core.errors import AlreadyExistsError, ConfigError, ConflictError, NotFoundError
from rlctl.core.gcp import known, network, preflight, project_iam, storage
from rlctl.core.gcp.api import GcpClients
from rlctl.core.gcp.errors import operation_error
from rlctl.core.gcp.operations import Event, call, execute, wait_gke
from rlctl.core.gcp.pools import (
    CPU_POOL,
    backend_pool_body,
    cpu_pool_body,
    desired_pools,
    is_ours,
    pool_changes,
    wanted_backend_pools,
)
from rlctl.core.plan import Action, Change, CostEstimate, Plan

_EFFECTS = {
    "NO_SCHEDULE": "NoSchedule",
    "PREFER_NO_SCHEDULE": "PreferNoSchedule",
    "NO_EXECUTE": "NoExecute",
}
_CHANNELS = {"rapid": "RAPID", "regular": "REGULAR", "stable": "STABLE", "none": "UNSPECIFIED"}


# --- desired state (pure) ---------------------------------------------------
# --- the accelerators of existing pools (pure; the inverse of desired_pools) --------
@dataclass(frozen=True)
class PoolSlices:
    """One catalog accelerator a cluster's node pools hold, ``count`` as in
    ``-a TYPE xCOUNT``: TPU slices (one pool each), or GPU machines (all its pools)."""

    accelerator: Accelerator
    count: int
    threads_per_core: int | None = None  # of its pools (None: the machine's default, 2)


def _pool_accelerator(pool: Any) -> Accelerator | None:
    """The catalog entry of a node pool (None for CPU pools).

    rlctl names its pools ``<type>-<i>`` (``pool_name``); other pools are matched by
    machine type and TPU topology (a single-host TPU pool may have no placement policy).
    """
    machine = pool.config.machine_type
    topology = pool.placement_policy.tpu_topology or None
    base = re.sub(r"-\d+$", "", pool.name)
    try:
        acc = lookup(base)
        if acc.machine_type == machine and (topology is None or acc.topology == topology):
            return acc
    except ConfigError:
        pass
    found = [
        a for a in all_types() if a.machine_type == machine and a.strategy.matches(a, topology)
    ]
    return found[0] if len(found) == 1 else None


def slices_from_pools(pools: list[Any]) -> tuple[list[PoolSlices], list[str]]:
    """(accelerators, DCN network names) of GKE node pools (``container_v1.NodePool``).

    TPU: one pool per slice, so identical pools add slices. GPU: the nodes of all
    pools of one machine type form one group (at least one machine).
    """
    groups: dict[str, tuple[Accelerator, int, int]] = {}  # name -> (acc, pools, nodes)
    threads: dict[str, int | None] = {}
    networks: list[str] = []
    for p in pools:
        acc = _pool_accelerator(p)
        if acc is None:
            continue
        _, n_pools, nodes = groups.get(acc.name, (acc, 0, 0))
        groups[acc.name] = (acc, n_pools + 1, nodes + int(p.initial_node_count or 0))
        threads.setdefault(
            acc.name, int(p.config.advanced_machine_features.threads_per_core) or None
        )
        for net in p.network_config.additional_node_network_configs:
            if net.network and net.network.rsplit("/", 1)[-1] not in networks:
                networks.append(net.network.rsplit("/", 1)[-1])
    found = [
        PoolSlices(acc, acc.strategy.count_from_pools(n_pools, nodes), threads.get(acc.name))
        for acc, n_pools, nodes in groups.values()
    ]
    return found, networks


def node_pools_of(pools: list[Any]) -> tuple[list[NodePool], list[str]]:
    """The nodes of a cluster's node pools (``container_v1.NodePool``) as the scheduler
    sees them, and the names of pools whose machine type the catalog lacks (not modelled).

    An autoscaled pool counts at its maximum size; a pool's node count is per zone.
    """
    out: list[NodePool] = []
    unknown: list[str] = []
    for p in pools:
        cfg = p.config
        auto = bool(p.autoscaling.enabled)
        zones = max(1, len(p.locations))
        if auto and p.autoscaling.total_max_node_count:
            nodes = int(p.autoscaling.total_max_node_count)
        elif auto:
            nodes = int(p.autoscaling.max_node_count) * zones
        else:
            nodes = int(p.initial_node_count or 0) * zones
        made = node_pool(
            p.name,
            cfg.machine_type,
            nodes,
            threads_per_core=int(cfg.advanced_machine_features.threads_per_core) or None,
            accelerator=_pool_accelerator(p),
            labels=dict(cfg.labels),
            autoscaled=auto,
        )
        if made is None:
            unknown.append(f"{p.name} ({cfg.machine_type})")
            continue
        extra = [
            Taint(key=t.key, value=t.value, effect=_EFFECTS.get(t.effect.name, "NoSchedule"))
            for t in cfg.taints
        ]
        out.append(made.model_copy(update={"taints": [*made.taints, *extra]}))
    return out, unknown


# the GKE add-on every rlctl cluster has (gs:// inputs mount through it), beside the
# ones the backends need (ClusterNeeds.addons: addons_config field -> gcloud name)
_ADDONS = {"gcs_fuse_csi_driver_config": "GcsFuseCsiDriver"}


def _addons(needs: ClusterNeeds) -> dict[str, str]:
    return {**needs.addons, **_ADDONS}


def cluster_body(spec: InfraSpec, needs: ClusterNeeds = ClusterNeeds()) -> dict[str, Any]:
    """The cluster's create request: the add-ons, dataplane v2, Workload Identity, the
    release channel and (Standard) its CPU pool; the other pools are created after it."""
    body: dict[str, Any] = {
        "name": spec.cluster,
        "resource_labels": spec.cluster_labels,
        "addons_config": {field: {"enabled": True} for field in _addons(needs)},
        "network_config": {
            "datapath_provider": "ADVANCED_DATAPATH",  # dataplane v2
            # Seed 001's cluster (as issue 24 reads it) leaves multi-networking off; rlctl
            # turns it on with DCN networks because GKE documents it as required for node
            # pools with --additional-node-network ("Set up multi-network support for
            # Pods"). rlctl creates no Network objects, which GKE's DRANET page warns
            # against combining with DRANET NICs.
            "enable_multi_networking": spec.dcn.count > 0,
        },
        "ip_allocation_policy": {"use_ip_aliases": True},
        "workload_identity_config": {"workload_pool": spec.workload_pool},
        "release_channel": {"channel": _CHANNELS[spec.release_channel]},
    }
    if spec.version:
        body["initial_cluster_version"] = spec.version
    if spec.mode == "autopilot":
        body["autopilot"] = {"enabled": True}
    else:
        body["locations"] = [spec.zone]
        body["node_pools"] = [cpu_pool_body(spec)]
    return body


def _cluster_fields(spec: InfraSpec, needs: ClusterNeeds) -> dict[str, Any]:
    return {
        "location": spec.location,
        "mode": spec.mode,
        "version": spec.version or f"{spec.release_channel} channel default",
        "addons": list(_addons(needs).values()),
        "dataplane": "v2",
        "workload_pool": spec.workload_pool,
        "multi_networking": spec.dcn.count > 0,
    }


# --- observe + plan -----------------------------------------------------------
def _parent(spec_or_project: Any, location: str) -> str:
    project = getattr(spec_or_project, "project", spec_or_project)
    return f"projects/{project}/locations/{location}"


def planned_cluster(
    clients: GcpClients,
    spec: InfraSpec,
    needs: ClusterNeeds = ClusterNeeds(),
    endpoint: str = "0.0.0.0",
) -> Any:
    """The cluster ``cluster create`` makes of ``spec``, as GKE reports it once RUNNING:
    its own request body with every pool it adds (``desired_pools``, the backends' pools).
    What a dry run of ``train --cluster`` without credentials places its pods on."""
    ct = clients.container_types
    body = cluster_body(spec, needs)
    body["node_pools"] = [
        *body.get("node_pools", []),
        *(b for *_, b in desired_pools(spec)),
        *(backend_pool_body(spec, p) for p in wanted_backend_pools(spec, needs.pools)),
    ]
    cur = ct.Cluster(body)
    cur.status = ct.Cluster.Status.RUNNING
    cur.endpoint = endpoint
    cur.location = spec.location
    for pool in cur.node_pools:
        pool.status = ct.NodePool.Status.RUNNING
    return cur


def get_cluster(clients: GcpClients, project: str, location: str, name: str) -> Any | None:
    try:
        return call(
            clients,
            f"reading cluster {name}",
            clients.container.get_cluster,
            name=f"{_parent(project, location)}/clusters/{name}",
        )
    except NotFoundError:
        return None


def project_number(clients: GcpClients, project: str) -> str:
    return str(
        call(clients, f"reading project {project}", clients.projects.get, project=project).id
    )


def _existing_cluster(spec: InfraSpec, cur: Any) -> Action:
    """Wait for or keep an existing cluster; refuse one that is not rlctl's, being
    deleted or in ERROR."""
    if not is_ours(cur.resource_labels):
        raise AlreadyExistsError(
            f"cluster {spec.cluster!r} exists in {spec.location} and is not managed by rlctl",
            hint="choose another cluster name",
        )
    status = cur.status.name
    if status == "STOPPING":
        raise ConflictError(
            f"cluster {spec.cluster!r} is being deleted",
            hint="wait for the deletion to finish, then re-run",
        )
    if status == "ERROR":
        raise ConflictError(
            f"cluster {spec.cluster!r} is in ERROR: {cur.status_message}",
            hint=f"delete it (rlctl cluster delete {spec.cluster}) and re-run",
        )
    return "wait" if status in ("PROVISIONING", "RECONCILING") else "unchanged"


def _cluster_change(spec: InfraSpec, cur: Any | None, needs: ClusterNeeds) -> Change:
    """The cluster itself: created with its CPU pool (priced), or as it is."""
    cost = prices.machine_hour(spec.cpu_machine_type, "on-demand")
    base: dict[str, Any] = dict(
        kind="cluster",
        name=spec.cluster,
        fields=_cluster_fields(spec, needs),
        cost_per_hour=None if cost is None else round(cost * spec.cpu_nodes, 2),
    )
    if spec.mode == "standard":
        base["fields"]["default_pool"] = f"{CPU_POOL}: {spec.cpu_nodes} x {spec.cpu_machine_type}"
    if cur is None:
        subnets = [f"subnet/{spec.subnet_name(i)}" for i in range(spec.dcn.count)]
        return Change(action="create", depends_on=subnets, body=cluster_body(spec, needs), **base)
    action = _existing_cluster(spec, cur)
    base["fields"] = {**base["fields"], "status": cur.status.name}
    base["fields"]["version"] = cur.current_master_version
    return Change(action=action, **base)


def _cluster_changes(
    clients: GcpClients, spec: InfraSpec, needs: ClusterNeeds
) -> tuple[list[Change], list[str]]:
    """The cluster's change and its pools' (``gcp/pools.py``), with notes on what rlctl
    leaves as it is (an add-on turned off)."""
    cur = get_cluster(clients, spec.project, spec.location, spec.cluster)
    out = [_cluster_change(spec, cur, needs)]
    notes = [
        f"cluster has the {addon} add-on disabled; rlctl does not change it"
        for field, addon in _addons(needs).items()
        if cur is not None and not getattr(cur.addons_config, field).enabled
    ]
    have_pools = {} if cur is None else {p.name: p for p in cur.node_pools}
    subnets = [f"subnet/{spec.subnet_name(i)}" for i in range(spec.dcn.count)]
    out += pool_changes(spec, needs.pools, have_pools, f"cluster/{spec.cluster}", subnets)
    return out, notes


def _cost(spec: InfraSpec, changes: list[Change]) -> CostEstimate:
    pools = [c for c in changes if c.kind in ("cluster", "nodepool") and c.action != "delete"]
    unknown = [c.name for c in pools if c.cost_per_hour is None]
    total = None if unknown or not pools else round(sum(c.cost_per_hour or 0 for c in pools), 2)
    return CostEstimate(
        capacity=spec.capacity.kind,
        per_hour=total,
        unknown=unknown,
        note=prices.caveat(spec.region),
    )


def plan_create(clients: GcpClients, spec: InfraSpec, needs: ClusterNeeds = ClusterNeeds()) -> Plan:
    """Pre-flight checks, then network + cluster + node pools + bucket/IAM vs what exists.
    ``needs``: the CPU pools and GKE add-ons the workload backends need (handed in by the
    layer that knows them, ``runs/readiness.py``)."""
    checks = preflight.run(clients, spec, needs.pools)
    changes = network.plan(clients, spec)
    cluster_changes, notes = _cluster_changes(clients, spec, needs)
    changes += cluster_changes
    notes += checks
    number = project_number(clients, spec.project)
    if spec.bucket.name:
        via_nodes = [p.bucket_via_nodes for p in wanted_backend_pools(spec, needs.pools)]
        changes += storage.plan(clients, spec, number, [w for w in via_nodes if w])
    if spec.mode == "standard":  # the roles the nodes run with (new projects lack them)
        grants, grant_notes = project_iam.plan_grants(
            clients,
            spec.project,
            project_iam.default_service_account(number),
            project_iam.NODE_ROLES,
        )
        changes += grants
        notes += grant_notes
    if spec.mode == "autopilot" and spec.accelerators:
        notes.append("autopilot: accelerator nodes are provisioned per workload, no pools made")
    return Plan(
        operation="create",
        target=spec.cluster,
        project=spec.project,
        location=spec.location,
        changes=changes,
        cost=_cost(spec, changes),
        notes=notes,
    )


def plan_delete(
    clients: GcpClients, project: str, region: str, cluster: str, keep_bucket: bool = False
) -> Plan:
    """Everything labelled as rlctl's for ``cluster``, as deletes in dependency order."""
    changes: list[Change] = []
    cur = get_cluster(clients, project, region, cluster)
    ckey = f"cluster/{cluster}"
    if cur is not None:
        if not is_ours(cur.resource_labels):
            raise AlreadyExistsError(
                f"cluster {cluster!r} is not managed by rlctl; refusing to delete it",
                hint="delete it with 'gcloud container clusters delete' if you mean to",
            )
        pools = [
            Change(
                kind="nodepool",
                name=p.name,
                action="delete",
                fields={
                    "machine_type": p.config.machine_type,
                    "nodes": p.initial_node_count,
                    "status": p.status.name,
                    "managed_by_rlctl": is_ours(p.config.resource_labels),
                },
            )
            for p in cur.node_pools
            if p.name != CPU_POOL
        ]
        changes += pools
        changes.append(
            Change(
                kind="cluster",
                name=cluster,
                action="delete",
                depends_on=[p.key for p in pools],
                fields={
                    "location": region,
                    "status": cur.status.name,
                    "version": cur.current_master_version,
                    "default_pool": CPU_POOL,
                },
            )
        )
    for c in network.found(clients, cluster, region):
        if c.kind in ("firewall", "subnet") and cur is not None:
            c.depends_on.append(ckey)
        changes.append(c)
    buckets, notes = storage.found(clients, cluster, keep_bucket)
    changes += buckets
    return Plan(
        operation="delete",
        target=cluster,
        project=project,
        location=region,
        changes=changes,
        notes=notes,
    )


def network_plan_create(clients: GcpClients, spec: InfraSpec) -> Plan:
    """Only the DCN networks, subnets and firewalls (``rlctl network create``)."""
    only_networks = spec.model_copy(update={"accelerators": [], "bucket": type(spec.bucket)()})
    preflight.run(clients, only_networks)
    return Plan(
        operation="create",
        target=spec.cluster,
        project=spec.project,
        location=spec.region,
        changes=network.plan(clients, spec),
    )


def network_plan_delete(clients: GcpClients, project: str, region: str, cluster: str) -> Plan:
    cur = get_cluster(clients, project, region, cluster)
    notes: list[str] = []
    if cur is not None:
        raise ConflictError(
            f"cluster {cluster!r} still exists and uses these networks",
            hint=f"run 'rlctl cluster delete {cluster}', which also removes the networks",
        )
    return Plan(
        operation="delete",
        target=cluster,
        project=project,
        location=region,
        changes=network.found(clients, cluster, region),
        notes=notes,
    )


# --- apply ----------------------------------------------------------------------
def _wait_status(
    clients: GcpClients,
    getter: Callable[[], Any],
    what: str,
    on_poll: Callable[[str], None],
    timeout: float = 3600,
) -> None:
    """Poll a cluster/node pool until RUNNING (an earlier, interrupted apply's operation)."""
    delay = clients.poll_interval
    deadline = time.monotonic() + timeout
    while True:
        obj = getter()
        st = obj.status.name
        on_poll(st)
        if st == "RUNNING":
            return
        if st in ("ERROR", "STOPPING", "RUNNING_WITH_ERROR", "DEGRADED"):
            raise operation_error(what, None, obj.status_message or st)
        if time.monotonic() > deadline:
            raise operation_error(what, None, f"still {st} after {timeout:.0f}s")
        time.sleep(delay)
        delay = min(delay * 1.5, clients.poll_interval * 10)


def _apply_gke(
    clients: GcpClients,
    c: Change,
    project: str,
    location: str,
    cluster: str,
    on_poll: Callable[[str], None],
) -> None:
    gke = clients.container
    t = clients.container_types
    cname = f"{_parent(project, location)}/clusters/{cluster}"
    what = f"{c.action} {c.kind} {c.name}"
    if c.kind == "cluster":
        if c.action == "create":
            op = call(
                clients,
                what,
                gke.create_cluster,
                parent=_parent(project, location),
                cluster=t.Cluster(c.body),
            )
        elif c.action == "delete":
            op = call(clients, what, gke.delete_cluster, name=cname)
        else:  # wait
            return _wait_status(
                clients, lambda: call(clients, what, gke.get_cluster, name=cname), what, on_poll
            )
    else:
        pname = f"{cname}/nodePools/{c.name}"
        if c.action == "create":
            op = call(
                clients, what, gke.create_node_pool, parent=cname, node_pool=t.NodePool(c.body)
            )
        elif c.action == "update":
            op = call(
                clients, what, gke.set_node_pool_size, name=pname, node_count=c.sent["node_count"]
            )
        elif c.action == "delete":
            op = call(clients, what, gke.delete_node_pool, name=pname)
        else:
            return _wait_status(
                clients, lambda: call(clients, what, gke.get_node_pool, name=pname), what, on_poll
            )
    wait_gke(clients, op, location, what, on_poll=on_poll)


def apply_plan(
    clients: GcpClients,
    plan: Plan,
    on_event: Event | None = None,
    handlers: Mapping[str, Callable[[Change, Callable[[str], None]], None]] | None = None,
) -> dict[str, Any]:
    """Apply every non-unchanged change, concurrently where independent; wait for all.

    ``handlers`` apply kinds this module does not know (the in-cluster controllers,
    namespace and KSA that ``core/runs/readiness.py`` adds to the plan).
    """
    region = plan.location
    extra = dict(handlers or {})

    def handler(c: Change, on_poll: Callable[[str], None]) -> None:
        if c.kind in extra:
            extra[c.kind](c, on_poll)
        elif c.kind in ("network", "subnet", "firewall"):
            network.apply(clients, c, region, on_poll)
        elif c.kind in ("cluster", "nodepool"):
            _apply_gke(clients, c, plan.project, plan.location, plan.target, on_poll)
        elif c.kind == project_iam.KIND:
            project_iam.apply(clients, c)
        else:
            storage.apply(clients, c)

    done = execute(plan.pending(), handler, on_event or (lambda *a: None))
    if any(c.kind == "cluster" for c in plan.changes):  # for shell completion
        if plan.operation == "create":
            known.remember(plan.project, [plan.target])
        else:
            known.forget(plan.project, plan.target)
    return {
        "operation": plan.operation,
        "target": plan.target,
        "applied": done,
        "unchanged": [c.key for c in plan.changes if c.action == "unchanged"],
        "noop": plan.noop,
    }


# --- read-only views ------------------------------------------------------------
def _pool_view(p: Any) -> dict[str, Any]:
    cfg = p.config
    v: dict[str, Any] = {
        "name": p.name,
        "status": p.status.name,
        "version": p.version,
        "machine_type": cfg.machine_type,
        "nodes": p.initial_node_count,
        "locations": list(p.locations),
        "spot": bool(cfg.spot),
        "managed_by_rlctl": is_ours(cfg.resource_labels),
    }
    if p.placement_policy.tpu_topology:
        v["topology"] = p.placement_policy.tpu_topology
    if cfg.accelerators:
        v["gpus"] = [f"{a.accelerator_count} x {a.accelerator_type}" for a in cfg.accelerators]
    nets = p.network_config.additional_node_network_configs
    if nets:
        v["additional_networks"] = [n.network for n in nets]
    return v


def describe(
    clients: GcpClients,
    project: str,
    location: str,
    name: str,
    needs: ClusterNeeds = ClusterNeeds(),
) -> dict[str, Any]:
    cur = get_cluster(clients, project, location, name)
    if cur is None:
        raise NotFoundError(
            f"cluster {name!r} not found in {location}",
            hint="list clusters with 'rlctl cluster list'",
        )
    known.remember(project, [cur.name])
    return {
        "name": cur.name,
        "location": cur.location or location,
        "status": cur.status.name,
        "version": cur.current_master_version,
        "endpoint": cur.endpoint,
        "labels": dict(cur.resource_labels),
        "managed_by_rlctl": is_ours(cur.resource_labels),
        "autopilot": bool(cur.autopilot.enabled),
        "addons": {
            field.removesuffix("_config"): bool(getattr(cur.addons_config, field).enabled)
            for field in _addons(needs)
        },
        "dataplane_v2": cur.network_config.datapath_provider.name == "ADVANCED_DATAPATH",
        "multi_networking": bool(cur.network_config.enable_multi_networking),
        "workload_pool": cur.workload_identity_config.workload_pool,
        "node_pools": [_pool_view(p) for p in cur.node_pools],
    }


def list_clusters(clients: GcpClients, project: str, location: str = "-") -> list[dict[str, Any]]:
    resp = call(
        clients,
        "listing clusters",
        clients.container.list_clusters,
        parent=_parent(project, location),
    )
    known.remember(project, [c.name for c in resp.clusters], whole=location == "-")
    return [
        {
            "name": c.name,
            "location": c.location,
            "status": c.status.name,
            "version": c.current_master_version,
            "node_pools": len(c.node_pools),
            "managed_by_rlctl": is_ours(c.resource_labels),
        }
        for c in resp.clusters
    ]
