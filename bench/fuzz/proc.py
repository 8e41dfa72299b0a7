"""The installed ``rlctl`` run as a user runs it: a subprocess from the case's own
folder, with no cloud credentials and no ``RLCTL_*`` settings of the caller's, killed
with its whole process group at its time limit."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RLCTL = REPO / ".venv" / "bin" / "rlctl"
if not RLCTL.exists():  # pragma: no cover - another install layout
    RLCTL = Path(shutil.which("rlctl") or "rlctl")

CMD_TIMEOUT = 60.0
TRAIN_TIMEOUT = 300.0


@dataclass
class Run:
    """One finished subprocess."""

    argv: list[str]
    env_shown: dict[str, str | None]
    rc: int | None  # None: killed at the time limit
    out: str
    err: str
    secs: float
    timed_out: bool = False
    timeout: float = 0.0

    def cmd(self) -> str:
        env = " ".join(
            f"{k}={shlex.quote(v)}" if v is not None else f"-u {k}"
            for k, v in self.env_shown.items()
        )
        return ((env + " ") if env else "") + "rlctl " + " ".join(shlex.quote(a) for a in self.argv)


class Env:
    """The environment every subprocess starts from: a user with no cloud credentials."""

    def __init__(self, gcloud_dir: Path) -> None:
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("RLCTL_")
            and k
            not in (
                "GOOGLE_APPLICATION_CREDENTIALS",
                "CLOUDSDK_CONFIG",
                "COLUMNS",
                "LINES",
                "HF_TOKEN",
                "PYTHONPATH",
                "CLOUDSDK_CORE_PROJECT",
                "GOOGLE_CLOUD_PROJECT",
            )
        }
        base["PYTHONPATH"] = str(REPO)  # tests.fakes.rewards, as a user's own module
        base["CLOUDSDK_CONFIG"] = str(gcloud_dir)
        self.base = base

    def make(self, extra: dict[str, str | None] | None) -> dict[str, str]:
        env = dict(self.base)
        for k, v in (extra or {}).items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        return env


def execute(
    env: Env,
    argv: list[str],
    cwd: Path,
    extra: dict[str, str | None] | None = None,
    timeout: float = CMD_TIMEOUT,
) -> Run:
    t0 = time.monotonic()
    p = subprocess.Popen(
        [str(RLCTL), *argv],
        cwd=cwd,
        env=env.make(extra),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    timed_out = False
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
    return Run(
        argv,
        dict(extra or {}),
        None if timed_out else p.returncode,
        out.decode(errors="replace"),
        err.decode(errors="replace"),
        time.monotonic() - t0,
        timed_out,
        timeout,
    )


class Spawned:
    """A background subprocess (concurrency, signals), output to files."""

    def __init__(
        self,
        env: Env,
        argv: list[str],
        cwd: Path,
        tag: str,
        extra: dict[str, str | None] | None = None,
    ) -> None:
        self.argv, self.extra, self.t0 = argv, dict(extra or {}), time.monotonic()
        self.out_path, self.err_path = cwd / f".{tag}.out", cwd / f".{tag}.err"
        with self.out_path.open("wb") as o, self.err_path.open("wb") as e:
            self.p = subprocess.Popen(
                [str(RLCTL), *argv],
                cwd=cwd,
                env=env.make(extra),
                stdin=subprocess.DEVNULL,
                stdout=o,
                stderr=e,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.p.pid

    def alive(self) -> bool:
        return self.p.poll() is None

    def finish(self, timeout: float) -> Run:
        timed_out = False
        try:
            self.p.wait(timeout=max(1.0, timeout - (time.monotonic() - self.t0)))
        except subprocess.TimeoutExpired:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()
        return Run(
            self.argv,
            self.extra,
            None if timed_out else self.p.returncode,
            self.out_path.read_bytes().decode(errors="replace"),
            self.err_path.read_bytes().decode(errors="replace"),
            time.monotonic() - self.t0,
            timed_out,
            timeout,
        )

    def kill(self) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()
