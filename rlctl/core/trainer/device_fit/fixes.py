"""The setting that makes a run fit, worded for what did not (a ``DeviceFit``'s reason):
the plan's hint (core/runs/device_fit.py) and a local accelerator's (run/loop.py).

Pure: the spec, the report and, on a cluster, the catalog's sizes of its accelerator.
"""

from __future__ import annotations

from rlctl.core.config.catalog import Accelerator, all_types
from rlctl.core.config.models import RunSpec
from rlctl.core.trainer.device_fit.report import DeviceFit
from rlctl.core.units import human_bytes


def fix_for(
    report: DeviceFit, spec: RunSpec, acc: Accelerator | None = None, count: int = 1
) -> str:
    """The setting that makes a run fit, for what did not (``report.reason``); ``acc``
    and ``count``: a cluster's accelerator, whose larger slice may be the fix."""
    t, r = spec.training, spec.rollout
    bigger = _bigger(acc) if acc is not None else None
    larger = f"-a '{bigger.name}{f' x{count}' if count > 1 else ''}'" if bigger else None
    if report.reason == "state":
        moves = [] if t.lora_rank is not None else ["--lora-rank 16 (no moments for the base)"]
        if larger:
            moves.append(f"a larger slice that shards it over more chips ({larger})")
        return (
            f"the weights and optimizer state alone take {human_bytes(report.state)} per "
            f"{report.unit}: " + (" or ".join(moves) or "a smaller model")
        )
    if report.reason == "update":
        moves = []
        if not t.remat:
            moves.append("--set training.remat=true (recompute each layer in the backward)")
        moves.append(f"--max-new-tokens {max(1, r.max_new_tokens // 2)}")
        if t.lora_rank is None:
            moves.append("--lora-rank 16")
        if larger:
            moves.append(larger)
        return "the update does not fit even in micro-batches of 1 sequence: " + ", or ".join(moves)
    if report.reason == "eval":
        return f"--set eval.batch_size={max(1, spec.eval.batch_size // 2)}"
    rows = t.prompts_per_step * r.num_generations
    return (
        f"the rollout decodes {rows} sequences at once: --prompts-per-step "
        f"{max(1, t.prompts_per_step // 2)} or --max-new-tokens {max(1, r.max_new_tokens // 2)}"
        + (f", or {larger}" if larger else "")
    )


def _bigger(acc: Accelerator) -> Accelerator | None:
    """The next slice of ``acc``'s generation with twice its chips or more (TPU)."""
    if acc.kind != "tpu":
        return None
    same = sorted(
        (a for a in all_types() if a.family == acc.family and a.chips >= 2 * acc.chips),
        key=lambda a: a.chips,
    )
    return same[0] if same else None
