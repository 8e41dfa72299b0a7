"""rlctl's node pools of a cluster: their bodies and what ``cluster create`` plans for them.

Three kinds, each planned by one function here against the pools the cluster has:
the accelerator pools of the spec (one per TPU slice, one per GPU entry:
``accelerator_changes``), the CPU pools workload backends bring (the Pathways head's:
``backend_pool_changes``, from each backend's ``node_pools``, handed in by
``runs/readiness.py``, the layer that joins the GCP and Kubernetes sides), and rlctl's
pools the spec no longer names (``leftover_changes``). The cluster's own CPU pool is made
with the cluster (``cpu_pool_body``). Pure but for the pools read by the caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlctl.core.config import prices
from rlctl.core.config.catalog import Accelerator, lookup
from rlctl.core.config.infra import DRANET_LABEL, MANAGED_BY, RLCTL, InfraSpec
from rlctl.core.config.pools import PoolRequest
from rlctl.core.errors import AlreadyExistsError, ConflictError
from rlctl.core.plan import Change

CPU_POOL = "cpu"
# The seeds' TPU pools: full access scope (the pods reach GCS and a backend's storage
# through Workload Identity; the node's own scope must not be the narrower default)
# and, on v6e, one thread per core, as `gcloud ... node-pools create --threads-per-core=1`
# (config.nodes.TPU_THREADS_PER_CORE: it halves a host's vCPUs, which pods are sized by).
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"


def is_ours(labels: Any) -> bool:
    """Whether a GCP resource carries rlctl's ``managed-by`` label."""
    return dict(labels or {}).get(MANAGED_BY) == RLCTL


# --- bodies (pure) -------------------------------------------------------------------
def _node_networks(spec: InfraSpec) -> list[dict[str, str]]:
    """The DCN networks a pool's nodes join (``--additional-node-network``), one per NIC."""
    return [
        {"network": spec.network_name(i), "subnetwork": spec.subnet_name(i)}
        for i in range(spec.dcn.count)
    ]


def _capacity_config(spec: InfraSpec) -> dict[str, Any]:
    """An accelerator pool's capacity: spot VMs, a named reservation, or on-demand."""
    if spec.capacity.kind == "spot":
        return {"spot": True}
    if spec.capacity.kind == "reservation":
        return {
            "reservation_affinity": {
                "consume_reservation_type": "SPECIFIC_RESERVATION",
                "key": "compute.googleapis.com/reservation-name",
                "values": [spec.capacity.reservation],
            }
        }
    return {}


def pool_name(acc: Accelerator, index: int) -> str:
    """``<type>-<i>``: how rlctl names its accelerator pools (read back by ``cluster.py``)."""
    return f"{acc.name}-{index}"


def desired_pools(spec: InfraSpec) -> list[tuple[str, Accelerator, int, dict[str, Any]]]:
    """(name, accelerator, nodes, NodePool body) for each accelerator pool.

    One pool per TPU slice (multi-slice = several pools); GPUs get one pool of
    ``count`` machines per entry.
    """
    out = []
    idx: dict[str, int] = {}
    for s in spec.accelerators:
        acc = lookup(s.type)
        for nodes in acc.strategy.pool_sizes(acc, s.count):
            i = idx.get(acc.name, 0)
            idx[acc.name] = i + 1
            name = pool_name(acc, i)
            config: dict[str, Any] = {
                "machine_type": acc.machine_type,
                "resource_labels": spec.labels,
                "gvnic": {"enabled": True},
                "workload_metadata_config": {"mode": "GKE_METADATA"},
                **_capacity_config(spec),
            }
            if spec.dcn.count:
                config["labels"] = {DRANET_LABEL: "true"}
            config["oauth_scopes"] = [CLOUD_PLATFORM]
            config.update(acc.strategy.pool_config(acc))  # TPU: threads; GPU: the GPUs
            body: dict[str, Any] = {
                "name": name,
                "initial_node_count": nodes,
                "locations": [spec.zone],
                "config": config,
                "management": {"auto_repair": True, "auto_upgrade": True},
            }
            body.update(acc.strategy.pool_extras(acc))  # a multi-host slice: its placement
            if spec.dcn.count:
                body["network_config"] = {"additional_node_network_configs": _node_networks(spec)}
            out.append((name, acc, nodes, body))
    return out


def cpu_pool_body(spec: InfraSpec) -> dict[str, Any]:
    """The cluster's own CPU pool (controllers, Ray heads, submitters), made with it."""
    return {
        "name": CPU_POOL,
        "initial_node_count": spec.cpu_nodes,
        "config": {
            "machine_type": spec.cpu_machine_type,
            "resource_labels": spec.labels,
            "gvnic": {"enabled": True},
            "workload_metadata_config": {"mode": "GKE_METADATA"},
        },
        "management": {"auto_repair": True, "auto_upgrade": True},
    }


def backend_pool_body(spec: InfraSpec, pool: PoolRequest) -> dict[str, Any]:
    """A backend's CPU pool (the Pathways head's: XPK's cpu-np), empty until one of its
    pods asks: the cluster autoscaler adds a node for a pending pod and removes it idle."""
    return {
        "name": pool.name,
        "initial_node_count": 0,
        "config": {
            "machine_type": pool.machine_type,
            "resource_labels": spec.labels,
            "gvnic": {"enabled": True},
            "workload_metadata_config": {"mode": "GKE_METADATA"},
            "oauth_scopes": [CLOUD_PLATFORM],
            "taints": [{"key": pool.taint[0], "value": pool.taint[1], "effect": "NO_SCHEDULE"}],
        },
        "autoscaling": {"enabled": True, "min_node_count": 0, "max_node_count": pool.max_nodes},
        "management": {"auto_repair": True, "auto_upgrade": True},
    }


def wanted_backend_pools(spec: InfraSpec, pools: Sequence[PoolRequest]) -> list[PoolRequest]:
    """The backends' pools this cluster gets (``InfraSpec.wants_pool``), once each."""
    seen: dict[str, PoolRequest] = {}
    for p in pools:
        if spec.wants_pool(p):
            seen.setdefault(p.name, p)
    return list(seen.values())


def _pool_fields(spec: InfraSpec, acc: Accelerator | None, nodes: int, machine: str) -> dict:
    """What the plan shows of an accelerator pool."""
    f: dict[str, Any] = {"machine_type": machine, "nodes": nodes}
    if acc is not None:
        f.update(accelerator=acc.name, zone=spec.zone, capacity=spec.capacity.kind)
        f.update(acc.strategy.plan_fields(acc))
        if spec.dcn.count:
            f.update(additional_networks=spec.dcn.count, dranet=True)
    return f


# --- plans against what exists ----------------------------------------------------------
def _existing_accelerator_pool(spec: InfraSpec, name: str, acc: Accelerator, have: Any) -> None:
    """Refuse a pool of that name that is not rlctl's, of another shape, or in ERROR."""
    if not is_ours(have.config.resource_labels):
        raise AlreadyExistsError(
            f"node pool {name!r} exists and is not managed by rlctl",
            hint="remove it or choose another cluster",
        )
    if have.config.machine_type != acc.machine_type or (
        acc.multi_host and have.placement_policy.tpu_topology != acc.topology
    ):
        raise ConflictError(
            f"node pool {name!r} is {have.config.machine_type} "
            f"{have.placement_policy.tpu_topology or ''}, the spec wants {acc.machine_type} "
            f"{acc.topology or ''}",
            hint=f"delete the cluster's pool first, or keep the old accelerator "
            f"(rlctl cluster describe {spec.cluster})",
        )
    if have.status.name == "ERROR":
        raise ConflictError(
            f"node pool {name!r} is in ERROR: {have.status_message}",
            hint=f"delete the cluster (rlctl cluster delete {spec.cluster}) "
            "or the pool, and re-run",
        )


def accelerator_changes(
    spec: InfraSpec, have_pools: dict[str, Any], ckey: str, subnets: list[str]
) -> list[Change]:
    """Create, resize, wait for or keep each accelerator pool of the spec."""
    out: list[Change] = []
    for name, acc, nodes, body in desired_pools(spec) if spec.mode == "standard" else []:
        base: dict[str, Any] = dict(
            kind="nodepool",
            name=name,
            fields=_pool_fields(spec, acc, nodes, acc.machine_type),
            cost_per_hour=prices.pool_hour(acc, nodes, spec.capacity.kind),
            depends_on=[ckey, *subnets],
        )
        have = have_pools.get(name)
        if have is None:
            out.append(Change(action="create", body=body, **base))
            continue
        _existing_accelerator_pool(spec, name, acc, have)
        if have.status.name in ("PROVISIONING", "RECONCILING"):
            out.append(Change(action="wait", **base))
        elif have.initial_node_count != nodes and acc.strategy.resizable:
            out.append(
                Change(
                    action="update",
                    body={"node_count": nodes},
                    diff={"nodes": (have.initial_node_count, nodes)},
                    **base,
                )
            )
        else:
            out.append(Change(action="unchanged", **base))
    return out


def backend_pool_changes(
    spec: InfraSpec, pools: Sequence[PoolRequest], have_pools: dict[str, Any], ckey: str
) -> list[Change]:
    """Create, wait for or keep each backend pool the cluster gets; costs nothing until
    used (shown as its hourly price while a node runs)."""
    out: list[Change] = []
    for pool in wanted_backend_pools(spec, pools):
        fields: dict[str, Any] = {
            "machine_type": pool.machine_type,
            "nodes": f"0..{pool.max_nodes} (autoscaled)",
            "for": pool.purpose,
            "taint": "{}={}:NoSchedule".format(*pool.taint),
        }
        hour = prices.machine_hour(pool.machine_type)  # on-demand, as it is made
        if hour is not None:
            fields["per_hour_while_used"] = round(hour, 2)
        base: dict[str, Any] = dict(
            kind="nodepool", name=pool.name, fields=fields, cost_per_hour=0.0, depends_on=[ckey]
        )
        have = have_pools.get(pool.name)
        if have is None:
            out.append(Change(action="create", body=backend_pool_body(spec, pool), **base))
        elif not is_ours(have.config.resource_labels):
            raise AlreadyExistsError(
                f"node pool {pool.name!r} exists and is not managed by rlctl",
                hint=f"remove it, or leave the pool out: --set pools.{pool.name}=false",
            )
        else:
            busy = have.status.name in ("PROVISIONING", "RECONCILING")
            out.append(Change(action="wait" if busy else "unchanged", **base))
    return out


def leftover_changes(have_pools: dict[str, Any], wanted: set[str]) -> list[Change]:
    """Delete rlctl's pools the spec no longer names (never the CPU pool, never others')."""
    return [
        Change(
            kind="nodepool",
            name=name,
            action="delete",
            fields={"machine_type": have.config.machine_type, "nodes": have.initial_node_count},
        )
        for name, have in have_pools.items()
        if name != CPU_POOL and name not in wanted and is_ours(have.config.resource_labels)
    ]


def pool_changes(
    spec: InfraSpec,
    pools: Sequence[PoolRequest],
    have_pools: dict[str, Any],
    ckey: str,
    subnets: list[str],
) -> list[Change]:
    """Every pool change of ``cluster create``: the accelerators', the backends', leftovers."""
    out = accelerator_changes(spec, have_pools, ckey, subnets)
    out += backend_pool_changes(spec, pools, have_pools, ckey)
    return out + leftover_changes(have_pools, {c.name for c in out})
