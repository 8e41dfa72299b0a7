"""A multi-host workload on one machine: the pod entrypoint as N JAX processes on
CPU, joined over 127.0.0.1 with the variables the GPU JobSet sets (JAX_*)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def new_run(root: Path, name: str, model: Path, *overrides: str) -> Path:
    """A run with its spec.yaml written, as ``train --cluster`` leaves it for the pods
    (the reward is the tiny model's learnable digit count)."""
    from rlctl.core.runs.spec import resolve_run_spec, write_new_run
    from rlctl.core.store import open_store

    spec = resolve_run_spec(
        "grpo",
        overrides=[
            f"name={name}",
            f"model.source={model}",
            f"output.root={root}",
            'rewards=["tests.fakes.rewards.digit_count"]',
            *overrides,
        ],
    )
    write_new_run(open_store(str(root)), spec)
    return root / name


def start(run: Path, processes: int, **env: str) -> list[subprocess.Popen]:
    """``processes`` pods of one workload, each ``python -m rlctl.core.runs.pod``."""
    base = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu", **env}
    if processes > 1:
        base.update(
            JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{free_port()}", JAX_NUM_PROCESSES=str(processes)
        )
    return [
        subprocess.Popen(
            [sys.executable, "-m", "rlctl.core.runs.pod", "--run", str(run)],
            cwd=REPO,
            env={**base, "JAX_PROCESS_ID": str(i)} if processes > 1 else base,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(processes)
    ]


def finish(procs: list[subprocess.Popen]) -> list[str]:
    """Wait for every process; fail with the tail of the first one that failed."""
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for i, (p, out) in enumerate(zip(procs, outs, strict=True)):
        if p.returncode:
            raise AssertionError(f"process {i} exited {p.returncode}:\n{out[-3000:]}")
    return outs
