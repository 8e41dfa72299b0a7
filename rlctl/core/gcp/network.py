"""DCN networks: extra VPC networks (custom subnets, large MTU), their subnets, firewalls.

Compute networks, subnets and firewall rules carry no labels, so rlctl marks them
in ``description`` (``managed-by=rlctl rlctl-cluster=NAME``) and only ever changes
or deletes resources that carry that marker.
"""

from __future__ import annotations

import uuid
from typing import Any

from rlctl.core.config.infra import InfraSpec, is_ours
from rlctl.core.errors import AlreadyExistsError, ConflictError, NotFoundError
from rlctl.core.gcp.api import GcpClients
from rlctl.core.gcp.operations import call, wait_compute
from rlctl.core.plan import Change, diff_fields

PROTOCOLS = ("tcp", "udp", "icmp")


# --- desired state (pure) ---------------------------------------------------
def desired(spec: InfraSpec) -> list[Change]:
    """The network, subnet and firewall rule for each DCN network, with request bodies."""
    out: list[Change] = []
    for i, cidr in enumerate(spec.dcn.ranges()):
        net, sub, fw = spec.network_name(i), spec.subnet_name(i), spec.firewall_name(i)
        net_path = f"projects/{spec.project}/global/networks/{net}"
        out.append(
            Change(
                kind="network",
                name=net,
                action="create",
                fields={"mtu": spec.dcn.mtu, "subnet_mode": "custom"},
                body={
                    "name": net,
                    "mtu": spec.dcn.mtu,
                    "auto_create_subnetworks": False,
                    "routing_config": {"routing_mode": "REGIONAL"},
                    "description": spec.marker,
                },
            )
        )
        out.append(
            Change(
                kind="subnet",
                name=sub,
                action="create",
                depends_on=[f"network/{net}"],
                fields={"network": net, "region": spec.region, "range": cidr},
                body={
                    "name": sub,
                    "network": net_path,
                    "ip_cidr_range": cidr,
                    "region": spec.region,
                    "description": spec.marker,
                },
            )
        )
        out.append(
            Change(
                kind="firewall",
                name=fw,
                action="create",
                depends_on=[f"network/{net}"],
                fields={"network": net, "source_ranges": [cidr], "allow": list(PROTOCOLS)},
                body={
                    "name": fw,
                    "network": net_path,
                    "direction": "INGRESS",
                    "priority": 1000,
                    "source_ranges": [cidr],
                    "allowed": [{"I_p_protocol": p} for p in PROTOCOLS],
                    "description": spec.marker,
                },
            )
        )
    return out


# --- observe -----------------------------------------------------------------
def _get(clients: GcpClients, kind: str, name: str, region: str) -> Any | None:
    fn = {
        "network": lambda: call(
            clients,
            f"reading network {name}",
            clients.networks.get,
            project=clients.project,
            network=name,
        ),
        "subnet": lambda: call(
            clients,
            f"reading subnet {name}",
            clients.subnetworks.get,
            project=clients.project,
            region=region,
            subnetwork=name,
        ),
        "firewall": lambda: call(
            clients,
            f"reading firewall {name}",
            clients.firewalls.get,
            project=clients.project,
            firewall=name,
        ),
    }[kind]
    try:
        return fn()
    except NotFoundError:
        return None


def _view(kind: str, obj: Any) -> dict[str, Any]:
    if kind == "network":
        return {"mtu": obj.mtu, "subnet_mode": "auto" if obj.auto_create_subnetworks else "custom"}
    if kind == "subnet":
        return {
            "network": obj.network.rsplit("/", 1)[-1],
            "region": obj.region.rsplit("/", 1)[-1],
            "range": obj.ip_cidr_range,
        }
    return {
        "network": obj.network.rsplit("/", 1)[-1],
        "source_ranges": list(obj.source_ranges),
        "allow": sorted(a.I_p_protocol for a in obj.allowed),
    }


def plan(clients: GcpClients, spec: InfraSpec) -> list[Change]:
    """Desired DCN resources compared with what exists: create / update / unchanged."""
    out: list[Change] = []
    for c in desired(spec):
        obj = _get(clients, c.kind, c.name, spec.region)
        if obj is None:
            out.append(c)
            continue
        if not is_ours(obj.description, spec.cluster):
            raise AlreadyExistsError(
                f"{c.kind} {c.name!r} exists and is not managed by rlctl for cluster "
                f"{spec.cluster!r}",
                hint="choose another cluster name, or delete that resource yourself",
            )
        have = _view(c.kind, obj)
        want = dict(c.fields)
        if c.kind == "firewall":
            want["allow"] = sorted(want["allow"])
        d = diff_fields(have, want)
        if not d:
            out.append(c.model_copy(update={"action": "unchanged", "body": None}))
        elif (c.kind == "network" and set(d) == {"mtu"}) or (
            c.kind == "firewall" and set(d) <= {"source_ranges", "allow"}
        ):
            out.append(c.model_copy(update={"action": "update", "diff": d}))
        else:
            fields = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in d.items())
            raise ConflictError(
                f"{c.kind} {c.name!r} differs in fields that cannot change in place: {fields}",
                hint=f"delete it first (rlctl network delete {spec.cluster}) "
                "or keep the old values",
            )
    return out


def found(clients: GcpClients, cluster: str, region: str) -> list[Change]:
    """Everything rlctl made for ``cluster``, as delete changes in dependency order."""
    nets = [
        n
        for n in call(clients, "listing networks", clients.networks.list, project=clients.project)
        if is_ours(n.description, cluster)
    ]
    subs = [
        s
        for s in call(
            clients,
            "listing subnets",
            clients.subnetworks.list,
            project=clients.project,
            region=region,
        )
        if is_ours(s.description, cluster)
    ]
    fws = [
        f
        for f in call(
            clients, "listing firewall rules", clients.firewalls.list, project=clients.project
        )
        if is_ours(f.description, cluster)
    ]
    out: list[Change] = []
    for f in fws:
        out.append(
            Change(kind="firewall", name=f.name, action="delete", fields=_view("firewall", f))
        )
    for s in subs:
        out.append(Change(kind="subnet", name=s.name, action="delete", fields=_view("subnet", s)))
    for n in nets:
        deps = [f"firewall/{f.name}" for f in fws if f.network.rsplit("/", 1)[-1] == n.name]
        deps += [f"subnet/{s.name}" for s in subs if s.network.rsplit("/", 1)[-1] == n.name]
        out.append(
            Change(
                kind="network",
                name=n.name,
                action="delete",
                depends_on=deps,
                fields=_view("network", n),
            )
        )
    return out


# --- apply ---------------------------------------------------------------------
def apply(clients: GcpClients, c: Change, region: str, on_poll: Any) -> None:
    """Create, patch or delete one network/subnet/firewall and wait for its operation."""
    t = clients.compute_types
    what = f"{c.action} {c.kind} {c.name}"

    def send(fn: Any, **fields: Any) -> Any:
        # A request id per change makes retried inserts/deletes idempotent server-side.
        req = {"project": clients.project, "request_id": str(uuid.uuid4()), **fields}
        return call(clients, what, fn, request=req)

    if c.kind == "network":
        api, extra = clients.networks, {}
        if c.action == "create":
            op = send(api.insert_unary, network_resource=t.Network(c.body))
        elif c.action == "update":
            op = send(
                api.patch_unary, network=c.name, network_resource=t.Network(mtu=c.sent["mtu"])
            )
        else:
            op = send(api.delete_unary, network=c.name)
    elif c.kind == "subnet":
        api, extra = clients.subnetworks, {"region": region}
        if c.action == "create":
            op = send(api.insert_unary, subnetwork_resource=t.Subnetwork(c.body), **extra)
        else:
            op = send(api.delete_unary, subnetwork=c.name, **extra)
    elif c.kind == "firewall":
        api, extra = clients.firewalls, {}
        if c.action == "create":
            op = send(api.insert_unary, firewall_resource=t.Firewall(c.body))
        elif c.action == "update":
            body = {k: c.sent[k] for k in ("source_ranges", "allowed")}
            op = send(api.patch_unary, firewall=c.name, firewall_resource=t.Firewall(body))
        else:
            op = send(api.delete_unary, firewall=c.name)
    else:  # pragma: no cover - dispatch bug
        raise ValueError(f"network.apply cannot handle {c.key}")
    wait_compute(clients, op, what, region=extra.get("region"), on_poll=on_poll)
