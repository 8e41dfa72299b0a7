"""Why is a run's workload not running? One line from its conditions, pods and events.

Pure functions over the objects the API returns (plain dicts), so every case is
tested from seeded states without a cluster.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from rlctl.core.k8s import backends
from rlctl.core.k8s.backends.base import condition_phase
from rlctl.core.phases import Phase

IMAGE_ERRORS = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
CONFIG_ERRORS = {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}


class Diagnosis(BaseModel):
    """``phase``: pending | running | completed | failed | suspended (absent: no
    workload object, ``apply.describe_workload``)."""

    phase: Phase
    reason: str | None = None
    pods: dict[str, int] = {}  # pod phase -> count


def workload_phase(workload: dict[str, Any] | None) -> tuple[Phase | None, str | None]:
    """(phase, message) from the workload's status alone, as its backend reads it; phase
    None when the workload is not finished and its status does not say it runs (its
    pods do). A kind no backend reads is read by its conditions, as a JobSet's."""
    if workload is None:
        return Phase.UNKNOWN, "no workload object"
    backend = backends.for_object(workload)
    return backend.phase(workload) if backend is not None else condition_phase(workload)


def _selector_text(pod: dict[str, Any]) -> str:
    sel = (pod.get("spec") or {}).get("nodeSelector") or {}
    keys = (
        "cloud.google.com/gke-tpu-accelerator",
        "cloud.google.com/gke-tpu-topology",
        "cloud.google.com/gke-accelerator",
    )
    parts = [f"{k.rsplit('/', 1)[1]}={sel[k]}" for k in keys if k in sel]
    return ", ".join(parts) or "its node selector"


def _requested(pod: dict[str, Any], resource: str) -> Any:
    for c in (pod.get("spec") or {}).get("containers") or []:
        limits = ((c.get("resources") or {}).get("limits")) or {}
        if resource in limits:
            return limits[resource]
    return None


def _scheduling_message(pod: dict[str, Any], events: list[dict[str, Any]]) -> str | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if (
            c.get("type") == "PodScheduled"
            and c.get("status") == "False"
            and c.get("reason") == "Unschedulable"
        ):
            return c.get("message") or "unschedulable"
    name = pod.get("metadata", {}).get("name")
    for e in reversed(events):
        if (e.get("involvedObject") or {}).get("name") == name and e.get("reason") in (
            "FailedScheduling",
            "NotTriggerScaleUp",
        ):
            return e.get("message") or e.get("reason")
    return None


def _unschedulable_reason(pod: dict[str, Any], message: str) -> str:
    low = message.lower()
    for res in ("google.com/tpu", "nvidia.com/gpu"):
        if f"insufficient {res}" in low:
            return (
                f"unschedulable: insufficient {res} ({_requested(pod, res)} per pod) "
                f"on nodes with {_selector_text(pod)}"
            )
    if "node affinity/selector" in low or "didn't match" in low or "node selector" in low:
        return f"unschedulable: no node pool matches {_selector_text(pod)}"
    if "insufficient cpu" in low or "insufficient memory" in low:
        return f"unschedulable: insufficient cpu/memory ({message.strip()})"
    return f"unschedulable: {message.strip()}"


def _container_states(pod: dict[str, Any]) -> list[dict[str, Any]]:
    st = pod.get("status") or {}
    return (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or [])


def _pod_problem(
    pod: dict[str, Any], events: list[dict[str, Any]], last_lines: dict[str, str]
) -> tuple[int, str] | None:
    """(severity, reason) of one pod's problem; higher severity wins across pods."""
    name = pod.get("metadata", {}).get("name", "?")
    for cs in _container_states(pod):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        terminated = (
            (cs.get("lastState") or {}).get("terminated")
            or (cs.get("state") or {}).get("terminated")
            or {}
        )
        if reason == "CrashLoopBackOff" or (terminated.get("exitCode") and cs.get("restartCount")):
            line = last_lines.get(name) or "(no log output)"
            code = terminated.get("exitCode")
            return 4, (
                f"crash loop in {name} (exit {code}, {cs.get('restartCount', 0)} "
                f"restarts): {line.strip()}"
            )
        if reason in IMAGE_ERRORS:
            image = cs.get("image") or "?"
            msg = waiting.get("message") or reason
            return 3, f"image pull error for {image}: {msg}"
        if reason in CONFIG_ERRORS:
            return 3, f"container config error in {name}: {waiting.get('message') or reason}"
    if (pod.get("status") or {}).get("phase") == "Failed":
        last = last_lines.get(name)
        return 2, f"pod {name} failed" + (f": {last.strip()}" if last else "")
    if (pod.get("status") or {}).get("phase") == "Pending":
        msg = _scheduling_message(pod, events)
        if msg:
            return 1, _unschedulable_reason(pod, msg)
        for e in reversed(events):  # e.g. "Failed to pull image" before the status shows it
            if (
                (e.get("involvedObject") or {}).get("name") == name
                and e.get("type") == "Warning"
                and "pull" in (e.get("message") or "").lower()
            ):
                return 3, f"image pull error: {e.get('message')}"
    return None


def diagnose(
    workload: dict[str, Any] | None,
    pods: list[dict[str, Any]],
    events: list[dict[str, Any]],
    last_lines: dict[str, str] | None = None,
) -> Diagnosis:
    """The workload's phase and, when it is not simply running or done, why, in one line.

    Args:
        workload: the JobSet / PathwaysJob / RayJob object (None when absent).
        pods: the run's pods (label ``rlctl.dev/run=RUN``).
        events: events of the namespace (only those about the pods are used).
        last_lines: pod name -> last log line, for crashing pods.
    """
    counts: dict[str, int] = {}
    for p in pods:
        ph = (p.get("status") or {}).get("phase") or "Unknown"
        counts[ph] = counts.get(ph, 0) + 1
    phase, message = workload_phase(workload)
    if phase in (Phase.COMPLETED, Phase.SUSPENDED):
        return Diagnosis(phase=phase, reason=message, pods=counts)
    problems = [pr for p in pods if (pr := _pod_problem(p, events, last_lines or {}))]
    if phase is Phase.FAILED:
        return Diagnosis(
            phase=Phase.FAILED,
            reason=message or (max(problems)[1] if problems else None),
            pods=counts,
        )
    if problems:
        severity, reason = max(problems, key=lambda x: x[0])
        pending = severity == 1 or (counts.get("Pending", 0) > 0 and severity != 4)
        return Diagnosis(
            phase=Phase.PENDING if pending else Phase.RUNNING, reason=reason, pods=counts
        )
    if not pods:
        if phase is Phase.RUNNING:  # a workload whose status says so (a RayJob)
            return Diagnosis(phase=Phase.RUNNING, reason=None, pods=counts)
        return Diagnosis(phase=Phase.PENDING, reason=message or "no pods yet", pods=counts)
    if counts.get("Pending"):  # Kubernetes' own pod phase
        return Diagnosis(
            phase=Phase.PENDING,
            reason=f"{counts['Pending']} of {len(pods)} pods pending",
            pods=counts,
        )
    return Diagnosis(phase=Phase.RUNNING, reason=None, pods=counts)
