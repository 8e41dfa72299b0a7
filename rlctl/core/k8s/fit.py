"""Will every pod of a run get a node? The scheduler's answer, before anything is applied.

``check`` places the pods of a run's workload (``backends.pod_groups``: what the
controllers will create, as they will admit them) on the nodes of the cluster's node
pools (``config.nodes.NodePool``: allocatable after threads per core and GKE's
reservations, labels, taints) the way kube-scheduler's filters decide it
(kubernetes ``pkg/scheduler/framework/plugins``: NodeResourcesFit, NodeAffinity's
nodeSelector, TaintToleration), first fit, group after group, on an otherwise empty
cluster: a pod that fits here may still wait for capacity others hold, but a pod that
does not fit here stays Pending on that cluster whatever else runs.

JobSet's exclusive placement is honoured as its webhook enforces it (``backends/jobset``):
all pods of one job in the leader's domain of the topology key, one job per domain.

For each group the result names the pool(s) that take it, or one reason it would stay
Pending: ``selector`` (no pool has the labels it selects), ``taint`` (it tolerates no
pool's taint), ``cpu`` / ``memory`` / ``accelerator`` (one pod is larger than a node),
``pinned`` (the pods a job pins to one domain do not fit in one), ``nodes`` (too few).
Pure: no cluster is called.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from rlctl.core.config.catalog import machine
from rlctl.core.config.nodes import HOSTNAME_LABEL, NodePool
from rlctl.core.k8s.admission import PodGroup, Requests

Reason = Literal["selector", "taint", "cpu", "memory", "accelerator", "pinned", "nodes"]
GiB = 2**30


class Placement(BaseModel):
    """Where one pod group goes, or why it cannot."""

    group: str
    role: str
    pods: int
    pools: list[str] = []  # the pools that take it (empty: it does not fit)
    reason: Reason | None = None
    detail: str = ""  # one clause: what it asks and what the nodes have

    @property
    def fits(self) -> bool:
        return self.reason is None


class FitReport(BaseModel):
    placements: list[Placement]

    @property
    def fits(self) -> bool:
        return all(p.fits for p in self.placements)

    @property
    def misfits(self) -> list[Placement]:
        return [p for p in self.placements if not p.fits]


@dataclass
class _Node:
    pool: NodePool
    index: int
    free: Requests
    labels: dict[str, str] = field(default_factory=dict)
    taken_by: str | None = None  # the pinned job that holds its domain

    def domain(self, key: str) -> str | None:
        return self.labels.get(key)


def _nodes(pools: Sequence[NodePool]) -> list[_Node]:
    out = []
    for p in pools:
        for i in range(p.nodes):
            labels = {**p.labels, HOSTNAME_LABEL: f"{p.name}-{i}"}
            out.append(
                _Node(
                    p,
                    i,
                    Requests(cpu=p.cpu, memory=p.memory_gib * GiB, extended=dict(p.extended)),
                    labels,
                )
            )
    return out


def _fits(r: Requests, free: Requests) -> bool:
    return (
        r.cpu <= free.cpu + 1e-9
        and r.memory <= free.memory + 1e-3
        and all(n <= free.extended.get(k, 0) for k, n in r.extended.items() if n)
    )


def _minus(free: Requests, r: Requests) -> Requests:
    return Requests(
        cpu=free.cpu - r.cpu,
        memory=free.memory - r.memory,
        extended={k: v - r.extended.get(k, 0) for k, v in free.extended.items()},
    )


def selects(g: PodGroup, p: NodePool) -> bool:
    return all(p.labels.get(k) == v for k, v in g.node_selector.items())


def tolerates(g: PodGroup, p: NodePool) -> bool:
    """Every NoSchedule/NoExecute taint of the pool is tolerated (TaintToleration)."""

    def ok(t) -> bool:
        return any(
            (tol.get("key") in (None, "", t.key))
            and (tol.get("operator", "Equal") == "Exists" or tol.get("value") == t.value)
            and tol.get("effect") in (None, "", t.effect)
            for tol in g.tolerations
        )

    return all(ok(t) for t in p.taints if t.effect in ("NoSchedule", "NoExecute"))


def _fmt(r: Requests) -> str:
    parts = [f"{r.cpu:g} CPU", f"{r.memory / GiB:.1f} GiB"]
    parts += [f"{n} {k}" for k, n in r.extended.items() if n]
    return ", ".join(parts)


def _size_reason(g: PodGroup, pools: list[NodePool]) -> tuple[Reason, str]:
    """The resource a pod is too large for, on the largest of the pools it may use."""
    r = g.requests
    best = max(pools, key=lambda p: (p.cpu, p.memory_gib))
    for k, n in r.extended.items():
        if n and all(n > p.extended.get(k, 0) for p in pools):
            return "accelerator", (
                f"each pod asks {n} {k}; nodes of {best.describe()} have {best.extended.get(k, 0)}"
            )
    if all(r.cpu > p.cpu + 1e-9 for p in pools):
        smt = " with one thread per core" if best.vcpus < _catalog_vcpus(best) else ""
        return "cpu", (
            f"each pod asks {r.cpu:g} CPU; a node of {best.describe()} offers "
            f"{best.cpu:.1f} to pods ({best.vcpus} vCPUs{smt}, less GKE's "
            "reservations and DaemonSets)"
        )
    return "memory", (
        f"each pod asks {r.memory / GiB:.1f} GiB; a node of {best.describe()} "
        f"offers {best.memory_gib:.1f} GiB to pods"
    )


def _catalog_vcpus(p: NodePool) -> int:
    m = machine(p.machine_type)
    return m.vcpus if m else p.vcpus


def _unmatched(g: PodGroup, pools: Sequence[NodePool]) -> tuple[Reason, str]:
    selected = [p for p in pools if selects(g, p)]
    if not selected:
        want = ", ".join(f"{k}={v}" for k, v in g.node_selector.items())
        near = sorted(
            {f"{k}={p.labels[k]}" for p in pools for k in g.node_selector if k in p.labels}
        )
        has = f" (the pools have {', '.join(near)})" if near else ""
        return "selector", f"no node pool has {want}{has}"
    names = ", ".join(p.name for p in selected)
    taints = sorted({f"{t.key}={t.value}:{t.effect}" for p in selected for t in p.taints})
    return (
        "taint",
        f"pool(s) {names} are tainted {', '.join(taints)} and the pods do not tolerate it",
    )


def _place_free(g: PodGroup, nodes: list[_Node], n: int) -> list[_Node] | None:
    """First fit of ``n`` pods, each on any node; the nodes used (None: not all fit)."""
    used = []
    trial = {id(x): x.free for x in nodes}
    for _ in range(n):
        for x in nodes:
            if _fits(g.requests, trial[id(x)]):
                trial[id(x)] = _minus(trial[id(x)], g.requests)
                used.append(x)
                break
        else:
            return None
    for x in nodes:
        x.free = trial[id(x)]
    return used


def _place_pinned(g: PodGroup, nodes: list[_Node], key: str) -> tuple[list[_Node], int]:
    """Each job's pods in one free domain of ``key``; (nodes used, jobs placed)."""
    domains: dict[str, list[_Node]] = {}
    for x in nodes:
        d = x.domain(key)
        if d is not None:
            domains.setdefault(d, []).append(x)
    used: list[_Node] = []
    placed = 0
    for job in range(g.jobs):
        for members in domains.values():
            if any(x.taken_by not in (None, f"{g.name}#{job}") for x in members):
                continue
            got = _place_free(g, members, g.pods)
            if got is not None:
                for x in members:
                    x.taken_by = f"{g.name}#{job}"
                used += got
                placed += 1
                break
    return used, placed


def check(groups: Sequence[PodGroup], pools: Sequence[NodePool]) -> FitReport:
    """Place every group on the pools' nodes, in order; a placement per group."""
    nodes = _nodes(pools)
    out: list[Placement] = []
    for g in groups:
        base: dict[str, Any] = {"group": g.name, "role": g.role, "pods": g.total}
        ok = [p for p in pools if selects(g, p) and tolerates(g, p)]
        if not ok:
            reason, detail = _unmatched(g, pools)
            out.append(Placement(**base, reason=reason, detail=detail))
            continue
        if not any(
            _fits(
                g.requests,
                Requests(cpu=p.cpu, memory=p.memory_gib * GiB, extended=dict(p.extended)),
            )
            for p in ok
        ):
            reason, detail = _size_reason(g, ok)
            out.append(Placement(**base, reason=reason, detail=detail))
            continue
        mine = [x for x in nodes if x.pool in ok]
        if g.pinned:
            used, placed = _place_pinned(g, mine, g.pinned)
            if placed < g.jobs:
                per = max((_capacity(g, [x]) for x in mine), default=0)
                where = "node" if g.pinned == HOSTNAME_LABEL else f"{g.pinned} domain"
                detail = (
                    f"JobSet's exclusive placement ({g.pinned}) puts the {g.pods} pods "
                    f"of each of {g.jobs} job(s) in one {where}; "
                )
                detail += (
                    f"a node takes {per} of them"
                    if g.pinned == HOSTNAME_LABEL
                    else f"only {placed} job(s) find a free one"
                )
                out.append(Placement(**base, reason="pinned", detail=detail))
                continue
        else:
            got = _place_free(g, mine, g.total)
            if got is None:
                cap = _capacity(g, mine)
                out.append(
                    Placement(
                        **base,
                        reason="nodes",
                        detail=(
                            f"{g.total} pods of {_fmt(g.requests)} each; the nodes of "
                            f"{', '.join(p.describe() for p in ok)} have room for {cap}"
                        ),
                    )
                )
                continue
            used = got
        names = list(dict.fromkeys(x.pool.name for x in used))
        out.append(Placement(**base, pools=names))
    return FitReport(placements=out)


def _capacity(g: PodGroup, nodes: list[_Node]) -> int:
    """How many more pods of ``g`` the nodes take, as they are now."""
    n = 0
    for x in nodes:
        free = x.free
        while _fits(g.requests, free) and n < 10_000:
            free = _minus(free, g.requests)
            n += 1
    return n
