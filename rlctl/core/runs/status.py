"""Read-only views of runs for ``rlctl status``: pure reads of the run store."""

from __future__ import annotations

import json
from typing import Any

from rlctl.core.runs.results import EVALS, EvalSummary, RunEvals, RunInfo
from rlctl.core.store.base import (
    EVAL,
    METRICS,
    STATUS,
    Phase,
    RunDir,
    RunStore,
    latest_checkpoint_step,
)


def read_status(run: RunDir) -> dict[str, Any]:
    if not run.exists(STATUS):
        return {"name": run.name, "phase": Phase.UNKNOWN}
    try:
        return json.loads(run.read_text(STATUS))
    except json.JSONDecodeError:
        return {"name": run.name, "phase": Phase.UNKNOWN}


def read_metrics(run: RunDir) -> list[dict[str, Any]]:
    """Parse metrics.jsonl, skipping a torn last line from a killed writer."""
    if not run.exists(METRICS):
        return []
    rows = []
    for line in run.read_text(METRICS).splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def read_eval(run: RunDir, which: str) -> dict[str, Any] | None:
    rel = f"{EVAL}/{which}.json"
    return json.loads(run.read_text(rel)) if run.exists(rel) else None


def describe_run(run: RunDir) -> RunInfo:
    status = read_status(run)
    metrics = read_metrics(run)
    evals = {}
    for which in EVALS:
        data = read_eval(run, which)
        if data is not None:
            evals[which] = EvalSummary.model_validate(
                {k: data.get(k) for k in EvalSummary.model_fields})
    return RunInfo(
        name=run.name,
        path=run.uri,
        phase=Phase.parse(status.get("phase", Phase.UNKNOWN)),
        algorithm=status.get("algorithm"),
        step=status.get("step") or 0,
        total_steps=status.get("total_steps"),
        latest_checkpoint=latest_checkpoint_step(run),
        processes=status.get("processes"),
        devices=status.get("devices"),
        created=status.get("created"),
        updated=status.get("updated"),
        error=status.get("error"),
        latest_metrics=metrics[-1] if metrics else None,
        eval=RunEvals(**evals),
    )


def list_runs(store: RunStore) -> list[RunInfo]:
    return [describe_run(store.run(name)) for name in store.list_runs()]
