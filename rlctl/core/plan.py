"""Plans as data: desired state vs observed state -> ordered, dependency-aware changes.

Pure (pydantic only). The resource modules under ``core/gcp`` build ``Change``s;
the executor in ``core/gcp/operations.py`` applies them, concurrently where the
``depends_on`` edges allow.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

Action = Literal["create", "update", "wait", "unchanged", "delete"]
MUTATING: frozenset[str] = frozenset({"create", "update", "delete"})


class Change(BaseModel):
    """One resource and what the plan does to it."""

    # network | subnet | firewall | cluster | nodepool | bucket | iam; for a run: the
    # Kubernetes kind of its objects (JobSet, ConfigMap, ...) and files (its run store folder)
    kind: str
    name: str
    action: Action
    fields: dict[str, Any] = Field(default_factory=dict, description="key fields, for people")
    diff: dict[str, tuple[Any, Any]] = Field(
        default_factory=dict, description="field -> (observed, desired) for updates"
    )
    depends_on: list[str] = Field(default_factory=list)
    cost_per_hour: float | None = None
    # What apply sends; kept out of the JSON plan (it repeats ``fields``).
    body: dict[str, Any] | None = Field(default=None, exclude=True)

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.name}"

    @property
    def mutates(self) -> bool:
        return self.action in MUTATING

    @property
    def sent(self) -> dict[str, Any]:
        """``body``, for apply: a plan's create and update changes always carry one."""
        if self.body is None:
            raise ValueError(f"{self.action} {self.key} carries no body to send")
        return self.body


class CostEstimate(BaseModel):
    capacity: str
    per_hour: float | None = Field(description="sum over node pools; None if any is unknown")
    unknown: list[str] = Field(default_factory=list, description="pools without a list price")
    note: str


class Plan(BaseModel):
    operation: Literal["create", "delete"]
    target: str
    project: str
    location: str
    changes: list[Change] = Field(default_factory=list)
    cost: CostEstimate | None = None
    notes: list[str] = Field(default_factory=list)

    @property
    def noop(self) -> bool:
        return not any(c.mutates or c.action == "wait" for c in self.changes)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.changes:
            out[c.action] = out.get(c.action, 0) + 1
        return out

    def pending(self) -> list[Change]:
        """Changes apply has to act on (mutations and waits), in dependency order."""
        return topo_order([c for c in self.changes if c.action != "unchanged"])


class ApplyResult(BaseModel):
    """What applying a plan did (the ``result`` next to the ``plan`` of ``-o json``)."""

    operation: Literal["create", "delete"]
    target: str
    applied: list[str] = Field(default_factory=list, description="keys of the changes made")
    unchanged: list[str] = Field(default_factory=list)
    noop: bool = False

    @classmethod
    def of(cls, plan: Plan, applied: list[str]) -> ApplyResult:
        return cls(
            operation=plan.operation,
            target=plan.target,
            applied=applied,
            unchanged=[c.key for c in plan.changes if c.action == "unchanged"],
            noop=plan.noop,
        )


def topo_order(changes: list[Change]) -> list[Change]:
    """Stable topological order; edges to keys outside ``changes`` are ignored."""
    by_key = {c.key: c for c in changes}
    done: set[str] = set()
    out: list[Change] = []
    visiting: set[str] = set()

    def visit(c: Change) -> None:
        if c.key in done:
            return
        if c.key in visiting:
            raise ValueError(f"dependency cycle at {c.key}")
        visiting.add(c.key)
        for d in c.depends_on:
            if d in by_key:
                visit(by_key[d])
        visiting.discard(c.key)
        done.add(c.key)
        out.append(c)

    for c in changes:
        visit(c)
    return out


def diff_fields(observed: dict[str, Any], desired: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Fields of ``desired`` whose observed value differs (missing counts as None)."""
    return {k: (observed.get(k), v) for k, v in desired.items() if observed.get(k) != v}
