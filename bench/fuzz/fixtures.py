"""What every case shares: the tiny model and data (fixture ``model``), two trained
runs to copy and damage (``store``), a fake Cloud Storage server (``gcs``), tmpfs
mounts for read-only and full disks, and ``Ctx``, one case's folder and state."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bench.fuzz.files import write
from bench.fuzz.proc import CMD_TIMEOUT, TRAIN_TIMEOUT, Env, Run, Spawned, execute

REWARD_SET = 'rewards=["tests.fakes.rewards.digit_count"]'
P = ["--project", "fuzz-project", "--region", "us-central1"]  # a well-formed project id


class Mounts:
    """tmpfs mounts (read-only or tiny) when this machine lets us mount; else None."""

    def __init__(self) -> None:
        self._ok: bool | None = None
        self.active: list[Path] = []

    def available(self, scratch: Path) -> bool:
        if self._ok is None:
            probe = scratch / ".mount-probe"
            probe.mkdir(parents=True, exist_ok=True)
            try:
                r = subprocess.run(
                    ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)],
                    capture_output=True,
                    timeout=20,
                )
                self._ok = r.returncode == 0
                if self._ok:
                    subprocess.run(["umount", str(probe)], capture_output=True, timeout=20)
            except (OSError, subprocess.SubprocessError):
                self._ok = False
            shutil.rmtree(probe, ignore_errors=True)
        return bool(self._ok)

    def tmpfs(self, path: Path, size: str = "8m") -> Path:
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            check=True,
            capture_output=True,
            timeout=20,
        )
        self.active.append(path)
        return path

    def read_only(self, path: Path) -> None:
        subprocess.run(
            ["mount", "-o", "remount,ro", str(path)], check=True, capture_output=True, timeout=20
        )

    def release_under(self, root: Path) -> None:
        for m in sorted(
            [m for m in self.active if root in (m, *m.parents)],
            key=lambda p: len(p.parts),
            reverse=True,
        ):
            r = subprocess.run(["umount", str(m)], capture_output=True, timeout=20)
            if r.returncode != 0:
                subprocess.run(["umount", "-l", str(m)], capture_output=True, timeout=20)
            self.active.remove(m)


def ro_dir(c: Ctx, name: str, fill: Callable[[Path], None] | None = None) -> Path:
    """A read-only folder (a tmpfs remounted ro), optionally filled first."""
    path = c.tmp / name
    c.fx.mounts.tmpfs(path, "64m")
    if fill:
        fill(path)
    c.fx.mounts.read_only(path)
    return path


def need_mount(c: Ctx) -> str | None:
    """Why a case that mounts a tmpfs cannot run here, or None."""
    if c.fx.mounts.available(c.fx.root):
        return None
    return (
        "skipped (root: chmod does not stop root, and mount is not available)"
        if os.geteuid() == 0
        else "skipped (mount is not available)"
    )


class FixtureError(Exception):
    pass


class Fixtures:
    def __init__(self, root: Path, listing: bool = False) -> None:
        self.root = root
        self.model = root / "fx" / "tiny-llama"
        self.data = root / "fx" / "train.jsonl"
        self.store = root / "fx" / "store"
        self.gcloud = root / "fx" / "gcloud-empty"
        self.listing = listing
        self.env = Env(self.gcloud)
        self.mounts = Mounts()
        self.errors: dict[str, str] = {}
        self.train_secs: float | None = None
        self._done: set[str] = set()
        self.gcs_url = ""  # the fake-gcs-server of fixture "gcs"
        self._stack = contextlib.ExitStack()

    def close(self) -> None:
        """Stop what fixtures started (the fake-gcs-server)."""
        self._stack.close()

    def _gcs(self) -> None:
        """fake-gcs-server (the real binary) with bucket runs-bucket-47."""
        from tests.fakes.gcs import fake_gcs_server, storage_client

        self.gcs_url = self._stack.enter_context(fake_gcs_server())
        before = os.environ.get("STORAGE_EMULATOR_HOST")
        os.environ["STORAGE_EMULATOR_HOST"] = self.gcs_url
        try:
            storage_client().create_bucket("runs-bucket-47")
        finally:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
            if before is not None:
                os.environ["STORAGE_EMULATOR_HOST"] = before

    def need(self, what: str) -> str | None:
        """None when fixture ``what`` is ready, else why it is not."""
        if what in self.errors:
            return self.errors[what]
        if what in self._done:
            return None
        try:
            {"model": self._model, "store": self._store, "gcs": self._gcs}[what]()
            self._done.add(what)
            return None
        except Exception as e:  # a fixture failure skips its cases, reported once
            self.errors[what] = f"fixture {what} failed: {e}"
            return self.errors[what]

    def _model(self) -> None:
        from tests.fakes.tiny_model import write_tiny_llama

        write_tiny_llama(self.model)
        write(
            self.data,
            "".join(
                json.dumps({"question": f"What is {a} + {a + 1}?", "answer": 2 * a + 1}) + "\n"
                for a in range(12)
            ),
        )

    def _store(self) -> None:
        if self.need("model"):
            raise FixtureError(self.errors["model"])
        self.store.mkdir(parents=True, exist_ok=True)
        for name, steps, extra in (("good", "2", []), ("dmg", "3", ["--set", "checkpoint.keep=3"])):
            argv = train_argv_for(
                self,
                self.store,
                name=name,
                steps=steps,
                extra=["--set", "checkpoint.interval=1", *extra],
            )
            run = execute(self.env, argv, self.root, timeout=TRAIN_TIMEOUT)
            if run.rc != 0:
                raise FixtureError(
                    f"{run.cmd()} exited {run.rc}: {(run.err.strip().splitlines() or [''])[-1]}"
                )
            if name == "good":
                self.train_secs = run.secs
        # dmg: as a run interrupted right after its step-2 checkpoint
        d = self.store / "dmg"
        shutil.rmtree(d / "checkpoints" / "3")
        lines = [
            x for x in (d / "metrics.jsonl").read_text().splitlines() if json.loads(x)["step"] <= 2
        ]
        write(d / "metrics.jsonl", "".join(x + "\n" for x in lines))
        (d / "eval" / "final.json").unlink(missing_ok=True)
        st = json.loads((d / "status.json").read_text())
        st.update(phase="interrupted", step=2, latest_checkpoint=2)
        st.pop("finished", None)
        write(d / "status.json", json.dumps(st, indent=2) + "\n")
        (d / ".lock").unlink(missing_ok=True)
        (self.store / "good" / ".lock").unlink(missing_ok=True)


def train_argv_for(
    fx: Fixtures,
    runs: Path | str,
    *,
    name: str | None = None,
    steps: str = "2",
    override: dict[str, str | None] | None = None,
    rewards: str | None = REWARD_SET,
    extra: Iterable[str] = (),
    algo: str = "grpo",
) -> list[str]:
    opts: dict[str, str | None] = {}
    if name is not None:
        opts["--name"] = name
    opts.update(
        {
            "--runs-dir": str(runs),
            "--model": str(fx.model),
            "--dataset": "jsonl",
            "--data-path": str(fx.data),
            "--steps": steps,
            "--prompts-per-step": "2",
            "-G": "2",
            "--max-new-tokens": "8",
            "--lr": "3e-3",
            "--eval-size": "2",
        }
    )
    for k, v in (override or {}).items():
        opts[k] = v
    argv = ["train", algo]
    for k, v in opts.items():
        if v is not None:
            argv += [k, v]
    argv += ["--set", "eval.batch_size=2"]
    if rewards is not None:
        argv += ["--set", rewards]
    return argv + list(extra)


class Ctx:
    """One case's temporary folder, the shared fixtures, and scratch state."""

    def __init__(self, tmp: Path, fx: Fixtures, rng: random.Random) -> None:
        self.tmp = tmp
        self.fx = fx
        self.rng = rng
        self.state: dict[str, Any] = {}

    @property
    def runs(self) -> Path:
        return self.tmp / "runs"

    def p(self, name: str) -> Path:
        return self.tmp / name

    def train(self, **kw: Any) -> list[str]:
        runs = kw.pop("runs", self.runs)
        return train_argv_for(self.fx, runs, **kw)

    def run(
        self,
        argv: list[str],
        extra: dict[str, str | None] | None = None,
        timeout: float = CMD_TIMEOUT,
    ) -> Run:
        return execute(self.fx.env, argv, self.tmp, extra, timeout)

    def spawn(
        self, argv: list[str], tag: str, extra: dict[str, str | None] | None = None
    ) -> Spawned:
        return Spawned(self.fx.env, argv, self.tmp, tag, extra)
