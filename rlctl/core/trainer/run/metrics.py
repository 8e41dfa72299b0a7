"""Per-step metrics to ``metrics.jsonl`` and TensorBoard event files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlctl.core.store.base import METRICS, TENSORBOARD, RunDir


def summary_writer() -> Any:
    """tensorboardX's ``SummaryWriter``, imported without torch.

    Pitfall: tensorboardX imports torch whenever it is installed, only to accept torch
    tensors (rlctl writes floats): 2.5 s and about 250 MB of resident memory in the
    trainer's process. torch is hidden for that one import; a later ``import torch``
    works as usual.
    """
    import sys

    if "tensorboardX" in sys.modules or "torch" in sys.modules:
        from tensorboardX import SummaryWriter

        return SummaryWriter
    sys.modules["torch"] = None  # type: ignore[assignment]  # import torch: ImportError
    try:
        from tensorboardX import SummaryWriter
    finally:
        del sys.modules["torch"]
    return SummaryWriter


class MetricsWriter:
    def __init__(self, run: RunDir, tensorboard: bool = True) -> None:
        self.run = run
        self.path = Path(run.path_for(METRICS))
        run.pull(METRICS)  # a remote store: continue its metrics.jsonl on resume
        self._tb = None
        if tensorboard:
            self._tb = summary_writer()(run.path_for(TENSORBOARD), flush_secs=10)

    def truncate_after(self, step: int) -> None:
        """On resume, drop lines of steps the checkpoint does not contain, and leave
        one line per step in step order (the last written wins: a copied or re-ordered
        file must not come out of a resume as steps 1, 1, 2 or 2, 1, 3)."""
        if not self.path.exists():
            return
        keep: dict[int, str] = {}
        # undecodable bytes become U+FFFD: that line fails to parse and is dropped
        for line in self.path.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                continue  # torn last line of a killed writer, or bytes not ours
            if (
                isinstance(row, dict)
                and isinstance(row.get("step"), int)
                and 1 <= row["step"] <= step
            ):
                keep[row["step"]] = line
        from rlctl.core.store.base import atomic_write

        atomic_write(self.path, "".join(f"{keep[k]}\n" for k in sorted(keep)))
        self.run.push(METRICS)

    def write(self, row: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
        if self._tb is not None:
            step = row["step"]
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)):
                    self._tb.add_scalar(f"train/{k}", v, step)
        self.sync()

    def sync(self) -> None:
        """Upload metrics.jsonl and the event files (a no-op for a local run store)."""
        if self._tb is not None:
            self._tb.flush()
        self.run.push(METRICS)
        self.run.push(TENSORBOARD)

    def scalars(self, prefix: str, values: dict[str, Any], step: int) -> None:
        if self._tb is not None:
            for k, v in values.items():
                if isinstance(v, (int, float)):
                    self._tb.add_scalar(f"{prefix}/{k}", v, step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
        self.run.push(TENSORBOARD)


class NullMetrics:
    """What the processes other than 0 of a multi-host run write: nothing."""

    def truncate_after(self, step: int) -> None: ...

    def write(self, row: dict[str, Any]) -> None: ...

    def sync(self) -> None: ...

    def scalars(self, prefix: str, values: dict[str, Any], step: int) -> None: ...

    def close(self) -> None: ...
