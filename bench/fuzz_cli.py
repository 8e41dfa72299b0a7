#!/usr/bin/env python3
"""Fuzz the installed ``rlctl`` CLI with bad input and faults, the way a new user or an
operator meets them, and count what goes wrong.

What it measures
----------------
Every case runs the installed console script (``.venv/bin/rlctl``) as a subprocess, from
its own temporary working directory, with no cloud credentials (``CLOUDSDK_CONFIG`` is an
empty folder, ``GOOGLE_APPLICATION_CREDENTIALS`` and every ``RLCTL_*`` variable unset) and
never with ``--debug`` (one case checks that ``--debug`` keeps the exit code). Each case
is put in at most three buckets:

* **traceback**: "Traceback (most recent call last)" on stdout or stderr.
* **unclear**: the exit code is not the one the README's table gives for the case (0 ok,
  1 unexpected, 2 bad input, 3 not found, 4 conflict, 5 permission denied, 6 quota,
  7 other cloud error, 8 missing extra, 130 interrupted); or the error is not one
  ``error: ...`` line (plus at most one ``hint: ...`` line after it; progress lines
  before it are fine); or it lacks the case's keyword (the file, field, or name to fix);
  or it says something the case forbids (a phase ``running`` for a dead process); or,
  with ``-o json``, stdout is neither empty nor one valid JSON document; or a library
  log line reaches stderr; or the command did not finish in its time limit.
* **lost/wrong**: a check of the run store after the command fails: an exit 2 ("nothing
  was changed") that left a run folder or a file behind, ``status`` that changed files,
  a good checkpoint or the other run changed or removed, ``status`` saying a dead
  process is active, metrics steps not 1..N exactly once and in order after a resume,
  a second writer that was not refused, and so on.

Families (``--list`` prints every case): names, hyperparams, config-files, data, model,
rewards, runs-dir, store-damage, cloud-no-creds, concurrency, signals, status-width; and
issue #47's: non-finite (a reward or a loss that goes NaN or inf, a NaN checkpoint's
export), spec-roundtrip (resume --steps bounded, nothing written that is not read
back), first-save (a disk twice the first checkpoint's size), store-truth (steps and
checkpoints from the files, stale runs' damage, --recover), messages (data files, hub
datasets offline, damaged checkpoints, gs:// endpoints and buckets) and reward-guest
(a reward that prints or exits, expression golds, shell completion).

Training cases use a tiny random Llama (``tests/fakes/tiny_model.py``) on 12 jsonl
problems with ``tests.fakes.rewards.digit_count``: one 2-step run takes ~15 s on 2 CPU
cores. Two such runs are trained once (``good``: completed, 2 steps; ``dmg``: 3 planned
steps, checkpoints 1 and 2, rolled back to "interrupted after step 2") and copied into
each store-damage case. Cases that need a read-only or a full file system mount a tmpfs
when ``mount`` works, and are skipped as root otherwise (chmod does not stop root).

How to run
----------
From the repository root (the whole run takes about 20 minutes on 2 CPU cores)::

    .venv/bin/python -m bench.fuzz_cli                      # every family
    .venv/bin/python -m bench.fuzz_cli --list               # the cases, without running
    .venv/bin/python -m bench.fuzz_cli --family store-damage
    .venv/bin/python -m bench.fuzz_cli --case lr-nan        # cases whose id contains it
    .venv/bin/python -m bench.fuzz_cli --json fuzz.json     # also every result as JSON

``--keep`` keeps the temporary folders, ``--seed N`` picks the signal moments. It prints
one row per family (cases, tracebacks, unclear, lost/wrong, skipped), a totals line,
then every case that was a traceback, unclear or lost (id, command, exit code, why,
first/last stderr line). Exit status 0 only with 0 tracebacks and 0 lost/wrong.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

if __name__ == "__main__" and find_spec("bench") is None:  # by path: bench/_by_path.py
    import _by_path

    _by_path.rerun_as_module(__file__)

REPO = Path(__file__).resolve().parent.parent
RLCTL = REPO / ".venv" / "bin" / "rlctl"
if not RLCTL.exists():  # pragma: no cover - another install layout
    RLCTL = Path(shutil.which("rlctl") or "rlctl")

TRACEBACK = "Traceback (most recent call last)"
ACTIVE = {"pending", "starting", "evaluating", "running"}
CMD_TIMEOUT = 60.0
TRAIN_TIMEOUT = 300.0
REWARD_SET = 'rewards=["tests.fakes.rewards.digit_count"]'
P = ["--project", "fuzz-project", "--region", "us-central1"]  # a well-formed project id
LIB_LOG = re.compile(r"^(WARNING|INFO|DEBUG)[:\s]|^[WIEF]\d{4} \d\d:\d\d|^\S+Warning: ")


# ============================================================================ runs


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


# ======================================================================= judging


def error_shape(err: str) -> str | None:
    """None when stderr ends in one ``error:`` line and at most one ``hint:`` line."""
    lines = [x.rstrip() for x in err.splitlines() if x.strip()]
    if not lines:
        return "failed with nothing on stderr"
    if any(x.startswith("Usage:") for x in lines) or any("─ Error ─" in x for x in lines):
        return f"click usage box ({len(lines)} lines) instead of one 'error:' line"
    errs = [i for i, x in enumerate(lines) if x.startswith("error:")]
    if not errs:
        return "no 'error:' line on stderr"
    if len(errs) > 1:
        return f"{len(errs)} 'error:' lines"
    after = lines[errs[0] + 1 :]
    if len(after) > 1 or (after and not after[0].startswith("hint:")):
        return f"{len(after)} line(s) after the error line"
    if len(lines[errs[0]]) > 400:
        return f"error line is {len(lines[errs[0]])} characters"
    return None


def _has(text: str, kw: str | tuple[str, ...]) -> bool:
    alts = (kw,) if isinstance(kw, str) else kw
    low = text.lower()
    return any(a.lower() in low for a in alts)


def _kw(kw: str | tuple[str, ...]) -> str:
    return repr(kw) if isinstance(kw, str) else " or ".join(map(repr, kw))


def judge(
    run: Run,
    expect: Iterable[int | None],
    keywords: Iterable = (),
    ok_keywords: Iterable = (),
    forbid: Iterable[str] = (),
    one_line: bool = True,
    allow_traceback: bool = False,
    json_mode: bool | None = None,
) -> tuple[bool, list[str]]:
    """(traceback?, unclear reasons) of one run."""
    expect = tuple(expect)
    text = run.out + "\n" + run.err
    tb = TRACEBACK in text and not allow_traceback
    why: list[str] = []
    if run.timed_out:
        why.append(f"did not finish in {run.timeout:.0f} s")
    elif run.rc not in expect:
        why.append(f"exit {run.rc}, expected {'/'.join(map(str, expect))}")
    failed = run.rc not in (0, None)
    if failed and one_line and not allow_traceback and not tb and run.rc is not None and run.rc > 0:
        shape = error_shape(run.err)
        if shape:
            why.append(shape)
    if not run.timed_out:
        for kw in keywords if failed else ok_keywords:
            if not _has(run.err if failed else text, kw):
                why.append(f"does not name {_kw(kw)}")
    for pat in forbid:
        m = re.search(pat, text, re.IGNORECASE | re.MULTILINE)
        if m:
            why.append(f"says {m.group(0)!r}")
    if json_mode is None:
        json_mode = _json_mode(run.argv, run.env_shown)
    if json_mode and not run.timed_out:
        s = run.out.strip()
        if s:
            try:
                json.loads(s)
            except ValueError:
                why.append("-o json: stdout is not one valid JSON document")
        elif run.rc == 0:
            why.append("-o json: nothing on stdout")
    if not allow_traceback:
        logs = [x for x in run.err.splitlines() if LIB_LOG.search(x)]
        if logs:
            why.append(f"library log line on stderr: {logs[0][:100]!r}")
    return tb, why


def _json_mode(argv: list[str], env: dict[str, str | None]) -> bool:
    for i, a in enumerate(argv):
        if a in ("-o", "--output") and i + 1 < len(argv) and argv[i + 1].lower() == "json":
            return True
        if a in ("-ojson", "--output=json"):
            return True
    return (env.get("RLCTL_OUTPUT") or "").lower() == "json"


def json_error(code: int) -> Callable[[Ctx, Run], list[str]]:
    """With -o json a failure is also one ``{"error", "hint", "exit_code"}`` object on
    stdout (README "Output"), the exit code in it the process's."""

    def check(c: Ctx, run: Run) -> list[str]:
        try:
            doc = json.loads(run.out)
        except ValueError:
            return ["-o json: no JSON error object on stdout"]
        if not isinstance(doc, dict) or set(doc) != {"error", "hint", "exit_code"}:
            return [f"-o json: stdout is not an error object: {run.out[:80]!r}"]
        return [] if doc["exit_code"] == code else [f"-o json: exit_code {doc['exit_code']}"]

    return check


# =================================================================== file helpers


def write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    path.write_bytes(data)
    return path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snap(path: Path, exclude: tuple[str, ...] = (".lock",)) -> dict[str, str]:
    """relative path -> sha256 of every file under ``path`` (a file: itself)."""
    if path.is_file():
        return {".": sha(path)}
    out: dict[str, str] = {}
    if not path.is_dir():
        return out
    for p in sorted(path.rglob("*")):
        if p.is_file() and not p.is_symlink() and p.name not in exclude:
            out[str(p.relative_to(path))] = sha(p)
    return out


def diff(before: dict[str, str], after: dict[str, str]) -> str:
    gone = sorted(set(before) - set(after))
    new = sorted(set(after) - set(before))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    parts = []
    for what, items in (("removed", gone), ("added", new), ("changed", changed)):
        if items:
            parts.append(f"{what} {', '.join(items[:4])}{' ...' if len(items) > 4 else ''}")
    return "; ".join(parts)


def truncate_largest(folder: Path) -> Path:
    files = [p for p in folder.rglob("*") if p.is_file() and p.name != "rlctl-manifest.json"]
    big = max(files, key=lambda p: p.stat().st_size)
    with big.open("r+b") as f:
        f.truncate(big.stat().st_size // 2)
    return big


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def metrics_steps(run_dir: Path) -> tuple[list[Any], int]:
    """(steps of the metrics rows in file order, lines that do not parse)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return [], 0
    steps, bad = [], 0
    for line in path.read_bytes().decode(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(row, dict):
            steps.append(row.get("step"))
        else:
            bad += 1
    return steps, bad


def check_completed(run_dir: Path, n: int, eval_on: bool = True) -> list[str]:
    """What is wrong with a run that a command reported as completed."""
    bad = []
    st = read_json(run_dir / "status.json")
    if not isinstance(st, dict):
        bad.append("status.json unreadable after a successful run")
    elif (st.get("phase"), st.get("step")) != ("completed", n):
        bad.append(
            f"status.json says phase={st.get('phase')!r} step={st.get('step')!r}, "
            f"expected completed/{n}"
        )
    steps, torn = metrics_steps(run_dir)
    if steps != list(range(1, n + 1)):
        bad.append(f"metrics steps {steps}, expected 1..{n} once each in order")
    if torn:
        bad.append(f"{torn} unparseable line(s) left in metrics.jsonl")
    ck = run_dir / "checkpoints"
    names = sorted(os.listdir(ck)) if ck.is_dir() else []
    if str(n) not in names:
        bad.append(f"no checkpoint {n} (checkpoints/: {names})")
    tmp = [x for x in names if "orbax-checkpoint-tmp" in x]
    if tmp:
        bad.append(f"partial checkpoint folders left: {tmp}")
    if eval_on:
        for which in ("baseline", "final"):
            if not isinstance(read_json(run_dir / "eval" / f"{which}.json"), dict):
                bad.append(f"eval/{which}.json missing or damaged after the run")
    return bad


def dead_pid() -> int:
    pid = 4_000_000
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 7


# ========================================================================= mounts


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
    if c.fx.mounts.available(c.fx.root):
        return None
    return (
        "skipped (root: chmod does not stop root, and mount is not available)"
        if os.geteuid() == 0
        else "skipped (mount is not available)"
    )


# ======================================================================= fixtures


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


# ========================================================================== cases


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


@dataclass
class Outcome:
    cid: str
    family: str
    cmd: str = ""
    rc: Any = None
    expected: str = ""
    secs: float = 0.0
    traceback: bool = False
    unclear: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    skipped: str | None = None
    note: str = ""
    err_first: str = ""
    err_last: str = ""
    err_error: str = ""  # the first 'error:' line, when it is neither the first nor last

    def take(self, run: Run) -> None:
        """Show this run as the case's command (the last one taken wins)."""
        lines = [x.strip() for x in run.err.splitlines() if x.strip()]
        self.cmd, self.rc = run.cmd(), run.rc
        self.err_first = lines[0][:240] if lines else ""
        self.err_last = lines[-1][:240] if lines else ""
        self.err_error = next((x[:300] for x in lines if x.startswith("error:")), "")

    @property
    def bad(self) -> bool:
        return self.traceback or bool(self.unclear) or bool(self.lost)


@dataclass
class Case:
    cid: str
    argv: Callable[[Ctx], list[str]] | None = None
    expect: tuple[int | None, ...] = (2,)
    keywords: tuple = ()  # when it fails: each (or one of a tuple) must be on stderr
    ok_keywords: tuple = ()  # when it succeeds: on stdout or stderr
    forbid: tuple[str, ...] = ()  # regexes that must not match stdout + stderr
    env: dict[str, str | None] | Callable[[Ctx], dict[str, str | None]] | None = None
    setup: Callable[[Ctx], None] | None = None
    post: Callable[[Ctx, Run], list[str]] | None = None  # lost/wrong problems
    check: Callable[[Ctx, Run], list[str]] | None = None  # extra unclear problems
    runner: Callable[[Ctx, Outcome], None] | None = None  # a custom case
    timeout: float = CMD_TIMEOUT
    needs: tuple[str, ...] = ()
    skip: Callable[[Ctx], str | None] | None = None
    allow_traceback: bool = False
    one_line: bool = True
    train: bool = False  # exit 2 must leave no run folder in c.runs
    desc: str = ""

    @property
    def family(self) -> str:
        return self.cid.split("/", 1)[0]


def _env_of(case: Case, c: Ctx) -> dict[str, str | None]:
    e = case.env
    return dict(e(c) if callable(e) else (e or {}))


def no_run_left(runs: Path) -> list[str]:
    if not runs.is_dir():
        return []
    left = sorted(p.name for p in runs.iterdir())
    if not left:
        return []
    phase = ""
    st = read_json(runs / left[0] / "status.json")
    if isinstance(st, dict):
        phase = f" (phase {st.get('phase')})"
    return [f"exit 2 ('nothing was changed') but left {runs.name}/{', '.join(left)}{phase}"]


def run_case(case: Case, fx: Fixtures, root: Path, seed: int, keep: bool) -> Outcome:
    o = Outcome(case.cid, case.family, expected="/".join(map(str, case.expect)))
    tmp = root / "cases" / re.sub(r"[^A-Za-z0-9_.-]+", "_", case.cid)
    tmp.mkdir(parents=True, exist_ok=True)
    c = Ctx(tmp, fx, random.Random(f"{seed}:{case.cid}"))
    t0 = time.monotonic()
    try:
        for what in case.needs:
            why = fx.need(what)
            if why:
                o.skipped = why
                return o
        if case.skip and (why := case.skip(c)):
            o.skipped = why
            return o
        if case.setup:
            case.setup(c)
        if case.runner:
            case.runner(c, o)
            return o
        assert case.argv is not None
        before = set(os.listdir(tmp))
        run = c.run(case.argv(c), _env_of(case, c), case.timeout)
        o.take(run)
        o.traceback, o.unclear = judge(
            run,
            case.expect,
            case.keywords,
            case.ok_keywords,
            case.forbid,
            case.one_line,
            case.allow_traceback,
        )
        if case.check:
            o.unclear += case.check(c, run)
        if run.rc == 2:
            if case.train:
                o.lost += no_run_left(c.runs)
            new = sorted(set(os.listdir(tmp)) - before - {"runs"})
            if new:
                o.lost.append(
                    f"exit 2 ('nothing was changed') but created {new} in the working directory"
                )
        if case.post:
            o.lost += case.post(c, run)
    except Exception:
        o.lost.append(
            "HARNESS ERROR (not rlctl's): " + traceback.format_exc().strip().splitlines()[-1]
        )
        o.note = traceback.format_exc()
    finally:
        o.secs = time.monotonic() - t0
        fx.mounts.release_under(tmp)
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return o


# ------------------------------------------------------------------- 1. names

BAD_NAMES = {
    "upper": "MyRun",
    "digit": "1run",
    "len64": "a" * 64,
    "underscore": "a_b",
    "empty": "",
    "dash": "-x",
    "unicode": "rün",
    "traversal": "../x",
}


def _positional(cmd: list[str], name: str, opts: list[str]) -> list[str]:
    """``cmd NAME opts``; a name that starts with '-' goes after ``--``, as a user who
    knows click would type it (else it is parsed as an unknown option)."""
    return [*cmd, *opts, "--", name] if name.startswith("-") else [*cmd, name, *opts]


def names_cases() -> list[Case]:
    out = []
    for slug, n in BAD_NAMES.items():
        kws: tuple = (("name", "label"), *((n,) if n else ()))
        gs = ["--runs-dir", "gs://b/runs", *P, "--dry-run"]
        out += [
            Case(
                f"names/train-{slug}",
                lambda c, n=n: c.train(name=n),
                keywords=kws,
                needs=("model",),
                train=True,
            ),
            Case(
                f"names/cluster-create-{slug}",
                lambda c, n=n: _positional(
                    ["cluster", "create"], n, [*P, "-a", "v6e-16", "--dry-run"]
                ),
                keywords=kws,
            ),
            Case(
                f"names/network-create-{slug}",
                lambda c, n=n: _positional(["network", "create"], n, [*P, "--dry-run"]),
                keywords=kws,
            ),
            Case(
                f"names/status-{slug}",
                lambda c, n=n: _positional(["status"], n, ["--runs-dir", str(c.runs)]),
                keywords=kws,
                setup=lambda c: c.runs.mkdir(),
            ),
            Case(
                f"names/resume-{slug}",
                lambda c, n=n: _positional(["resume"], n, ["--runs-dir", str(c.runs)]),
                keywords=kws,
                setup=lambda c: c.runs.mkdir(),
            ),
            Case(
                f"names/delete-run-{slug}",
                lambda c, n=n, gs=gs: _positional(["delete", "run"], n, gs),
                keywords=kws,
            ),
        ]
    out += [
        Case(
            "names/status-upper-json",
            lambda c: ["status", "MyRun", "--runs-dir", str(c.runs), "-o", "json"],
            keywords=("MyRun",),
            check=json_error(2),
        ),
        Case(
            "names/status-not-found-json",
            lambda c: ["status", "nope", "--runs-dir", str(c.runs), "-o", "json"],
            expect=(3,),
            keywords=("nope",),
            setup=lambda c: c.runs.mkdir(),
            check=json_error(3),
        ),
    ]
    return out


# ------------------------------------------------------------- 2. hyperparams


# Named flags win over --set and --config (README), so a case that puts a bad value in
# a field leaves out the flag that would quietly replace it.
_FLAG_FIELDS = {
    "--steps": "training.steps",
    "--prompts-per-step": "training.prompts_per_step",
    "--lr": "training.learning_rate",
    "-G": "rollout.num_generations",
    "--max-new-tokens": "rollout.max_new_tokens",
    "--eval-size": "eval.size",
    "--dataset": "data.dataset",
    "--data-path": "data.path",
    "--model": "model.source",
    "--runs-dir": "output.root",
}


def _shadowing(text: str) -> dict[str, str | None]:
    """The flags (to drop) that set a field ``text`` sets: ``a.b=..`` or YAML ``a: {b: ..}``."""
    keys = set()
    m = re.match(r"\s*([\w.]+)\s*=", text)
    if m:
        keys.add(m.group(1))
    section = None
    for line in text.splitlines():
        if re.match(r"^\w+:", line):
            section, _, value = line.partition(":")
            if value.strip():  # `training: [1, 2]`: the section itself
                keys.add(section)
        elif section and (m := re.match(r"^\s+(\w+):", line)):
            keys.add(f"{section}.{m.group(1)}")
    drop: dict[str, str | None] = {}
    for flag, fieldname in _FLAG_FIELDS.items():
        if any(fieldname == k or fieldname.startswith(k + ".") for k in keys):
            drop[flag] = None
    return drop


def hyper_cases() -> list[Case]:
    LR = (("learning_rate", "--lr"),)
    flag = [  # (slug, override, keywords)
        ("lr-nan", {"--lr": "nan"}, LR),
        ("lr-inf", {"--lr": "inf"}, LR),
        ("lr-1e400", {"--lr": "1e400"}, LR),
        ("lr-neg", {"--lr": "-1"}, LR),
        ("lr-zero", {"--lr": "0"}, LR),
        ("lr-abc", {"--lr": "abc"}, LR),
        ("steps-0", {"--steps": "0"}, ("steps",)),
        ("steps-neg", {"--steps": "-1"}, ("steps",)),
        ("steps-frac", {"--steps": "1.5"}, ("steps", "1.5")),
        ("steps-huge", {"--steps": "99999999999"}, ("steps",)),
        ("G-0", {"-G": "0"}, (("num_generations", "-G"),)),
        ("G-1", {"-G": "1"}, (("num_generations", "-G"),)),
        ("G-100000", {"-G": "100000"}, (("num_generations", "-G"),)),
        ("max-new-tokens-0", {"--max-new-tokens": "0"}, ("max_new_tokens",)),
        ("prompts-per-step-0", {"--prompts-per-step": "0"}, ("prompts_per_step",)),
        ("eval-size-neg", {"--eval-size": "-1"}, (("eval.size", "eval-size"),)),
        ("beta-neg", {"--beta": "-1"}, ("beta",)),
        ("seed-neg", {"--seed": "-1"}, ("seed",)),
    ]
    sets = [  # (slug, --set value, keywords)
        ("set-unknown-key", "foo=1", ("foo",)),
        ("set-typo", "training.stpes=3", ("training.stpes",)),
        ("set-under-scalar", "training.steps.x=3", ("training.steps",)),
        ("set-bad-int", "training.steps=abc", ("training.steps",)),
        ("set-list-for-int", "training.steps=[1, 2]", ("training.steps",)),
        ("set-bad-float", "rollout.temperature=hot", ("rollout.temperature",)),
        ("set-section-scalar", "training=5", ("training",)),
        ("set-no-equals", "training.steps", ("training.steps",)),
        ("set-empty-key", "=3", ("=3",)),
        ("set-empty-part", "training..steps=3", ("training..steps",)),
        ("set-dataset-unknown", "data.dataset=csv", ("data.dataset",)),
        ("set-ckpt-interval-0", "checkpoint.interval=0", ("checkpoint.interval",)),
        ("set-rewards-broken-yaml", "rewards=[correct", ("rewards",)),
        ("set-dtype", "model.dtype=float8", ("model.dtype",)),
    ]
    out = [
        Case(
            f"hyperparams/{s}",
            lambda c, o=o: c.train(override=o),
            keywords=k,
            needs=("model",),
            train=True,
        )
        for s, o, k in flag
    ]
    out += [
        Case(
            f"hyperparams/{s}",
            lambda c, v=v: c.train(override=_shadowing(v), extra=["--set", v]),
            keywords=k,
            needs=("model",),
            train=True,
        )
        for s, v, k in sets
    ]
    out += [
        Case(
            "hyperparams/epsilon-high-below-epsilon",
            lambda c: c.train(
                extra=["--set", "training.epsilon=0.3", "--set", "training.epsilon_high=0.1"]
            ),
            keywords=("epsilon_high",),
            needs=("model",),
            train=True,
        ),
        Case(
            "hyperparams/gspo-iterations-0",
            lambda c: c.train(algo="gspo", extra=["--set", "training.num_iterations=0"]),
            keywords=("num_iterations",),
            needs=("model",),
            train=True,
        ),
        Case(
            "hyperparams/env-RLCTL_SET-unknown",
            lambda c: c.train(),
            env={"RLCTL_SET": "training.bogus=1"},
            keywords=("bogus",),
            needs=("model",),
            train=True,
        ),
        Case(
            "hyperparams/output-xml",
            lambda c: c.train(extra=["-o", "xml"]),
            keywords=(("output", "-o"),),
            needs=("model",),
            train=True,
        ),
        Case(
            "hyperparams/print-config-json-bad-lr",
            lambda c: c.train(override={"--lr": "nan"}, extra=["--print-config", "-o", "json"]),
            keywords=LR,
            needs=("model",),
            train=True,
        ),
        Case(  # a plain flag given a value: one usage line, not click's box
            "hyperparams/print-config-given-true",
            lambda c: c.train(extra=["--print-config", "true"]),
            keywords=("true",),
            needs=("model",),
            train=True,
        ),
        Case(
            "hyperparams/steps-0-json",
            lambda c: c.train(override={"--steps": "0"}, extra=["-o", "json"]),
            keywords=("steps",),
            needs=("model",),
            train=True,
            check=json_error(2),
        ),
    ]
    return out


# ------------------------------------------------------------ 3. config files

TRAIN_CONFIGS: dict[str, tuple[bytes | None, tuple[int, ...], tuple, tuple[str, ...]]] = {
    # slug: (content or None for a special path, expected exits, keywords, forbid)
    "missing": (None, (2,), ("nope.yaml",), ()),
    "directory": (None, (2,), ("cfgdir",), ()),
    "binary": (bytes(range(256)) * 4, (2,), ("cfg.yaml",), ()),
    "non-utf8": (b"training:\n  steps: \xff\xfe\n", (2,), ("cfg.yaml",), ()),
    "empty": (b"", (0,), (), ()),
    "yaml-list": (b"- a\n- b\n", (2,), ("cfg.yaml",), ()),
    "yaml-syntax": (b"training: {steps: 3\n  lr: [\n", (2,), ("cfg.yaml",), ()),
    "tab-indent": (b"training:\n\tsteps: 3\n", (2,), ("cfg.yaml",), ()),
    "proc-self-mem": (None, (2,), ("/proc/self/mem",), ()),
    "dev-null": (None, (0, 2), (), (r"does not exist",)),
    "fifo": (None, (2,), ("cfg.fifo",), ()),
    "unknown-key": (b"trainig:\n  steps: 3\n", (2,), ("trainig",), ()),
    "wrong-type": (b"training:\n  steps: many\n", (2,), ("training.steps",), ()),
    "section-is-list": (b"training: [1, 2]\n", (2,), ("training",), ()),
    "algorithm-mismatch": (b"algorithm: gspo\n", (2,), ("gspo",), ()),
    "bad-name": (b"name: Bad_Name\n", (2,), ("Bad_Name",), ()),
    "empty-root": (b"output:\n  root: ''\n", (2,), ("output.root",), ()),
    "infra-config-to-train": (
        b"cluster: rl\nproject: p\nregion: us-central1\naccelerators: ['v6e-16']\n",
        (2,),
        (("cluster", "unknown"),),
        (),
    ),
}


def _config_path(c: Ctx, slug: str, content: bytes | None) -> str:
    if slug == "missing":
        return str(c.p("nope.yaml"))
    if slug == "directory":
        return str(c.p("cfgdir"))
    if slug == "proc-self-mem":
        return "/proc/self/mem"
    if slug == "dev-null":
        return "/dev/null"
    if slug == "fifo":
        return str(c.p("cfg.fifo"))
    return str(c.p("cfg.yaml"))


def _config_setup(slug: str, content: bytes | None) -> Callable[[Ctx], None]:
    def setup(c: Ctx) -> None:
        if slug == "directory":
            c.p("cfgdir").mkdir()
        elif slug == "fifo":
            os.mkfifo(c.p("cfg.fifo"))
        elif content is not None:
            write(c.p("cfg.yaml"), content)

    return setup


def config_cases() -> list[Case]:
    out = []
    for slug, (content, expect, kws, forbid) in TRAIN_CONFIGS.items():
        to = TRAIN_TIMEOUT if 0 in expect else 30
        out.append(
            Case(
                f"config-files/train-{slug}",
                lambda c, s=slug, b=content: c.train(
                    override=_shadowing(b.decode(errors="replace") if b else ""),
                    extra=["--config", _config_path(c, s, b)],
                ),
                expect=expect,
                keywords=kws,
                forbid=forbid,
                setup=_config_setup(slug, content),
                needs=("model",),
                train=True,
                timeout=to,
            )
        )
    infra = {  # slug -> (expected exits, keywords): cluster create rl -c X ... --dry-run
        "missing": ((2,), ("nope.yaml",)),
        "directory": ((2,), ("cfgdir",)),
        "binary": ((2,), ("cfg.yaml",)),
        "non-utf8": ((2,), ("cfg.yaml",)),
        "empty": ((0,), ()),  # a dry run without credentials plans an empty project
        "yaml-list": ((2,), ("cfg.yaml",)),
        "yaml-syntax": ((2,), ("cfg.yaml",)),
        "proc-self-mem": ((2,), ("/proc/self/mem",)),
        "dev-null": ((2, 5), ()),
        "fifo": ((2,), ("cfg.fifo",)),
        "unknown-key": ((2,), ("trainig",)),
    }
    for slug, (expect, kws) in infra.items():
        content = TRAIN_CONFIGS[slug][0]
        forbid = (r"does not exist",) if slug == "dev-null" else ()
        out.append(
            Case(
                f"config-files/cluster-create-{slug}",
                lambda c, s=slug, b=content: [
                    "cluster",
                    "create",
                    "rl",
                    *P,
                    "-a",
                    "v6e-16",
                    "-c",
                    _config_path(c, s, b),
                    "--dry-run",
                ],
                expect=expect,
                keywords=kws,
                forbid=forbid,
                setup=_config_setup(slug, content),
                timeout=30,
            )
        )
    for slug in ("missing", "yaml-list", "yaml-syntax", "unknown-key"):
        content = TRAIN_CONFIGS[slug][0]
        out.append(
            Case(
                f"config-files/network-create-{slug}",
                lambda c, s=slug, b=content: [
                    "network",
                    "create",
                    "rl",
                    *P,
                    "-c",
                    _config_path(c, s, b),
                    "--dry-run",
                ],
                keywords=infra[slug][1],
                setup=_config_setup(slug, content),
            )
        )
    out += [
        Case(
            "config-files/cluster-list-missing",
            lambda c: ["cluster", "list", "--project", "p", "-c", str(c.p("nope.yaml"))],
            keywords=("nope.yaml",),
        ),
        Case(
            "config-files/cluster-create-json-bad-config",
            lambda c: [
                "cluster",
                "create",
                "rl",
                *P,
                "-a",
                "v6e-16",
                "-c",
                str(c.p("cfg.yaml")),
                "--dry-run",
                "-o",
                "json",
            ],
            keywords=("cfg.yaml",),
            setup=_config_setup("yaml-syntax", TRAIN_CONFIGS["yaml-syntax"][0]),
        ),
        Case(
            "config-files/env-RLCTL_CONFIG-train-config-to-cluster",
            lambda c: ["cluster", "create", "rl", *P, "-a", "v6e-16", "--dry-run"],
            env=lambda c: {"RLCTL_CONFIG": str(c.p("run.yaml"))},
            setup=lambda c: write(
                c.p("run.yaml"), "training:\n  steps: 5\nrollout:\n  num_generations: 4\n"
            ),
            # the cluster commands read RLCTL_INFRA_CONFIG, never RLCTL_CONFIG (README
            # "Configuration"; tests/faults/test_messages.py): the run spec is not refused
            # as an infra config, and with no credentials the dry run plans an empty project
            expect=(0,),
            forbid=(r"unknown field", r"training"),
        ),
        Case(
            "config-files/env-RLCTL_CONFIG-missing-train",
            lambda c: c.train(),
            env=lambda c: {"RLCTL_CONFIG": str(c.p("gone.yaml"))},
            keywords=("gone.yaml",),
            needs=("model",),
            train=True,
        ),
    ]
    return out


# ------------------------------------------------------------------- 4. data


def _jsonl(rows: Iterable[Any]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


GOOD_ROWS = [{"question": f"What is {a} + 2?", "answer": a + 2} for a in range(10)]


def _parquet(path: Path, table: dict[str, list[Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(table), path)


def data_cases() -> list[Case]:
    files: list[
        tuple[
            str,
            str,
            Callable[[Path], Any] | None,
            tuple[int, ...],
            tuple,
            tuple[str, ...],
            dict[str, str | None],
        ]
    ] = [
        # slug, file name, writer (None: do not create), exits, keywords, forbid, override
        ("missing", "nope.jsonl", None, (2,), ("nope.jsonl",), (), {}),
        ("directory", "datadir", lambda p: p.mkdir(), (2,), ("datadir",), (), {}),
        (
            "non-utf8",
            "d.jsonl",
            lambda p: write(
                p, _jsonl(GOOD_ROWS[:3]).encode() + b'{"question": "\xff\xfe", "answer": 1}\n'
            ),
            (2,),
            ("d.jsonl",),
            (),
            {},
        ),
        (
            "row-is-list",
            "d.jsonl",
            lambda p: write(p, _jsonl(GOOD_ROWS) + "[1, 2]\n"),
            (2,),
            ("d.jsonl", "11"),
            (),
            {},
        ),
        (
            "row-invalid-json",
            "d.jsonl",
            lambda p: write(p, _jsonl(GOOD_ROWS[:4]) + "{question: 1\n" + _jsonl(GOOD_ROWS)),
            (2,),
            ("d.jsonl", "5"),
            (),
            {},
        ),
        ("empty-file", "d.jsonl", lambda p: write(p, ""), (2,), ("d.jsonl",), (), {}),
        ("blank-lines", "d.jsonl", lambda p: write(p, "\n\n   \n"), (2,), ("d.jsonl",), (), {}),
        (
            "missing-question",
            "d.jsonl",
            lambda p: write(p, _jsonl([{"q": "x", "answer": 1}] * 5)),
            (2,),
            ("d.jsonl", "question"),
            (),
            {},
        ),
        (
            "missing-answer",
            "d.jsonl",
            lambda p: write(p, _jsonl([{"question": "x", "a": 1}] * 5)),
            (2,),
            ("d.jsonl", "answer"),
            (),
            {},
        ),
        (
            "answer-not-number",
            "d.jsonl",
            lambda p: write(p, _jsonl([*GOOD_ROWS, {"question": "q?", "answer": "five"}])),
            (2,),
            ("d.jsonl",),
            (),
            {},
        ),
        (
            "answer-null",
            "d.jsonl",
            lambda p: write(p, _jsonl([*GOOD_ROWS, {"question": "q?", "answer": None}])),
            (2,),
            ("d.jsonl",),
            (),
            {},
        ),
        (
            "answer-object",
            "d.jsonl",
            lambda p: write(p, _jsonl([*GOOD_ROWS, {"question": "q?", "answer": {"n": 1}}])),
            (2,),
            ("d.jsonl",),
            (),
            {},
        ),
        (
            "question-number",
            "d.jsonl",
            lambda p: write(p, _jsonl([{"question": 5, "answer": 1}, *GOOD_ROWS])),
            (0, 2),
            ("d.jsonl",),
            (),
            {},
        ),
        (
            "utf8-bom",
            "d.jsonl",
            lambda p: write(p, b"\xef\xbb\xbf" + _jsonl(GOOD_ROWS).encode()),
            (0, 2),
            ("d.jsonl",),
            (),
            {},
        ),
        ("proc-self-mem", "", None, (2,), ("/proc/self/mem",), (), {}),
        ("dev-null", "", None, (2,), ("/dev/null",), (r"does not exist",), {}),
        ("fifo", "d.fifo", lambda p: os.mkfifo(p), (2,), ("d.fifo",), (), {}),
        (
            "parquet-corrupt",
            "d.parquet",
            lambda p: write(p, b"PAR1" + os.urandom(300)),
            (2,),
            ("d.parquet",),
            (),
            {},
        ),
        ("parquet-empty-file", "d.parquet", lambda p: write(p, b""), (2,), ("d.parquet",), (), {}),
        (
            "parquet-missing-columns",
            "d.parquet",
            lambda p: _parquet(p, {"q": ["a", "b", "c"], "a": [1, 2, 3]}),
            (2,),
            ("d.parquet", "question"),
            (),
            {},
        ),
        (
            "parquet-valid",
            "d.parquet",
            lambda p: _parquet(
                p,
                {
                    "question": [r["question"] for r in GOOD_ROWS],
                    "answer": [str(r["answer"]) for r in GOOD_ROWS],
                },
            ),
            (0,),
            (),
            (),
            {},
        ),
        (
            "gsm8k-no-hashes",
            "g.jsonl",
            lambda p: write(
                p,
                _jsonl(
                    [{"question": f"q{i}?", "answer": "Tom has five apples."} for i in range(6)]
                ),
            ),
            (2,),
            ("g.jsonl",),
            (),
            {"--dataset": "gsm8k"},
        ),
        (
            "gsm8k-empty-after-hashes",
            "g.jsonl",
            lambda p: write(
                p, _jsonl([{"question": f"q{i}?", "answer": f"so {i} ####"} for i in range(6)])
            ),
            (2,),
            ("g.jsonl",),
            (),
            {"--dataset": "gsm8k"},
        ),
        (
            "gsm8k-plain-numbers",
            "g.jsonl",
            lambda p: write(
                p, _jsonl([{"question": f"q{i}?", "answer": str(i)} for i in range(8)])
            ),
            (0,),
            (),
            (),
            {"--dataset": "gsm8k"},
        ),
        (
            "two-rows-hold-out-one",  # #26: the held-out slice no longer empties training
            "d.jsonl",
            lambda p: write(p, _jsonl(GOOD_ROWS[:2])),
            (0,),
            (),
            (),
            {},
        ),
    ]
    out = []
    for slug, fname, writer, expect, kws, forbid, override in files:

        def path(c: Ctx, slug: str = slug, fname: str = fname) -> str:
            return {"proc-self-mem": "/proc/self/mem", "dev-null": "/dev/null"}.get(
                slug, str(c.p(fname))
            )

        def setup(c: Ctx, writer: Any = writer, fname: str = fname) -> None:
            if writer is not None:
                writer(c.p(fname))

        out.append(
            Case(
                f"data/{slug}",
                lambda c, path=path, o=override: c.train(override={"--data-path": path(c), **o}),
                expect=expect,
                keywords=kws,
                forbid=forbid,
                setup=setup,
                needs=("model",),
                train=True,
                timeout=TRAIN_TIMEOUT if 0 in expect else CMD_TIMEOUT,
            )
        )
    out += [
        Case(
            "data/eval-path-missing",
            lambda c: c.train(extra=["--set", f"data.eval_path={c.p('test.jsonl')}"]),
            keywords=("test.jsonl",),
            needs=("model",),
            train=True,
        ),
        Case(
            "data/eval-path-directory",
            lambda c: c.train(extra=["--set", f"data.eval_path={c.p('evaldir')}"]),
            setup=lambda c: c.p("evaldir").mkdir(),
            keywords=("evaldir",),
            needs=("model",),
            train=True,
        ),
        Case(
            "data/jsonl-without-path",
            lambda c: c.train(override={"--data-path": None}),
            keywords=(("data.path", "--data-path"),),
            needs=("model",),
            train=True,
        ),
        Case(
            "data/dataset-unknown",
            lambda c: c.train(override={"--dataset": "csv"}),
            keywords=("csv",),
            needs=("model",),
            train=True,
        ),
        Case(
            "data/question-field-typo",
            lambda c: c.train(extra=["--set", "data.prompt_column=qustion"]),
            keywords=("qustion",),
            needs=("model",),
            train=True,
        ),
    ]
    return out


# ------------------------------------------------------------------ 5. model


def _copy_model(c: Ctx, edit: Callable[[Path], Any]) -> None:
    shutil.copytree(c.fx.model, c.p("m"))
    edit(c.p("m"))


def _edit_config(fn: Callable[[dict[str, Any]], Any]) -> Callable[[Path], Any]:
    def edit(m: Path) -> None:
        cfg = json.loads((m / "config.json").read_text())
        fn(cfg)
        write(m / "config.json", json.dumps(cfg))

    return edit


def _drop_tensor(m: Path) -> None:
    from safetensors.numpy import load_file, save_file

    t = load_file(str(m / "model.safetensors"))
    t.pop("model.layers.1.mlp.up_proj.weight")
    save_file(t, str(m / "model.safetensors"))


def _truncate(path: Path, frac: float = 0.5) -> None:
    with path.open("r+b") as f:
        f.truncate(int(path.stat().st_size * frac))


def model_cases() -> list[Case]:
    ST = "model.safetensors"
    edits: list[tuple[str, Callable[[Path], Any] | None, tuple[int, ...], tuple]] = [
        ("missing-dir", None, (2,), ("nope-model",)),
        ("no-config", lambda m: (m / "config.json").unlink(), (2,), ("config.json",)),
        ("config-garbage", lambda m: write(m / "config.json", "{not json"), (2,), ("config.json",)),
        ("config-list", lambda m: write(m / "config.json", "[1, 2]"), (2,), ("config.json",)),
        (
            "config-non-utf8",
            lambda m: write(m / "config.json", b'{"a": "\xff"}'),
            (2,),
            ("config.json",),
        ),
        (
            "config-is-dir",
            lambda m: ((m / "config.json").unlink(), (m / "config.json").mkdir()),
            (2,),
            ("config.json",),
        ),
        (
            "config-missing-key",
            _edit_config(lambda d: d.pop("num_hidden_layers")),
            (2,),
            ("num_hidden_layers",),
        ),
        (
            "wrong-model-type",
            _edit_config(lambda d: d.update(model_type="gpt2")),
            (2,),
            (("model_type", "gpt2"),),
        ),
        (
            "hidden-size-mismatch",
            _edit_config(lambda d: d.update(hidden_size=128)),
            (2,),
            ((ST, "shape", "hidden_size"),),
        ),
        ("safetensors-random", lambda m: write(m / ST, os.urandom(4096)), (2,), (ST,)),
        ("safetensors-truncated", lambda m: _truncate(m / ST), (2,), (ST,)),
        ("safetensors-empty", lambda m: write(m / ST, b""), (2,), (ST,)),
        ("safetensors-missing", lambda m: (m / ST).unlink(), (2,), ("safetensors",)),
        ("safetensors-missing-tensor", _drop_tensor, (2,), ("up_proj",)),
        ("tokenizer-missing", lambda m: (m / "tokenizer.json").unlink(), (2,), ("tokenizer",)),
        ("tokenizer-garbage", lambda m: write(m / "tokenizer.json", "{]"), (2,), ("tokenizer",)),
    ]
    out = []
    for slug, edit, expect, kws in edits:
        if edit is None:
            argv: Callable[[Ctx], list[str]] = lambda c: c.train(  # noqa: E731
                override={"--model": str(c.p("nope-model"))}
            )
            setup = None
        else:
            argv = lambda c: c.train(override={"--model": str(c.p("m"))})  # noqa: E731
            setup = lambda c, e=edit: _copy_model(c, e)  # noqa: E731
        out.append(
            Case(
                f"model/{slug}",
                argv,
                expect=expect,
                keywords=kws,
                setup=setup,
                needs=("model",),
                train=True,
                timeout=120,
            )
        )
    out += [
        Case(
            "model/path-is-file",
            lambda c: c.train(override={"--model": str(c.p("m.bin"))}),
            setup=lambda c: write(c.p("m.bin"), b"\0" * 64),
            keywords=("m.bin",),
            needs=("model",),
            train=True,
        ),
        Case(
            "model/empty-string",
            lambda c: c.train(override={"--model": ""}),
            keywords=("model",),
            needs=("model",),
            train=True,
        ),
        Case(
            "model/hub-id-offline",
            lambda c: c.train(override={"--model": "no-org/no-model"}),
            keywords=("no-org/no-model",),
            needs=("model",),
            train=True,
            timeout=120,
        ),
    ]
    return out


# ---------------------------------------------------------------- 6. rewards

REWARD_MODULE = """
def zero_args():
    return 1.0

def three_args(a, b, c):
    return 0.0

NOT_CALLABLE = 5

def returns_str(completion, gold):
    return "high"

def returns_nan(completion, gold):
    return float("nan")

def raises(completion, gold):
    raise ValueError("boom from my reward")

def returns_huge_int(completion, gold):
    return 10**400

def returns_just_out_of_range(completion, gold):
    return 1000001

class _NoFloat:
    def __float__(self):
        raise RuntimeError("no float for you")

def returns_no_float(completion, gold):
    return _NoFloat()

def returns_0d_array(completion, gold):
    import numpy as np
    return np.array(1.0)

def batch_returns_0d_array(prompts, completions, **kw):
    import numpy as np
    return np.array(1.0)

class _Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("str of the exception fails")

def raises_unprintable(completion, gold):
    raise _Unprintable()

def raises_keyboard_interrupt(completion, gold):
    raise KeyboardInterrupt
"""


def rewards_cases() -> list[Case]:
    def setup(c: Ctx) -> None:
        write(c.p("mods") / "fuzzrewards.py", REWARD_MODULE)
        write(
            c.p("mods") / "import_fails.py",
            "raise RuntimeError('cannot import me')\ndef fn(c, g):\n    return 0.0\n",
        )
        write(c.p("mods") / "syntax_error.py", "def fn(c, g)\n    return 0.0\n")

    def env(c: Ctx) -> dict[str, str | None]:
        return {"PYTHONPATH": f"{REPO}{os.pathsep}{c.p('mods')}"}

    items: list[tuple[str, str, tuple[int, ...], tuple]] = [
        ("missing-module", '["nosuchmod.fn"]', (2,), ("nosuchmod.fn",)),
        ("missing-function", '["tests.fakes.rewards.nope"]', (2,), ("tests.fakes.rewards.nope",)),
        (
            "colon-missing-function",
            '["tests.fakes.rewards:nope"]',
            (2,),
            ("tests.fakes.rewards:nope",),
        ),
        ("zero-args", '["fuzzrewards.zero_args"]', (2,), ("fuzzrewards.zero_args",)),
        ("three-args", '["fuzzrewards.three_args"]', (2,), ("fuzzrewards.three_args",)),
        ("builtin-wrong-signature", '["os.getcwd"]', (2,), ("os.getcwd",)),
        ("not-callable", '["fuzzrewards.NOT_CALLABLE"]', (2,), ("fuzzrewards.NOT_CALLABLE",)),
        ("module-not-function", '["os.path"]', (2,), ("os.path",)),
        ("returns-str", '["fuzzrewards.returns_str"]', (2,), ("fuzzrewards.returns_str",)),
        ("returns-nan", '["fuzzrewards.returns_nan"]', (2,), ("fuzzrewards.returns_nan",)),
        ("raises", '["fuzzrewards.raises"]', (1, 2), ("fuzzrewards.raises",)),
        # #53: each was 'unexpected error' with "report it", or 'interrupted', unnamed
        (
            "returns-huge-int",
            '["fuzzrewards.returns_huge_int"]',
            (2,),
            ("fuzzrewards.returns_huge_int", "an int of 401 digits"),
        ),
        (
            "returns-just-out-of-range",
            '["fuzzrewards.returns_just_out_of_range"]',
            (2,),
            ("returned 1000001 (int)",),
        ),
        ("returns-no-float", '["fuzzrewards.returns_no_float"]', (2,), ("returns_no_float",)),
        ("returns-0d-array", '["fuzzrewards.returns_0d_array"]', (0,), ()),  # as TRL takes it
        ("batch-returns-0d-array", '["fuzzrewards.batch_returns_0d_array"]', (2,), ("0d",)),
        ("raises-unprintable", '["fuzzrewards.raises_unprintable"]', (2,), ("unprintable",)),
        (
            "raises-keyboard-interrupt",
            '["fuzzrewards.raises_keyboard_interrupt"]',
            (130,),
            ("fuzzrewards.raises_keyboard_interrupt",),
        ),
        ("import-fails", '["import_fails.fn"]', (2,), ("import_fails",)),
        ("syntax-error", '["syntax_error.fn"]', (2,), ("syntax_error",)),
        ("empty-list", "[]", (2,), ("rewards",)),
        ("not-a-list", "5", (2,), ("rewards",)),
        ("list-with-int", '["correct", 5]', (2,), ("rewards",)),
    ]
    return [
        Case(
            f"rewards/{slug}",
            lambda c, v=v: c.train(rewards=f"rewards={v}"),
            expect=expect,
            keywords=kws,
            setup=setup,
            env=env,
            needs=("model",),
            train=True,
            timeout=TRAIN_TIMEOUT,
        )
        for slug, v, expect, kws in items
    ]


# --------------------------------------------------------------- 7. runs-dir


def _unchanged_file(name: str) -> Callable[[Ctx, Run], list[str]]:
    def post(c: Ctx, run: Run) -> list[str]:
        p = c.p(name)
        if not p.is_file() or p.read_bytes() != b"not a folder\n":
            return [f"the file {name} given as --runs-dir was changed or removed"]
        return []

    return post


def _mk_file(name: str) -> Callable[[Ctx], None]:
    return lambda c: write(c.p(name), "not a folder\n") and None


def _ro_store(c: Ctx) -> None:
    def fill(path: Path) -> None:
        shutil.copytree(c.fx.store, path / "runs", symlinks=True)

    c.state["ro"] = ro_dir(c, "ro", fill)
    c.state["before"] = snap(c.state["ro"] / "runs")


def _ro_unchanged(c: Ctx, run: Run) -> list[str]:
    d = diff(c.state["before"], snap(c.state["ro"] / "runs"))
    return [f"read-only store changed: {d}"] if d else []


def _full_disk(c: Ctx) -> None:
    c.fx.mounts.tmpfs(c.runs, "400k")


def _full_disk_post(c: Ctx, run: Run) -> list[str]:
    bad = []
    for run_dir in (p for p in c.runs.iterdir() if p.is_dir()) if c.runs.is_dir() else []:
        ck = run_dir / "checkpoints"
        if ck.is_dir():
            tmp = [x for x in os.listdir(ck) if "orbax-checkpoint-tmp" in x]
            if tmp:
                bad.append(f"partial checkpoint folders left on the full disk: {tmp}")
        st = read_json(run_dir / "status.json")
        if isinstance(st, dict) and st.get("phase") in ACTIVE:
            bad.append(f"status.json left at phase {st.get('phase')!r} after the process ended")
    return bad


def runs_dir_cases() -> list[Case]:
    cheap_default = {"--model": "smollm2-135m-instruct", "--steps": "1", "--eval-size": "0"}
    out = [
        Case(
            "runs-dir/train-regular-file",
            lambda c: c.train(runs=c.p("runsfile")),
            setup=_mk_file("runsfile"),
            keywords=("runsfile",),
            post=_unchanged_file("runsfile"),
            needs=("model",),
        ),
        Case(
            "runs-dir/train-empty-string",
            lambda c: c.train(runs=""),
            keywords=(("output.root", "runs-dir", "runs dir"),),
            needs=("model",),
        ),
        Case(
            "runs-dir/train-under-proc",
            lambda c: c.train(runs="/proc/rlctl-runs"),
            keywords=("/proc",),
            needs=("model",),
        ),
        Case(
            "runs-dir/train-proc-self",
            lambda c: c.train(runs="/proc/self"),
            keywords=("/proc",),
            needs=("model",),
        ),
        Case(
            "runs-dir/train-under-a-file",
            lambda c: c.train(runs=c.p("runsfile") / "runs"),
            setup=_mk_file("runsfile"),
            keywords=("runsfile/runs",),
            post=_unchanged_file("runsfile"),
            needs=("model",),
        ),
        Case(
            "runs-dir/train-symlink-loop",
            lambda c: c.train(runs=c.p("loop")),
            setup=lambda c: os.symlink(c.p("loop"), c.p("loop")),
            keywords=("loop",),
            needs=("model",),
        ),
        Case(
            "runs-dir/train-read-only",
            lambda c: c.train(runs=c.p("ro") / "runs"),
            setup=lambda c: ro_dir(c, "ro") and None,
            keywords=("ro/runs",),
            skip=need_mount,
            needs=("model",),
        ),
        Case(
            "runs-dir/train-full-disk",
            lambda c: c.train(steps="3", extra=["--set", "checkpoint.interval=1"]),
            expect=(1, 2),
            keywords=(("space", "disk", "full"),),
            setup=_full_disk,
            post=_full_disk_post,
            skip=need_mount,
            needs=("model",),
            timeout=TRAIN_TIMEOUT,
        ),
        Case(
            "runs-dir/env-RLCTL_RUNS_DIR-file-train",
            lambda c: c.train(override={"--runs-dir": None}),
            env=lambda c: {"RLCTL_RUNS_DIR": str(c.p("runsfile"))},
            setup=_mk_file("runsfile"),
            keywords=("runsfile",),
            post=_unchanged_file("runsfile"),
            needs=("model",),
        ),
        Case(
            "runs-dir/status-regular-file",
            lambda c: ["status", "--runs-dir", str(c.p("runsfile"))],
            expect=(0, 2),
            keywords=("runsfile",),
            ok_keywords=("runsfile",),
            setup=_mk_file("runsfile"),
            post=_unchanged_file("runsfile"),
        ),
        Case("runs-dir/status-empty-string", lambda c: ["status", "--runs-dir", ""], expect=(0, 2)),
        Case(  # a usage error click raises while parsing: one line, and JSON too
            "runs-dir/status-empty-string-json",
            lambda c: ["status", "--runs-dir", "", "-o", "json"],
            keywords=("--runs-dir",),
            check=json_error(2),
        ),
        Case("runs-dir/status-proc", lambda c: ["status", "--runs-dir", "/proc"], expect=(0, 2)),
        Case(
            "runs-dir/status-missing-dir",
            lambda c: ["status", "--runs-dir", str(c.p("nothing-here"))],
            expect=(0,),
            ok_keywords=("nothing-here",),
        ),
        Case(
            "runs-dir/status-symlink-loop",
            lambda c: ["status", "--runs-dir", str(c.p("loop"))],
            setup=lambda c: os.symlink(c.p("loop"), c.p("loop")),
            expect=(0, 2),
            keywords=("loop",),
        ),
        Case(
            "runs-dir/status-json-regular-file",
            lambda c: ["status", "--runs-dir", str(c.p("runsfile")), "-o", "json"],
            expect=(0, 2),
            setup=_mk_file("runsfile"),
        ),
        Case(
            "runs-dir/status-missing-run",
            lambda c: ["status", "nope", "--runs-dir", str(c.runs)],
            expect=(3,),
            keywords=("nope",),
            setup=lambda c: c.runs.mkdir(),
        ),
        Case(
            "runs-dir/resume-missing-run",
            lambda c: ["resume", "nope", "--runs-dir", str(c.runs)],
            expect=(3,),
            keywords=("nope",),
            setup=lambda c: c.runs.mkdir(),
        ),
        Case(
            "runs-dir/resume-regular-file",
            lambda c: ["resume", "x", "--runs-dir", str(c.p("runsfile"))],
            expect=(2, 3),
            keywords=(("runsfile", "x"),),
            setup=_mk_file("runsfile"),
            post=_unchanged_file("runsfile"),
        ),
        Case(
            "runs-dir/resume-empty-string",
            lambda c: ["resume", "x", "--runs-dir", ""],
            expect=(2, 3),
        ),
        Case(
            "runs-dir/env-RLCTL_RUNS_DIR-file-status",
            lambda c: ["status"],
            env=lambda c: {"RLCTL_RUNS_DIR": str(c.p("runsfile"))},
            expect=(0, 2),
            setup=_mk_file("runsfile"),
            post=_unchanged_file("runsfile"),
        ),
        Case(
            "runs-dir/status-read-only-store",
            lambda c: ["status", "--runs-dir", str(c.state["ro"] / "runs")],
            expect=(0,),
            ok_keywords=("good", "dmg"),
            setup=_ro_store,
            post=_ro_unchanged,
            skip=need_mount,
            needs=("store",),
        ),
        Case(
            "runs-dir/resume-read-only-store",
            lambda c: ["resume", "dmg", "--runs-dir", str(c.state["ro"] / "runs")],
            expect=(2,),
            keywords=(("read-only", "read only", "writ", "permission"),),
            setup=_ro_store,
            post=_ro_unchanged,
            skip=need_mount,
            needs=("store",),
            timeout=TRAIN_TIMEOUT,
        ),
        Case(
            "runs-dir/RLCTL_CACHE-is-file",
            lambda c: c.train(override=cheap_default),
            env=lambda c: {"RLCTL_CACHE": str(c.p("cachefile"))},
            setup=_mk_file("cachefile"),
            keywords=("RLCTL_CACHE",),
            needs=("model",),
            train=True,
            timeout=180,
        ),
        Case(
            "runs-dir/RLCTL_CACHE-under-file",
            lambda c: c.train(override=cheap_default),
            env=lambda c: {"RLCTL_CACHE": str(c.p("cachefile") / "sub")},
            setup=_mk_file("cachefile"),
            keywords=("RLCTL_CACHE",),
            needs=("model",),
            train=True,
            timeout=180,
        ),
        Case(
            "runs-dir/RLCTL_CACHE-under-proc",
            lambda c: c.train(override=cheap_default),
            env={"RLCTL_CACHE": "/proc/rlctl-cache"},
            keywords=("RLCTL_CACHE",),
            needs=("model",),
            train=True,
            timeout=180,
        ),
        Case(
            "runs-dir/RLCTL_CACHE-read-only",
            lambda c: c.train(override=cheap_default),
            env=lambda c: {"RLCTL_CACHE": str(c.p("ro") / "cache")},
            setup=lambda c: ro_dir(c, "ro") and None,
            keywords=("RLCTL_CACHE",),
            skip=need_mount,
            needs=("model",),
            train=True,
            timeout=180,
        ),
        *plot_cases(),
    ]
    return out


def _plot_store(c: Ctx) -> None:
    shutil.copytree(c.fx.store, c.runs, symlinks=True)


def _plot_store_ro(c: Ctx) -> None:
    _plot_store(c)
    ro_dir(c, "ro")


def _plot_store_full(c: Ctx) -> None:
    _plot_store(c)
    c.fx.mounts.tmpfs(c.p("full"), "8k")  # a PNG of the curve is ~40 KB


def _no_plot_left(c: Ctx, run: Run) -> list[str]:
    """A refused or failed --plot leaves no image, no temp file and no new folder."""
    left = [
        str(p.relative_to(c.tmp)) for p in c.tmp.rglob("*") if ".png" in p.name or p.name == "no"
    ]
    return [f"--plot failed but left {left}"] if left else []


def plot_cases() -> list[Case]:
    """``status RUN --plot FILE.png``: where the PNG may not go (runs-dir family: a
    path the user hands rlctl to write into)."""

    def status(plot: Callable[[Ctx], str], run: str | None = "good") -> Callable[[Ctx], list]:
        return lambda c: [
            "status",
            *([run] if run else []),
            "--runs-dir",
            str(c.runs),
            "--plot",
            plot(c),
        ]

    common: dict[str, Any] = {"setup": _plot_store, "post": _no_plot_left, "needs": ("store",)}
    return [
        Case(
            "runs-dir/status-plot-is-a-folder",
            status(lambda c: str(c.runs)),
            keywords=("is a folder",),
            **common,
        ),
        Case(
            "runs-dir/status-plot-missing-folder",
            status(lambda c: str(c.p("no") / "c.png")),
            keywords=("does not exist",),
            **common,
        ),
        Case(
            "runs-dir/status-plot-under-a-file",
            status(lambda c: str(c.runs / "good" / "spec.yaml" / "c.png")),
            keywords=("not a folder",),
            **common,
        ),
        Case(
            "runs-dir/status-plot-not-png",
            status(lambda c: "curve.svg"),
            keywords=(".png",),
            **common,
        ),
        Case("runs-dir/status-plot-empty", status(lambda c: ""), keywords=("--plot",), **common),
        Case(
            "runs-dir/status-plot-under-proc",
            status(lambda c: "/proc/curve.png"),
            keywords=("/proc",),
            **common,
        ),
        Case(
            "runs-dir/status-plot-no-run",
            status(lambda c: "c.png", run=None),
            keywords=("run",),
            **common,
        ),
        Case(
            "runs-dir/status-plot-unknown-run",
            status(lambda c: "c.png", run="nope"),
            expect=(3,),
            keywords=("nope",),
            **common,
        ),
        Case(
            "runs-dir/status-plot-read-only",
            status(lambda c: str(c.p("ro") / "c.png")),
            keywords=("not writable",),
            skip=need_mount,
            **{**common, "setup": _plot_store_ro},
        ),
        Case(
            "runs-dir/status-plot-full-disk",
            status(lambda c: str(c.p("full") / "c.png")),
            expect=(1,),
            keywords=(("space", "disk", "full"),),
            skip=need_mount,
            **{**common, "setup": _plot_store_full},
        ),
    ]


# ----------------------------------------------------------- 8. store damage


def _status(d: Path, data: Any) -> None:
    write(d / "status.json", data if isinstance(data, (str, bytes)) else json.dumps(data))


def _running_dead(d: Path) -> None:
    st = json.loads((d / "status.json").read_text())
    st.update(phase="running", pid=dead_pid(), host=socket.gethostname(), backend="local")
    _status(d, st)


def _running_reused(d: Path) -> None:
    """#57: status.json names a pid that is alive (this bench: another process than
    the run's), and the folder has no .lock: nothing holds the run."""
    st = json.loads((d / "status.json").read_text())
    st.update(phase="running", pid=os.getpid(), host=socket.gethostname(), backend="local")
    _status(d, st)
    (d / ".lock").unlink(missing_ok=True)


def _metrics_lines(d: Path, order: list[int]) -> None:
    lines = (d / "metrics.jsonl").read_text().splitlines()
    write(d / "metrics.jsonl", "".join(lines[i] + "\n" for i in order))


def _metrics_non_utf8(d: Path) -> None:
    raw = bytearray((d / "metrics.jsonl").read_bytes())
    i = raw.index(b'"loss"')
    raw[i + 1 : i + 3] = b"\xff\xfe"
    write(d / "metrics.jsonl", bytes(raw))


def _spec_types(d: Path) -> None:
    text = (d / "spec.yaml").read_text()
    write(d / "spec.yaml", re.sub(r"(?m)^(  steps:) \d+$", r"\1 many", text, count=1))


def _ckpt(d: Path, step: int) -> Path:
    return d / "checkpoints" / str(step)


def _empty_ckpt(d: Path) -> None:
    shutil.rmtree(_ckpt(d, 2))
    _ckpt(d, 2).mkdir()


def _file_instead(d: Path, rel: str) -> None:
    shutil.rmtree(d / rel)
    write(d / rel, "not a folder\n")


def _run_is_file(d: Path) -> None:
    shutil.rmtree(d)
    write(d, "not a run\n")


@dataclass
class Damage:
    slug: str
    fn: Callable[[Path], Any]
    damaged: tuple[int, ...] = ()  # checkpoint steps the damage breaks
    name_expect: tuple[int, ...] = (0,)
    name_ok: tuple = ()  # status NAME must say these
    name_err: tuple = ()
    forbid: tuple[str, ...] = ()  # neither status NAME nor the listing may say these
    list_dmg: bool = True  # the listing must still show the damaged run
    list_ok: tuple = ()  # the listing (the table) must say these
    res_expect: tuple[int, ...] = (0,)
    res_ok: tuple = ()
    res_err: tuple = ()
    res_post: Callable[[Path], list[str]] | None = None


def _backup_kept(d: Path) -> list[str]:
    return (
        []
        if (d / "checkpoints" / "backup" / "notes.txt").is_file()
        else ["a user's folder checkpoints/backup/ was deleted by resume"]
    )


DAMAGED = ("damaged",)
DAMAGES = [
    Damage(
        "status-garbage", lambda d: _status(d, "}{ not json"), name_ok=(*DAMAGED, "status.json")
    ),
    Damage(
        "status-json-list", lambda d: _status(d, "[1, 2, 3]"), name_ok=(*DAMAGED, "status.json")
    ),
    Damage(
        "status-wrong-types",
        lambda d: _status(d, {"phase": 42, "step": "two", "pid": "x", "created": 5}),
        name_ok=(("damaged", "unknown"),),
    ),
    Damage("status-empty", lambda d: _status(d, ""), name_ok=(*DAMAGED, "status.json")),
    Damage("status-nul-bytes", lambda d: _status(d, b"\0" * 64), name_ok=DAMAGED),
    Damage("status-removed", lambda d: (d / "status.json").unlink()),
    Damage(
        "status-running-dead-pid",
        _running_dead,
        name_ok=("stale",),
        forbid=(r"^\s*phase\s+running", r"│\s*running\s*│", r'"phase": "running"'),
    ),
    Damage(
        "status-running-reused-pid",
        _running_reused,
        name_ok=("stale", "holds its lock"),
        list_ok=("stale",),
        forbid=(r"^\s*phase\s+running", r"│\s*running\s*│", r'"phase": "running"'),
    ),
    Damage(
        "metrics-garbage-row",
        lambda d: (d / "metrics.jsonl").open("a").write('{"step": 99, "loss": 0.5}\n'),
        name_ok=(*DAMAGED, "metrics.jsonl line 3"),
        list_ok=("(damaged)",),
        forbid=(r"\b99/3\b", r"N > 99", r'"step": 99\b'),
    ),
    Damage(
        "metrics-appended-bytes",
        lambda d: (d / "metrics.jsonl").open("ab").write(b"\x00\xffgarbage{{\n"),
        name_ok=(*DAMAGED, "metrics.jsonl"),
    ),
    Damage("metrics-non-utf8", _metrics_non_utf8, name_ok=(*DAMAGED, "metrics.jsonl")),
    Damage("metrics-duplicated-row", lambda d: _metrics_lines(d, [0, 0, 1])),
    Damage("metrics-out-of-order", lambda d: _metrics_lines(d, [1, 0])),
    Damage(
        "eval-baseline-cut",
        lambda d: _truncate(d / "eval" / "baseline.json"),
        name_ok=(*DAMAGED, "baseline"),
    ),
    Damage("eval-removed", lambda d: shutil.rmtree(d / "eval")),
    Damage(
        "spec-removed",
        lambda d: (d / "spec.yaml").unlink(),
        name_expect=(2, 3),
        name_err=("spec.yaml",),
        res_expect=(2, 3),
        res_err=("spec.yaml",),
    ),
    Damage(
        "spec-garbage",
        lambda d: write(d / "spec.yaml", ":: [unclosed\n\0\n"),
        name_ok=(*DAMAGED, "spec.yaml"),
        list_ok=("(damaged)",),
        res_expect=(2,),
        res_err=("spec.yaml",),
    ),
    Damage(
        "spec-wrong-types",
        _spec_types,
        name_ok=(*DAMAGED, "spec.yaml"),
        list_ok=("(damaged)",),
        res_expect=(2,),
        res_err=("spec.yaml", "training.steps"),
    ),
    Damage(
        "spec-empty",
        lambda d: write(d / "spec.yaml", ""),
        name_ok=(*DAMAGED, "spec.yaml"),
        list_ok=("(damaged)",),
        res_expect=(2,),
        res_err=("spec.yaml",),
    ),
    Damage(
        "ckpt-newest-truncated",
        lambda d: truncate_largest(_ckpt(d, 2)),
        damaged=(2,),
        res_ok=(("damaged", "checkpoint 2"),),
    ),
    Damage(
        "ckpt-empty-metadata",
        lambda d: _truncate(_ckpt(d, 2) / "_CHECKPOINT_METADATA", 0),
        damaged=(2,),
        res_ok=(("damaged", "checkpoint 2"),),
    ),
    Damage(
        "ckpt-manifest-garbage",
        lambda d: write(_ckpt(d, 2) / "rlctl-manifest.json", "garbage"),
        damaged=(2,),
        res_ok=(("damaged", "checkpoint 2"),),
    ),
    Damage("ckpt-manifest-removed", lambda d: (_ckpt(d, 2) / "rlctl-manifest.json").unlink()),
    Damage(
        "ckpt-manifest-removed-and-truncated",
        lambda d: ((_ckpt(d, 2) / "rlctl-manifest.json").unlink(), truncate_largest(_ckpt(d, 2))),
        damaged=(2,),
        res_expect=(0, 2, 4),
        res_err=("checkpoint",),
    ),
    # the only checkpoint damaged (its data intact under a garbled manifest, or cut),
    # or already set aside by an earlier refused resume: refused every time, never
    # restarted from step 0, metrics.jsonl kept (see _resume_post)
    Damage(
        "ckpt-only-manifest-garbage",
        lambda d: (
            shutil.rmtree(_ckpt(d, 1)),
            write(_ckpt(d, 2) / "rlctl-manifest.json", "garbage"),
        ),
        damaged=(1, 2),
        res_expect=(4,),
        res_err=("checkpoints/2.damaged",),
    ),
    Damage(
        "ckpt-only-manifest-removed-and-truncated",
        lambda d: (
            shutil.rmtree(_ckpt(d, 1)),
            (_ckpt(d, 2) / "rlctl-manifest.json").unlink(),
            truncate_largest(_ckpt(d, 2)),
        ),
        damaged=(1, 2),
        res_expect=(4,),
        res_err=("checkpoints/2.damaged",),
    ),
    Damage(
        "ckpt-only-set-aside",
        lambda d: (
            shutil.rmtree(_ckpt(d, 1)),
            _ckpt(d, 2).rename(_ckpt(d, 2).with_name("2.damaged")),
        ),
        damaged=(1, 2),
        name_ok=(*DAMAGED, "checkpoints/2.damaged"),
        res_expect=(4,),
        res_err=("checkpoints/2.damaged",),
    ),
    Damage(
        "ckpt-newest-empty-folder",
        _empty_ckpt,
        damaged=(2,),
        res_expect=(0, 2, 4),
        res_err=("checkpoint",),
    ),
    Damage(
        "ckpt-all-truncated",
        lambda d: (truncate_largest(_ckpt(d, 1)), truncate_largest(_ckpt(d, 2))),
        damaged=(1, 2),
        res_expect=(2, 4),
        res_err=("checkpoint",),
    ),
    Damage(
        "ckpt-orbax-tmp-left",
        lambda d: write(d / "checkpoints" / "3.orbax-checkpoint-tmp-1700000000" / "x", "junk"),
    ),
    Damage(
        "ckpt-user-folder",
        lambda d: write(d / "checkpoints" / "backup" / "notes.txt", "mine\n"),
        res_post=_backup_kept,
    ),
    Damage(
        "checkpoints-is-file",
        lambda d: _file_instead(d, "checkpoints"),
        damaged=(1, 2),
        res_expect=(2,),
        res_err=("checkpoints",),
    ),
    Damage(
        "tensorboard-is-file",
        lambda d: _file_instead(d, "tensorboard"),
        res_expect=(0, 2),
        res_err=("tensorboard",),
    ),
    Damage("lock-garbage", lambda d: write(d / ".lock", b"\xff garbage")),
    Damage(
        "run-folder-is-file",
        _run_is_file,
        damaged=(1, 2),
        name_expect=(2, 3),
        name_err=("dmg",),
        res_expect=(2, 3),
        res_err=("dmg",),
        list_dmg=False,  # a file is not a run: the listing need not show it
    ),
]


def _store_setup(dm: Damage) -> Callable[[Ctx], None]:
    def setup(c: Ctx) -> None:
        shutil.copytree(c.fx.store, c.runs, symlinks=True)
        d = c.runs / "dmg"
        c.state["intact"] = {s: snap(_ckpt(d, s)) for s in (1, 2) if s not in dm.damaged}
        dm.fn(d)
        c.state["store"] = snap(c.runs)
        c.state["good"] = snap(c.runs / "good")
        m = d / "metrics.jsonl"
        c.state["metrics"] = m.read_bytes() if m.is_file() else None

    return setup


def _store_read_only(c: Ctx, run: Run) -> list[str]:
    d = diff(c.state["store"], snap(c.runs))
    return [f"a status command changed the store: {d}"] if d else []


def _listing_json(c: Ctx, run: Run) -> list[str]:
    bad = _store_read_only(c, run)
    try:
        rows = json.loads(run.out)
    except ValueError:
        return bad
    good = (
        [r for r in rows if isinstance(r, dict) and r.get("name") == "good"]
        if isinstance(rows, list)
        else []
    )
    if not good:
        bad.append("status -o json lost the healthy run 'good'")
    elif good[0].get("phase") != "completed" or good[0].get("step") != 2:
        bad.append(
            f"status -o json shows the healthy run as {good[0].get('phase')!r} "
            f"step {good[0].get('step')!r}"
        )
    return bad


def _listing_has_dmg(c: Ctx, run: Run) -> list[str]:
    try:
        rows = json.loads(run.out)
    except ValueError:
        return []
    names = [r.get("name") for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []
    return [] if "dmg" in names else ["status -o json does not list the damaged run 'dmg'"]


def _resume_post(dm: Damage) -> Callable[[Ctx, Run], list[str]]:
    def post(c: Ctx, run: Run) -> list[str]:
        d = c.runs / "dmg"
        bad = []
        g = diff(c.state["good"], snap(c.runs / "good"))
        if g:
            bad.append(f"resume of dmg changed the healthy run good: {g}")
        if run.rc == 0:
            bad += check_completed(d, 3)
            if dm.res_post:
                bad += dm.res_post(d)
            return bad
        for s, before in c.state["intact"].items():
            moved = sorted(x.name for x in (d / "checkpoints").glob(f"{s}.*"))
            if not _ckpt(d, s).exists() and moved:
                bad.append(
                    f"refused resume moved the intact checkpoint {s} to "
                    f"checkpoints/{moved[0]} (nothing left to resume from)"
                )
                continue
            ch = diff(before, snap(_ckpt(d, s)))
            if ch:
                bad.append(f"refused resume changed the intact checkpoint {s}: {ch}")
        st = read_json(d / "status.json") if d.is_dir() else None
        if isinstance(st, dict) and st.get("phase") in ACTIVE:
            bad.append(f"after the refused resume status.json says {st.get('phase')!r}")
        m = d / "metrics.jsonl"
        if c.state.get("metrics") is not None and (
            not m.is_file() or m.read_bytes() != c.state["metrics"]
        ):
            bad.append("the refused resume changed or removed metrics.jsonl")
        named = st.get("latest_checkpoint") if isinstance(st, dict) else None
        if isinstance(named, int) and not _ckpt(d, named).is_dir():
            bad.append(
                f"after the refused resume status.json names checkpoint {named}, "
                "which is not there (set aside or lost)"
            )
        if (c.runs / "good").is_dir():
            r = c.run(["status", "good", "--runs-dir", str(c.runs), "-o", "json"])
            info = read_json_text(r.out)
            if r.rc != 0 or not isinstance(info, dict) or info.get("phase") != "completed":
                bad.append(f"status of the healthy run good broke after it (exit {r.rc})")
        return bad

    return post


def read_json_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def store_cases() -> list[Case]:
    out = []
    for dm in DAMAGES:
        setup = _store_setup(dm)
        R = lambda c: ["--runs-dir", str(c.runs)]  # noqa: E731
        lst_ok = ("good", "dmg") if dm.list_dmg else ("good",)
        out += [
            Case(
                f"store-damage/{dm.slug}/status",
                lambda c, R=R: ["status", *R(c)],
                expect=(0,),
                ok_keywords=(*lst_ok, *dm.list_ok),
                forbid=dm.forbid,
                setup=setup,
                post=_store_read_only,
                needs=("store",),
            ),
            Case(
                f"store-damage/{dm.slug}/status-name",
                lambda c, R=R: ["status", "dmg", *R(c)],
                expect=dm.name_expect,
                ok_keywords=dm.name_ok,
                keywords=dm.name_err,
                forbid=dm.forbid,
                setup=setup,
                post=_store_read_only,
                needs=("store",),
            ),
            Case(
                f"store-damage/{dm.slug}/status-json",
                lambda c, R=R: ["status", *R(c), "-o", "json"],
                expect=(0,),
                forbid=dm.forbid,
                setup=setup,
                post=_listing_json,
                check=_listing_has_dmg if dm.list_dmg else None,
                needs=("store",),
            ),
            Case(
                f"store-damage/{dm.slug}/resume",
                lambda c, R=R: ["resume", "dmg", *R(c)],
                expect=dm.res_expect,
                ok_keywords=dm.res_ok,
                keywords=dm.res_err,
                setup=setup,
                post=_resume_post(dm),
                needs=("store",),
                timeout=TRAIN_TIMEOUT,
            ),
        ]
    R = lambda c: ["--runs-dir", str(c.runs)]  # noqa: E731
    # resume --steps N on the completed 2-step run 'good' (issue #25)
    for slug, n, expect, err in (
        ("0", "0", (2,), ("--steps 0", "more than")),
        ("done", "2", (2,), ("--steps 2", "more than")),
        ("extend", "3", (0,), ()),
    ):
        out.append(
            Case(
                f"store-damage/resume-steps-{slug}",
                lambda c, R=R, n=n: ["resume", "good", "--steps", n, *R(c)],
                expect=expect,
                keywords=err,
                setup=_copy_store,
                post=_extended if slug == "extend" else _good_unchanged,
                needs=("store",),
                timeout=TRAIN_TIMEOUT,
            )
        )
    return out + logs_cases()


def _logs_setup(drop_log: bool) -> Callable[[Ctx], None]:
    """The two trained runs; ``drop_log``: ``good`` as an older rlctl left it, with no
    train.log."""

    def setup(c: Ctx) -> None:
        shutil.copytree(c.fx.store, c.runs, symlinks=True)
        if drop_log:
            (c.runs / "good" / "train.log").unlink()
        c.state["store"] = snap(c.runs)

    return setup


def _quiet_stdout(c: Ctx, run: Run) -> list[str]:
    return [f"stdout should be empty, got {run.out[:100]!r}"] if run.out.strip() else []


def logs_cases() -> list[Case]:
    """``rlctl logs`` of runs trained on this machine (their train.log); it only reads."""
    R = lambda c: ["--runs-dir", str(c.runs)]  # noqa: E731
    return [
        Case(
            "store-damage/logs-missing-run",
            lambda c: ["logs", "nope", *R(c)],
            expect=(3,),
            keywords=("not found",),
            setup=_logs_setup(False),
            post=_store_read_only,
            needs=("store",),
        ),
        Case(
            "store-damage/logs-follow-missing-run",
            lambda c: ["logs", "nope", "-f", *R(c)],
            expect=(3,),
            keywords=("not found",),
            setup=_logs_setup(False),
            post=_store_read_only,
            needs=("store",),
        ),
        Case(
            "store-damage/logs-no-log-file",
            lambda c: ["logs", "good", *R(c)],
            expect=(0,),
            ok_keywords=("has no train.log",),
            setup=_logs_setup(True),
            check=_quiet_stdout,
            post=_store_read_only,
            needs=("store",),
        ),
        Case(
            "store-damage/logs-follow-no-log-file",
            lambda c: ["logs", "good", "-f", *R(c)],
            expect=(0,),
            ok_keywords=("has no train.log",),
            setup=_logs_setup(True),
            check=_quiet_stdout,
            post=_store_read_only,
            needs=("store",),
        ),
        Case(
            "store-damage/logs-follow-finished",
            lambda c: ["logs", "good", "-f", *R(c)],
            expect=(0,),
            ok_keywords=("run completed: 2 steps", "its log ends here"),
            setup=_logs_setup(False),
            post=_store_read_only,
            needs=("store",),
        ),
        Case(
            "store-damage/logs-json",
            lambda c: ["logs", "good", *R(c), "-o", "json"],
            expect=(0,),
            ok_keywords=('"lines"',),
            setup=_logs_setup(False),
            post=_store_read_only,
            needs=("store",),
        ),
    ]


def _good_unchanged(c: Ctx, run: Run) -> list[str]:
    d = diff(c.state["good"], snap(c.runs / "good"))
    return [f"a refused resume --steps changed run good: {d}"] if d else []


def _extended(c: Ctx, run: Run) -> list[str]:
    bad = check_completed(c.runs / "good", 3)
    spec = (c.runs / "good" / "spec.yaml").read_text()
    if "steps: 3" not in spec:
        bad.append("spec.yaml does not say the new step count 3")
    return bad


# --------------------------------------------------------- 9. cloud, no creds


def cloud_cases() -> list[Case]:
    CR = ("credentials",)
    NET = ["network", "create", "rl", *P]
    CL = ["cluster", "create", "rl", *P]
    items: list[tuple[str, list[str], tuple[int, ...], tuple, dict[str, str | None]]] = [
        ("network-create", [*NET, "--yes"], (5,), CR, {}),
        # a dry run without credentials plans an empty project (README "Try it without a
        # Google account"; #53: network create as cluster create): exit 0, said first
        ("network-create-dry-run", [*NET, "--dry-run"], (0,), (), {}),
        ("network-create-json", [*NET, "--dry-run", "-o", "json"], (0,), (), {}),
        ("network-create-no-name", ["network", "create", *P, "--dry-run"], (2,), ("name",), {}),
        (
            "network-create-no-project",  # planned against the placeholder my-project
            ["network", "create", "rl", "--dry-run"],
            (0,),
            (),
            {},
        ),
        ("network-create-count-0", [*NET, "--count", "0", "--dry-run"], (2,), ("count",), {}),
        ("network-create-count-neg", [*NET, "--count", "-1", "--dry-run"], (2,), ("count",), {}),
        ("network-create-count-1000", [*NET, "--count", "1000", "--dry-run"], (2,), ("count",), {}),
        ("network-create-mtu-100", [*NET, "--mtu", "100", "--dry-run"], (2,), ("mtu",), {}),
        (
            "network-create-bad-cidr",
            [*NET, "--count", "1", "--dcn-cidr", "notacidr", "--dry-run"],
            (2,),
            ("notacidr",),
            {},
        ),
        (
            "network-create-cidr-count-mismatch",
            [*NET, "--count", "2", "--dcn-cidr", "10.50.0.0/16", "--dry-run"],
            (2,),
            ("cidr",),
            {},
        ),
        ("network-show", ["network", "show", "rl", *P], (5,), CR, {}),
        ("network-show-no-name", ["network", "show", *P], (2,), ("name",), {}),
        ("network-delete", ["network", "delete", "rl", *P, "--yes"], (5,), CR, {}),
        ("cluster-create", [*CL, "-a", "v6e-16", "--yes"], (5,), CR, {}),
        ("cluster-create-dry-run", [*CL, "-a", "v6e-16", "--dry-run"], (0,), (), {}),
        ("cluster-create-json", [*CL, "-a", "v6e-16", "--dry-run", "-o", "json"], (0,), (), {}),
        # #53: what cannot exist is refused offline, not planned and priced
        (
            "cluster-create-mars",
            ["cluster", "create", "rl", "--region", "mars-1", "-a", "v6e-16", "--dry-run"],
            (2,),
            ("mars-1",),
            {},
        ),
        (
            "cluster-create-bad-project",
            ["cluster", "create", "rl", "--project", "BAD PROJECT", "-a", "v6e-16", "--dry-run"],
            (2,),
            ("BAD PROJECT",),
            {},
        ),
        (
            "cluster-create-no-name",
            ["cluster", "create", *P, "-a", "v6e-16", "--dry-run"],
            (2,),
            ("name",),
            {},
        ),
        (
            "cluster-create-count-flag",
            [*CL, "-a", "v6e-16", "--count", "0", "--dry-run"],
            (2,),
            ("--count",),
            {},
        ),
        (
            "cluster-create-bad-accelerator",
            [*CL, "-a", "v6e-99", "--dry-run"],
            (2,),
            ("v6e-99",),
            {},
        ),
        (
            "cluster-create-accelerator-garbage",
            [*CL, "-a", "x2 v6e", "--dry-run"],
            (2,),
            ("x2 v6e",),
            {},
        ),
        ("cluster-create-x0", [*CL, "-a", "v6e-16 x0", "--dry-run"], (2,), ("x0",), {}),
        (
            "cluster-create-num-slices-0",
            [*CL, "-a", "v6e-16", "--num-slices", "0", "--dry-run"],
            (2,),
            (("num-slices", "num_slices", "slices"),),
            {},
        ),
        (
            "cluster-create-autopilot-tpu",
            [*CL, "--autopilot", "-a", "v6e-16", "--dry-run"],
            (2, 5),
            (),
            {},
        ),
        ("cluster-create-autopilot", [*CL, "--autopilot", "--dry-run"], (2, 5), (), {}),
        (
            "cluster-create-spot-and-reservation",
            [*CL, "-a", "v6e-16", "--spot", "--reservation", "r", "--dry-run"],
            (2,),
            ("reservation",),
            {},
        ),
        (
            "cluster-create-bad-channel",
            [*CL, "-a", "v6e-16", "--release-channel", "fastest", "--dry-run"],
            (2,),
            ("fastest",),
            {},
        ),
        (
            "cluster-create-bad-bucket",
            [*CL, "-a", "v6e-16", "--bucket", "Bad_Bucket!", "--dry-run"],
            (2,),
            ("Bad_Bucket!",),
            {},
        ),
        (
            "cluster-create-bucket-elsewhere",
            [
                *CL,
                "-a",
                "v6e-16",
                "--bucket",
                "b",
                "--bucket-location",
                "europe-west4",
                "--dry-run",
            ],
            (2,),
            ("europe-west4",),
            {},
        ),
        (
            "cluster-create-bad-zone",
            [*CL, "-a", "v6e-16", "--zone", "europe-west4-a", "--dry-run"],
            (2,),
            ("europe-west4-a",),
            {},
        ),
        ("cluster-list", ["cluster", "list", "--project", "p"], (5,), CR, {}),
        ("cluster-list-json", ["cluster", "list", "--project", "p", "-o", "json"], (5,), CR, {}),
        (
            "cluster-list-output-yaml",
            ["cluster", "list", "--project", "p", "-o", "yaml"],
            (2,),
            ("yaml",),
            {},
        ),
        ("cluster-describe", ["cluster", "describe", "rl", *P], (5,), CR, {}),
        ("cluster-delete", ["cluster", "delete", "rl", *P, "--yes"], (5,), CR, {}),
        ("delete-cluster-dry-run", ["delete", "cluster", "rl", *P, "--dry-run"], (5,), CR, {}),
        (
            "train-cluster-dry-run",  # without -a nothing says what the cluster holds
            ["train", "grpo", "--cluster", "rl", "--image", "img:1", *P, "--dry-run"],
            (2,),
            ("-a",),
            {},
        ),
        ("status-gs", ["status", "r", "--runs-dir", "gs://b/runs", *P], (5,), CR, {}),
        ("logs-gs", ["logs", "r", "--runs-dir", "gs://b/runs", *P], (5,), CR, {}),
        ("logs-local", ["logs", "r"], (3,), ("not found",), {}),
        ("resume-gs", ["resume", "r", "--runs-dir", "gs://b/runs", *P], (5,), CR, {}),
        (
            "endpoint-not-a-url",
            [*NET, "--dry-run"],
            (2,),
            ("RLCTL_API_ENDPOINT_OVERRIDES_COMPUTE",),
            {"RLCTL_API_ENDPOINT_OVERRIDES_COMPUTE": "notaurl"},
        ),
        (
            "auth-disable-not-bool",
            [*NET, "--dry-run"],
            (2,),
            ("RLCTL_AUTH_DISABLE_CREDENTIALS",),
            {"RLCTL_AUTH_DISABLE_CREDENTIALS": "maybe"},
        ),
        (
            "gac-missing-file",
            [*NET, "--dry-run"],
            (2, 5),
            ("GOOGLE_APPLICATION_CREDENTIALS",),
            {"GOOGLE_APPLICATION_CREDENTIALS": "/nonexistent/key.json"},
        ),
    ]
    out = [
        Case(
            f"cloud-no-creds/{slug}",
            lambda c, a=argv: list(a),
            expect=expect,
            keywords=kws,
            env=env or None,
        )
        for slug, argv, expect, kws, env in items
    ]
    closed = {
        f"RLCTL_API_ENDPOINT_OVERRIDES_{s}": "http://127.0.0.1:9"
        for s in ("COMPUTE", "CONTAINER", "TPU", "SERVICEUSAGE", "STORAGE")
    }
    out += [
        Case(
            "cloud-no-creds/gac-garbage-file",
            lambda c: [*NET, "--dry-run"],
            expect=(2, 5),
            keywords=("GOOGLE_APPLICATION_CREDENTIALS",),
            env=lambda c: {"GOOGLE_APPLICATION_CREDENTIALS": str(c.p("key.json"))},
            setup=lambda c: write(c.p("key.json"), "{not a key"),
        ),
        Case(
            "cloud-no-creds/endpoint-closed-port",
            lambda c: [*NET, "--dry-run"],
            expect=(7,),
            keywords=("127.0.0.1",),
            env={"RLCTL_AUTH_DISABLE_CREDENTIALS": "true", **closed},
            timeout=90,
        ),
        Case(
            "cloud-no-creds/debug-flag-keeps-exit-code",
            lambda c: ["--debug", *NET, "--yes"],
            expect=(5,),
            allow_traceback=True,
            one_line=False,
        ),
        Case(
            "cloud-no-creds/debug-env-keeps-exit-code",
            lambda c: [*NET, "--yes"],
            expect=(5,),
            env={"RLCTL_DEBUG": "1"},
            allow_traceback=True,
            one_line=False,
        ),
    ]
    return out


# ------------------------------------------------------------ 10. concurrency


def _judge_into(
    o: Outcome,
    run: Run,
    tag: str,
    expect: Iterable[int | None],
    keywords: Iterable = (),
    ok_keywords: Iterable = (),
) -> None:
    tb, why = judge(run, expect, keywords, ok_keywords)
    o.traceback |= tb
    o.unclear += [f"{tag}: {w}" for w in why]


def _race(
    argvs: Callable[[Ctx], list[list[str]]],
    run_name: str,
    steps: int,
    winners: int = 1,
    loser_kw: tuple = (),
) -> Callable[[Ctx, Outcome], None]:
    def runner(c: Ctx, o: Outcome) -> None:
        procs = [c.spawn(a, f"p{i}") for i, a in enumerate(argvs(c))]
        runs = [p.finish(TRAIN_TIMEOUT) for p in procs]
        o.take(runs[0])
        o.cmd = "  &  ".join(r.cmd() for r in runs)
        o.expected = f"{winners}x 0, the others 4"
        o.rc = [r.rc for r in runs]
        won = [r for r in runs if r.rc == 0]
        if len(won) != winners:
            o.lost.append(
                f"{len(won)} of {len(runs)} racing writers exited 0 "
                f"(exits {o.rc}), expected exactly {winners}"
            )
        for i, r in enumerate(runs):
            if r.rc == 0:
                _judge_into(o, r, f"#{i}", (0,))
            else:
                _judge_into(o, r, f"#{i}", (4,), loser_kw)
                lines = [x for x in r.err.splitlines() if x.strip()]
                o.err_first, o.err_last = (lines[0][:240], lines[-1][:240]) if lines else ("", "")
        o.lost += check_completed(c.runs / run_name, steps)
        if "good" in c.state:
            g = diff(c.state["good"], snap(c.runs / "good"))
            if g:
                o.lost.append(f"the race changed the healthy run good: {g}")

    return runner


def _copy_store(c: Ctx) -> None:
    shutil.copytree(c.fx.store, c.runs, symlinks=True)
    c.state["good"] = snap(c.runs / "good")


def _status_during_resume(c: Ctx, o: Outcome) -> None:
    p = c.spawn(["resume", "dmg", "--runs-dir", str(c.runs)], "resume")
    polls = 0
    seen: list[str] = []
    while p.alive() and polls < 400:
        r = c.run(["status", "dmg", "--runs-dir", str(c.runs), "-o", "json"])
        still = p.alive()
        polls += 1
        tb, why = judge(r, (0,))
        o.traceback |= tb
        o.unclear += [f"status poll {polls}: {w}" for w in why]
        info = read_json_text(r.out)
        if isinstance(info, dict):
            ph = info.get("phase")
            if not seen or seen[-1] != ph:
                seen.append(ph)
            if ph == "stale" and still:
                o.lost.append(f"status poll {polls} says 'stale' while resume (pid {p.pid}) runs")
        time.sleep(0.3)
    run = p.finish(TRAIN_TIMEOUT)
    o.take(run)
    o.cmd = f"{run.cmd()}  &  (rlctl status dmg -o json, polled {polls}x)"
    o.note = f"phases seen: {seen}"
    o.expected = "0 (resume and every status poll)"
    _judge_into(o, run, "resume", (0,))
    o.unclear = sorted(set(o.unclear), key=o.unclear.index)[:6]
    o.lost += check_completed(c.runs / "dmg", 3)


def concurrency_cases() -> list[Case]:
    R = lambda c: ["--runs-dir", str(c.runs)]  # noqa: E731
    ckpt = ["--set", "checkpoint.interval=1"]
    return [
        Case(
            "concurrency/two-resumes",
            needs=("store",),
            setup=_copy_store,
            runner=_race(lambda c: [["resume", "dmg", *R(c)]] * 2, "dmg", 3, loser_kw=("dmg",)),
        ),
        Case(
            "concurrency/three-resumes",
            needs=("store",),
            setup=_copy_store,
            runner=_race(lambda c: [["resume", "dmg", *R(c)]] * 3, "dmg", 3, loser_kw=("dmg",)),
        ),
        Case(
            "concurrency/two-trains-same-name",
            needs=("model",),
            runner=_race(
                lambda c: [c.train(name="dup", extra=ckpt)] * 2, "dup", 2, loser_kw=("dup",)
            ),
        ),
        Case(
            "concurrency/resume-and-train-same-name",
            needs=("store",),
            setup=_copy_store,
            runner=_race(
                lambda c: [["resume", "dmg", *R(c)], c.train(name="dmg", steps="3", extra=ckpt)],
                "dmg",
                3,
                loser_kw=("dmg",),
            ),
        ),
        Case(
            "concurrency/status-while-resuming",
            needs=("store",),
            setup=_copy_store,
            runner=_status_during_resume,
        ),
        Case(
            "concurrency/train-existing-name",
            lambda c: c.train(name="good"),
            expect=(4,),
            keywords=("good",),
            needs=("store",),
            setup=_copy_store,
            post=lambda c, r: (
                [f"changed the existing run: {d}"]
                if (d := diff(c.state["good"], snap(c.runs / "good")))
                else []
            ),
        ),
        Case(
            "concurrency/resume-completed",
            lambda c: ["resume", "good", *R(c)],
            expect=(4,),
            keywords=("completed",),
            needs=("store",),
            setup=_copy_store,
            post=lambda c, r: (
                [f"changed the completed run: {d}"]
                if (d := diff(c.state["good"], snap(c.runs / "good")))
                else []
            ),
        ),
    ]


# ----------------------------------------------------------------- 11. signals


def _wait_for(p: Spawned, cond: Callable[[], bool], limit: float, poll: float = 0.05) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit and p.alive():
        if cond():
            return True
        time.sleep(poll)
    return False


def _signal_case(
    sig: int, when: str, twice: bool = False, on_resume: bool = False
) -> Callable[[Ctx, Outcome], None]:
    """``when``: 'random' (uniform over the expected run time), 'spec' (as soon as
    spec.yaml exists), 'ckpt1'/'ckpt2' (once that checkpoint folder exists), 'early',
    or 'step2' (once metrics.jsonl has step 2, checkpoints every 10 steps: the stop's
    own save must keep the steps done, issue #25; twice: every step, and the second
    signal's skipped save may lose only the step in progress)."""
    steps = 4
    at_step = when == "step2"

    def runner(c: Ctx, o: Outcome) -> None:
        if on_resume:
            _copy_store(c)
            name, steps_n = "dmg", 3
            argv = ["resume", "dmg", "--runs-dir", str(c.runs)]
        else:
            name, steps_n = "sig", steps
            # twice: the second signal skips the stop's save, so what is kept is what
            # the interval saved (every step here: at most the step in progress lost)
            interval = "10" if at_step and not twice else "1"
            argv = c.train(
                name=name, steps=str(steps), extra=["--set", f"checkpoint.interval={interval}"]
            )
        d = c.runs / name
        # start-up dominates: a 4-step train takes about as long as the 2-step fixture
        # run, a 1-step resume about 0.6x; aim inside that
        est = (c.fx.train_secs or 15.0) * (0.6 if on_resume else 0.95)
        p = c.spawn(argv, "train")
        if when == "random":
            delay = c.rng.uniform(0.5, 0.85 * est)
            _wait_for(p, lambda: False, delay)
            moment = f"after {delay:.1f} s"
        elif when == "early":
            _wait_for(p, lambda: False, 0.4)
            moment = "after 0.4 s"
        elif at_step:
            _wait_for(p, lambda: len(metrics_steps(d)[0]) >= 2, 200, 0.02)
            moment = "once step 2 was in metrics.jsonl"
        elif when == "spec":
            _wait_for(p, lambda: (d / "spec.yaml").exists(), 120, 0.002)
            moment = "as soon as spec.yaml appeared"
        else:
            step = when[-1]
            _wait_for(p, lambda: (d / "checkpoints" / step).is_dir(), 200, 0.02)
            moment = f"once checkpoints/{step} appeared"
        alive = p.alive()
        if alive:
            os.kill(p.pid, sig)
            if twice:
                time.sleep(0.2)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, sig)
        run = p.finish(120)
        p.kill()
        signame = signal.Signals(sig).name + (" twice" if twice else "")
        o.note = f"{signame} {moment}" + ("" if alive else " (it had already exited)")
        o.take(run)
        o.cmd = f"{run.cmd()}  ; kill -{signal.Signals(sig).name[3:]} {moment}"
        created = (d / "spec.yaml").exists()
        done = (read_json(d / "status.json") or {}).get("phase") == "completed"
        if sig == signal.SIGKILL:
            o.expected = "-9, then status not active, then resume 0"
        else:
            o.expected = f"130 (-{sig} before the run exists), then resume 0"
        if not alive:
            _judge_into(o, run, "train", (0,))
        elif sig == signal.SIGKILL:
            if run.rc != -signal.SIGKILL:
                o.unclear.append(f"exit {run.rc} after SIGKILL")
        else:
            _judge_into(
                o,
                run,
                "signalled",
                # -sig: before the run exists, or after it completed (the handler is gone)
                (130,) if created and not done else (130, -sig, 0) if done else (130, -sig),
                keywords=("interrupted",) if run.rc == 130 else (),
            )
            st = read_json(d / "status.json")
            if sig != signal.SIGKILL and isinstance(st, dict) and st.get("phase") in ACTIVE:
                o.lost.append(
                    f"{signame} left status.json at phase {st.get('phase')!r} "
                    f"(README: recorded 'interrupted')"
                )
            if at_step and alive and isinstance(st, dict):
                done, kept = st.get("step"), st.get("latest_checkpoint")
                if done != len(metrics_steps(d)[0]):
                    o.lost.append(
                        f"status.json step {done}, metrics.jsonl has "
                        f"{len(metrics_steps(d)[0])} steps"
                    )
                if not twice and kept != done:
                    o.lost.append(
                        f"{signame} after step {done} kept checkpoint {kept}: "
                        "the stop's save lost steps"
                    )
                if twice and (kept or 0) < (done or 0) - 1 and (done or 0) > 1:
                    o.lost.append(
                        f"{signame} after step {done} kept checkpoint {kept}: "
                        "more than the step in progress lost"
                    )
        if not created:
            o.note += "; no run was created yet"
            return
        s = c.run(["status", name, "--runs-dir", str(c.runs), "-o", "json"])
        _judge_into(o, s, "status", (0,))
        info = read_json_text(s.out)
        phase = info.get("phase") if isinstance(info, dict) else None
        if phase in ACTIVE:
            o.lost.append(f"status says {phase!r} for the dead process")
        o.note += f"; status after: {phase}"
        if phase == "completed":
            o.lost += check_completed(d, steps_n)
            return
        r = c.run(["resume", name, "--runs-dir", str(c.runs)], timeout=TRAIN_TIMEOUT)
        _judge_into(o, r, "resume", (0,))
        if r.rc != 0:
            o.take(r)
        o.lost += check_completed(d, steps_n)
        if on_resume:
            g = diff(c.state["good"], snap(c.runs / "good"))
            if g:
                o.lost.append(f"changed the healthy run good: {g}")

    return runner


def signals_cases() -> list[Case]:
    T, K, INT = signal.SIGTERM, signal.SIGKILL, signal.SIGINT
    items = [
        ("sigterm-random-1", T, "random", False, False),
        ("sigterm-random-2", T, "random", False, False),
        ("sigkill-random-1", K, "random", False, False),
        ("sigkill-random-2", K, "random", False, False),
        ("sigint-random", INT, "random", False, False),
        ("sigterm-early", T, "early", False, False),
        ("sigkill-at-spec-written", K, "spec", False, False),
        ("sigterm-at-spec-written", T, "spec", False, False),
        ("sigkill-after-ckpt-1", K, "ckpt1", False, False),
        ("sigterm-after-ckpt-2", T, "ckpt2", False, False),
        ("sigterm-twice", T, "random", True, False),
        ("sigint-at-step-2", INT, "step2", False, False),
        ("sigterm-at-step-2", T, "step2", False, False),
        ("sigint-twice-at-step-2", INT, "step2", True, False),
        ("sigkill-during-resume", K, "random", False, True),
        ("sigterm-during-resume", T, "random", False, True),
    ]
    return [
        Case(
            f"signals/{slug}",
            runner=_signal_case(sig, when, twice, on_resume),
            needs=("store",) if on_resume else ("model",),
        )
        for slug, sig, when, twice, on_resume in items
    ]


# ------------------------------------------------------------- 12. status-width

LONG1 = "grpo-20261122-101500-3fa2"
LONG2 = "my-second-experiment-run"
LONG40 = "a-forty-character-run-name-for-a-tables"


def _width_setup(c: Ctx) -> None:
    shutil.copytree(c.fx.store / "good", c.runs / LONG1, symlinks=True)
    shutil.copytree(c.fx.store / "dmg", c.runs / LONG2, symlinks=True)


def _width_setup40(c: Ctx) -> None:
    _width_setup(c)
    shutil.copytree(c.fx.store / "good", c.runs / LONG40, symlinks=True)


def _shows(names: tuple[str, ...], phases: tuple[str, ...]) -> Callable[[Ctx, Run], list[str]]:
    def check(c: Ctx, run: Run) -> list[str]:
        missing = [x for x in (*names, *phases) if x not in run.out]
        return [f"stdout does not show {', '.join(missing)} whole"] if missing else []

    return check


def _one_watch_line(name: str, phase: str) -> Callable[[Ctx, Run], list[str]]:
    def check(c: Ctx, run: Run) -> list[str]:
        lines = run.out.splitlines()
        if len(lines) != 1 or not run.out.endswith("\n"):
            return [f"--watch into a pipe: {len(lines)} lines, want one whole line"]
        want = f"{name} phase={phase} "
        return [] if want in lines[0] else [f"--watch line lacks {want!r}: {lines[0][:120]!r}"]

    return check


def width_cases() -> list[Case]:
    names, phases = (LONG1, LONG2), ("completed", "interrupted")
    R = lambda c: ["--runs-dir", str(c.runs)]  # noqa: E731
    out = []
    for cols in ("80", "40", "20", "10"):
        out.append(
            Case(
                f"status-width/COLUMNS-{cols}",
                lambda c, R=R: ["status", *R(c)],
                expect=(0,),
                env={"COLUMNS": cols},
                setup=_width_setup,
                check=_shows(names, phases),
                needs=("store",),
            )
        )
    out += [
        Case(
            "status-width/COLUMNS-80-name-40-chars",
            lambda c: ["status", *R(c)],
            expect=(0,),
            env={"COLUMNS": "80"},
            setup=_width_setup40,
            check=_shows((*names, LONG40), phases),
            needs=("store",),
        ),
        Case(
            "status-width/COLUMNS-20-one-run",
            lambda c: ["status", LONG2, *R(c)],
            expect=(0,),
            env={"COLUMNS": "20"},
            setup=_width_setup,
            check=_shows((LONG2,), ("interrupted",)),
            needs=("store",),
        ),
        Case(
            "status-width/COLUMNS-20-json",
            lambda c: ["status", *R(c), "-o", "json"],
            expect=(0,),
            env={"COLUMNS": "20"},
            setup=_width_setup,
            check=_shows(names, phases),
            needs=("store",),
        ),
        Case(  # a pipe with no COLUMNS: rich's 80 columns used to cut names to "grpo-202…"
            "status-width/pipe-name-40-chars",
            lambda c: ["status", *R(c)],
            expect=(0,),
            setup=_width_setup40,
            check=_shows((*names, LONG40), phases),
            needs=("store",),
        ),
        Case(  # a live display into a pipe printed one cut line at the end, no newline
            "status-width/watch-pipe-ended-run",
            lambda c: ["status", LONG1, "--watch", "--interval", "0.5", *R(c)],
            expect=(0,),
            setup=_width_setup,
            check=_one_watch_line(LONG1, "completed"),
            needs=("store",),
        ),
        Case(
            "status-width/COLUMNS-garbage",
            lambda c: ["status", *R(c)],
            expect=(0,),
            env={"COLUMNS": "abc"},
            setup=_width_setup,
            check=_shows(names, phases),
            needs=("store",),
        ),
    ]
    return out


# =========================================================================== main

# ==================================================================== #47 families
# Each family below covers one kind of issue #47 (points 1-6): a run that goes
# non-finite, a spec rlctl writes and must read back, the first save on a small disk,
# the store's truth from its files, messages that tell the truth, a reward as a guest.

FLAKY_REWARD = """
import os, sys

def flaky(completion, gold):
    # good until the file $BAD_AFTER exists (a checkpoint of the run), then $BAD_MODE
    if os.path.exists(os.environ.get("BAD_AFTER", "/nonexistent")):
        mode = os.environ.get("BAD_MODE", "value")
        if mode == "exit":
            sys.exit(3)
        if mode == "os-exit":
            os._exit(7)
        return float(os.environ["BAD_VALUE"])
    return sum(ch.isdigit() for ch in completion) / 10.0

def huge(completion, gold):
    return 1e308

def exits_at_once(completion, gold):
    sys.exit(0)

def noisy(completion, gold):
    print("scoring", repr(completion[:6]))
    os.write(1, b"raw bytes on descriptor 1\\n")
    return sum(ch.isdigit() for ch in completion) / 10.0
"""
FLAKY = 'rewards=["./r.py:flaky"]'


def _reward_file(c: Ctx) -> None:
    write(c.p("r.py"), FLAKY_REWARD)


def _bad_then_fixed(mode: str, value: str = "") -> Callable[[Ctx, Outcome], None]:
    """Train 3 steps with a reward that goes bad at step 2 (checkpoint 1 exists), then
    resume with it fixed: the first stops at step 2 naming the reward, keeps only the
    finite checkpoint 1; the resume completes 3 steps."""

    def runner(c: Ctx, o: Outcome) -> None:
        _reward_file(c)
        d = c.runs / "nf"
        argv = c.train(
            name="nf", steps="3", rewards=FLAKY, extra=["--set", "checkpoint.interval=1"]
        )
        bad = {"BAD_AFTER": str(d / "checkpoints" / "1"), "BAD_MODE": mode, "BAD_VALUE": value}
        run = c.run(argv, bad, TRAIN_TIMEOUT)
        o.take(run)
        _judge_into(o, run, "train", (2,), ("step 2", "r.py:flaky"))
        st = read_json(d / "status.json")
        if (
            not isinstance(st, dict)
            or st.get("phase") != "failed"
            or "r.py:flaky" not in str(st.get("error"))
        ):
            o.lost.append(
                f"status.json after the stop: {st!r:.200}, expected failed naming the reward"
            )
        ck = sorted(os.listdir(d / "checkpoints")) if (d / "checkpoints").is_dir() else []
        if ck != ["1"]:
            o.lost.append(f"checkpoints {ck} after the stop, expected the finite 1 alone")
        steps, _ = metrics_steps(d)
        if steps != [1]:
            o.lost.append(f"metrics steps {steps} after the stop at step 2, expected [1]")
        again = c.run(["resume", "nf", "--runs-dir", str(c.runs)], None, TRAIN_TIMEOUT)
        _judge_into(o, again, "resume (reward fixed)", (0,))
        o.lost += check_completed(d, 3)

    return runner


def _nan_model(c: Ctx) -> None:
    """The tiny model with its last norm's first weight NaN: every loss is NaN."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(c.fx.model, c.p("nan-model"))
    f = c.p("nan-model") / "model.safetensors"
    tensors = load_file(str(f))
    name = next(n for n in tensors if n.endswith("norm.weight"))
    tensors[name] = tensors[name].copy()
    tensors[name][0] = float("nan")
    save_file(tensors, str(f), metadata={"format": "pt"})


def _nothing_saved(c: Ctx, run: Run) -> list[str]:
    d = c.runs / "nan"
    ck = d / "checkpoints"
    bad = (
        [f"checkpoints saved after a NaN loss: {sorted(os.listdir(ck))}"]
        if ck.is_dir() and os.listdir(ck)
        else []
    )
    st = read_json(d / "status.json")
    if not isinstance(st, dict) or st.get("phase") != "failed":
        bad.append(f"status.json {st!r:.160}, expected phase failed")
    return bad


def _nan_checkpoint(c: Ctx) -> None:
    """Run good's checkpoint 3: its checkpoint 2 with one weight NaN, saved by Orbax
    (what an older rlctl saved once its loss had gone NaN)."""
    import numpy as np
    import orbax.checkpoint as ocp

    shutil.copytree(c.fx.store, c.runs, symlinks=True)
    with ocp.CheckpointManager(c.runs / "good" / "checkpoints") as manager:
        state = manager.restore(2, args=ocp.args.StandardRestore())
        w = state["model"]["final_norm"]["w"]
        state["model"]["final_norm"]["w"] = np.full(np.shape(w), np.nan, np.float32)
        manager.save(3, args=ocp.args.StandardSave(state))
        manager.wait_until_finished()


def _no_export(c: Ctx, run: Run) -> list[str]:
    left = sorted(p.name for p in c.tmp.iterdir() if p.name.startswith("export"))
    return [f"a refused export left {left}"] if left else []


def nonfinite_cases() -> list[Case]:
    """#47 point 1: finite or stopped."""
    rw = {"needs": ("model",), "timeout": TRAIN_TIMEOUT}
    return [
        Case("non-finite/reward-1e308-at-step-2", runner=_bad_then_fixed("value", "1e308"), **rw),
        Case("non-finite/reward-nan-at-step-2", runner=_bad_then_fixed("value", "nan"), **rw),
        Case("non-finite/reward-inf-at-step-2", runner=_bad_then_fixed("value", "-inf"), **rw),
        Case(
            "non-finite/reward-1e308-on-its-trial",
            lambda c: c.train(rewards='rewards=["./r.py:huge"]'),
            setup=_reward_file,
            keywords=("r.py:huge", "outside the range"),
            train=True,
            **rw,
        ),
        Case(
            "non-finite/reward-weight-overflows",
            lambda c: c.train(
                rewards='rewards=[{"fn": "tests.fakes.rewards.digit_count", "weight": 1e300}]'
            ),
            keywords=("digit_count", "overflow"),
            train=True,
            **rw,
        ),
        Case(
            "non-finite/loss-nan-from-the-model",
            lambda c: c.train(
                name="nan", override={"--model": str(c.p("nan-model")), "--eval-size": "0"}
            ),
            setup=_nan_model,
            expect=(1,),
            keywords=("step 1: the loss is nan",),
            post=_nothing_saved,
            **rw,
        ),
        Case(
            "non-finite/convert-a-nan-checkpoint",
            lambda c: ["checkpoint-convert", str(c.runs / "good"), str(c.p("export"))],
            setup=_nan_checkpoint,
            keywords=("checkpoint 3", "non-finite", "--step"),
            post=_no_export,
            needs=("store",),
            timeout=120,
        ),
        Case(
            "non-finite/convert-a-nan-checkpoint-when-asked",
            lambda c: [
                "checkpoint-convert",
                str(c.runs / "good"),
                str(c.p("export")),
                "--allow-non-finite",
            ],
            setup=_nan_checkpoint,
            expect=(0,),
            needs=("store",),
            timeout=120,
        ),
        Case(
            "non-finite/convert-the-step-before",
            lambda c: [
                "checkpoint-convert",
                str(c.runs / "good"),
                str(c.p("export")),
                "--step",
                "2",
            ],
            setup=_nan_checkpoint,
            expect=(0,),
            needs=("store",),
            timeout=120,
        ),
    ]


def _good_store(c: Ctx) -> None:
    _copy_store(c)
    c.state["store"] = snap(c.runs)


def _store_unchanged(c: Ctx, run: Run) -> list[str]:
    d = diff(c.state["store"], snap(c.runs))
    return [f"a refused command changed the store: {d}"] if d else []


def _nan_status(c: Ctx) -> None:
    _copy_store(c)
    st = json.loads((c.runs / "dmg" / "status.json").read_text())
    text = json.dumps(st).replace('"step": 2', '"step": NaN')
    write(c.runs / "dmg" / "status.json", text)


def spec_cases() -> list[Case]:
    """#47 point 2: every spec, status and manifest rlctl writes it reads back."""
    out = []
    for slug, n in (
        ("huge", "99999999999999999999"),
        ("over-max", "10000001"),
        ("negative", "-5"),
        ("not-more", "2"),
    ):
        out.append(
            Case(
                f"spec-roundtrip/resume-steps-{slug}",
                lambda c, n=n: ["resume", "good", "--runs-dir", str(c.runs), "--steps", n],
                setup=_good_store,
                keywords=("--steps",),
                post=_store_unchanged,
                needs=("store",),
                timeout=TRAIN_TIMEOUT,
            )
        )
    out += [
        Case(
            "spec-roundtrip/train-steps-huge",
            lambda c: c.train(steps="99999999999999999999"),
            keywords=("training.steps",),
            train=True,
            needs=("model",),
        ),
        Case(
            "spec-roundtrip/status-nan-step-is-shown-damaged",
            lambda c: ["status", "dmg", "--runs-dir", str(c.runs)],
            setup=_nan_status,
            expect=(0,),
            ok_keywords=("damaged", "NaN"),
            needs=("store",),
        ),
        Case(
            "spec-roundtrip/status-nan-step-resumes",
            lambda c: ["resume", "dmg", "--runs-dir", str(c.runs)],
            setup=_nan_status,
            expect=(0,),
            post=lambda c, run: check_completed(c.runs / "dmg", 3),
            needs=("store",),
            timeout=TRAIN_TIMEOUT,
        ),
        Case(
            "spec-roundtrip/resume-steps-then-resume-again",
            runner=_extend_twice,
            needs=("store",),
            timeout=2 * TRAIN_TIMEOUT,
        ),
    ]
    return out


def _extend_twice(c: Ctx, o: Outcome) -> None:
    """resume --steps writes spec.yaml; a later plain resume reads it back."""
    _copy_store(c)
    run = c.run(["resume", "good", "--runs-dir", str(c.runs), "--steps", "3"], None, TRAIN_TIMEOUT)
    o.take(run)
    _judge_into(o, run, "resume --steps 3", (0,))
    (c.runs / "good" / "status.json").write_text(
        (c.runs / "good" / "status.json").read_text().replace('"completed"', '"interrupted"')
    )
    again = c.run(["resume", "good", "--runs-dir", str(c.runs)], None, TRAIN_TIMEOUT)
    _judge_into(o, again, "resume", (0,))
    o.lost += check_completed(c.runs / "good", 3)


def _first_save_disk(c: Ctx) -> None:
    size = sum(
        p.stat().st_size
        for p in (c.fx.store / "good" / "checkpoints" / "1").rglob("*")
        if p.is_file()
    )
    c.fx.mounts.tmpfs(c.runs, f"{2 * size // 1024 + 1}k")
    c.state["size"] = size


def _first_saved(c: Ctx, run: Run) -> list[str]:
    ck = c.runs / "fs" / "checkpoints" / "1"
    if not (ck / "_CHECKPOINT_METADATA").is_file():
        return [f"no first checkpoint on a disk of twice its size ({2 * c.state['size']} B)"]
    return []


def first_save_cases() -> list[Case]:
    """#47 point 3: the first save fits the disk it fits."""
    return [
        Case(
            "first-save/tmpfs-twice-the-checkpoint",
            lambda c: c.train(name="fs", steps="1"),
            setup=_first_save_disk,
            expect=(0,),
            post=_first_saved,
            skip=need_mount,
            needs=("store",),
            timeout=TRAIN_TIMEOUT,
        )
    ]


def _overstated(c: Ctx) -> None:
    _copy_store(c)
    st = json.loads((c.runs / "dmg" / "status.json").read_text())
    st.update(step=50)
    write(c.runs / "dmg" / "status.json", json.dumps(st))


def _odd_names(c: Ctx) -> None:
    _copy_store(c)
    ck = c.runs / "dmg" / "checkpoints"
    shutil.copytree(ck / "2", ck / "07")
    (ck / "\u00b2").mkdir()
    (ck / "9").mkdir()
    shutil.copytree(ck / "2", ck / "8")
    (ck / "8" / "_CHECKPOINT_METADATA").unlink()
    (ck / "8" / "rlctl-manifest.json").unlink(missing_ok=True)


def _json_field(key: str, want: Any) -> Callable[[Ctx, Run], list[str]]:
    def check(c: Ctx, run: Run) -> list[str]:
        got = read_json_text(run.out)
        value = got.get(key) if isinstance(got, dict) else None
        ok = want(value) if callable(want) else value == want
        return [] if ok else [f"status says {key}={value!r}"]

    return check


def _stale_aside(c: Ctx) -> None:
    _copy_store(c)
    d = c.runs / "dmg"
    for n in ("1", "2"):
        (d / "checkpoints" / n).rename(d / "checkpoints" / f"{n}.damaged")
    _running_dead(d)


def _stale_then_recover(c: Ctx, o: Outcome) -> None:
    _stale_aside(c)
    shown = c.run(["status", "dmg", "--runs-dir", str(c.runs), "-o", "json"])
    o.take(shown)
    _judge_into(o, shown, "status", (0,))
    info = read_json_text(shown.out)
    error = str(info.get("error")) if isinstance(info, dict) else ""
    if "damaged" not in error or "--recover" not in error:
        o.unclear.append(f"a stale run with its checkpoints set aside shows {error!r:.200}")
    refused = c.run(["resume", "dmg", "--runs-dir", str(c.runs)], None, TRAIN_TIMEOUT)
    _judge_into(o, refused, "resume", (4,), ("no intact checkpoint",))
    fixed = c.run(["resume", "dmg", "--runs-dir", str(c.runs), "--recover"], None, TRAIN_TIMEOUT)
    _judge_into(o, fixed, "resume --recover (the command status gave)", (0,))
    o.lost += check_completed(c.runs / "dmg", 3)


def _older_aside(c: Ctx) -> None:
    _copy_store(c)
    ck = c.runs / "dmg" / "checkpoints"
    (ck / "1").rename(ck / "1.damaged")
    c.state["store"] = snap(c.runs)


def store_truth_cases() -> list[Case]:
    """#47 point 4: the store's files are the truth."""
    st = ["status", "dmg", "-o", "json"]
    return [
        Case(
            "store-truth/status-json-overstates-step",
            lambda c: [*st, "--runs-dir", str(c.runs)],
            setup=_overstated,
            expect=(0,),
            check=_json_field("step", 2),
            needs=("store",),
        ),
        Case(
            "store-truth/resume-hint-from-the-files",
            lambda c: ["resume", "dmg", "--runs-dir", str(c.runs), "--steps", "2"],
            setup=_overstated,
            keywords=("--steps 3",),
            forbid=(r"--steps 51",),
            needs=("store",),
            timeout=TRAIN_TIMEOUT,
        ),
        Case(
            "store-truth/odd-step-names-status",
            lambda c: [*st, "--runs-dir", str(c.runs)],
            setup=_odd_names,
            expect=(0,),
            check=_json_field("latest_checkpoint", 2),
            needs=("store",),
        ),
        Case(
            "store-truth/odd-step-names-resume",
            lambda c: ["resume", "dmg", "--runs-dir", str(c.runs)],
            setup=_odd_names,
            expect=(0,),
            ok_keywords=("checkpoint 9 is incomplete",),
            post=lambda c, run: check_completed(c.runs / "dmg", 3),
            needs=("store",),
            timeout=TRAIN_TIMEOUT,
        ),
        Case(
            "store-truth/odd-step-names-convert",
            lambda c: ["checkpoint-convert", str(c.runs / "dmg"), str(c.p("export"))],
            setup=_odd_names,
            expect=(0,),
            needs=("store",),
            timeout=120,
        ),
        Case(
            "store-truth/odd-step-names-delete-plan",
            lambda c: ["delete", "run", "dmg", "--runs-dir", str(c.runs), "--dry-run"],
            setup=_odd_names,
            expect=(0,),
            needs=("store",),
        ),
        Case(
            "store-truth/stale-all-set-aside-then-recover",
            runner=_stale_then_recover,
            needs=("store",),
            timeout=3 * TRAIN_TIMEOUT,
        ),
        Case(
            "store-truth/recover-with-nothing-newer",
            lambda c: ["resume", "dmg", "--runs-dir", str(c.runs), "--recover"],
            setup=_older_aside,
            expect=(4,),
            keywords=("not newer than the intact checkpoint 2",),
            check=lambda c, run: (
                []
                if "resume without --recover" in run.err
                else ["the hint does not say that a plain resume continues"]
            ),
            post=_store_unchanged,
            needs=("store",),
            timeout=TRAIN_TIMEOUT,
        ),
    ]


ROWS = [{"question": f"What is {a} + 2?", "answer": a + 2} for a in range(8)]


def _msgs(*extra: Any) -> str:
    good = [
        {
            "messages": [
                {"role": "user", "content": f"{a} + 1?"},
                {"role": "assistant", "content": str(a + 1)},
            ]
        }
        for a in range(6)
    ]
    return _jsonl([*good, *({"messages": m} for m in extra)])


DATA_47: list[tuple[str, str, str, tuple]] = [
    # slug, file name, content, keywords
    (
        "long-line",
        "d.jsonl",
        _jsonl([*ROWS, {"question": "x" * 5_000_000, "answer": 3}]),
        ("d.jsonl:9", "has at least"),
    ),
    (
        "deep-jsonl",
        "d.jsonl",
        _jsonl(ROWS) + "[" * 100_000 + "]" * 100_000 + "\n",
        ("d.jsonl:9", "nested"),
    ),
    (
        "deep-json-value",
        "d.json",
        '[{"question": ' + "[" * 5000 + "]" * 5000 + ', "answer": 1}]',
        ("d.json", "nested"),
    ),
    (
        "csv-extra-field",
        "d.csv",
        "question,answer\nWhat is 1,000 + 2?,1002\n",
        ("d.csv:2", "3 fields"),
    ),
    ("csv-missing-field", "d.csv", "question,answer\na,1\nb\n", ("d.csv:3", "1 field")),
    (
        "csv-unclosed-quote",
        "d.csv",
        'question,answer\n"What is 1+1?,2\nb,4\n',
        ("d.csv:2", "never closed"),
    ),
    ("csv-quote-in-quoted", "d.csv", 'question,answer\n"What is "1+1"?",2\n', ("d.csv:2",)),
    (
        "json-unequal-columns",
        "d.json",
        '{"question": ["a", "b"], "answer": [1]}',
        ("unequal lengths",),
    ),
    ("chat-no-content", "d.jsonl", _msgs([{"role": "user"}]), ("d.jsonl:7", "'content'")),
    ("chat-bad-role", "d.jsonl", _msgs([{"role": "bot", "content": "hi"}]), ("'bot'",)),
    (
        "chat-content-number",
        "d.jsonl",
        _msgs([{"role": "user", "content": 5}]),
        ("content is a number",),
    ),
    ("chat-empty", "d.jsonl", _msgs([]), ("empty conversation",)),
    ("chat-one-message", "d.jsonl", _msgs({"role": "user", "content": "x"}), ("one message",)),
    (
        "chat-first-row-malformed",
        "d.jsonl",
        _jsonl([{"messages": [{"role": "user"}]}]),
        ("d.jsonl:1", "'content'"),
    ),
]


def _write_data(name: str, text: str) -> Callable[[Ctx], None]:
    return lambda c: write(c.p("data") / name, text) and None


def _hub_home(c: Ctx) -> None:
    from tests.fakes.hub_cache import write_gsm8k

    write_gsm8k(c.p("hf"), train=6, test=4)


def _hub_env(c: Ctx) -> dict[str, str | None]:
    return {"HF_HOME": str(c.p("hf")), "HF_HUB_OFFLINE": "1"}


def _damaged_ckpt(kind: str) -> Callable[[Ctx], None]:
    def setup(c: Ctx) -> None:
        _copy_store(c)
        ck = c.runs / "good" / "checkpoints"
        if kind == "aside":
            for n in ("1", "2"):
                (ck / n).rename(ck / f"{n}.damaged")
            return
        if kind == "no-metadata":
            (ck / "2" / "default" / "_METADATA").unlink()
            return
        if kind == "cut-no-manifest":  # every data file cut: no array of it reads
            (ck / "2" / "rlctl-manifest.json").unlink()
            for f in (ck / "2" / "default").rglob("d/*"):
                with f.open("r+b") as h:
                    h.truncate(min(1000, f.stat().st_size))
            return
        truncate_largest(ck / "2")

    return setup


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


GS_COMMANDS: list[tuple[str, list[str]]] = [
    ("status", ["status", "--runs-dir", "gs://runs-bucket-47/runs"]),
    ("status-run", ["status", "r", "--runs-dir", "gs://runs-bucket-47/runs"]),
    ("resume", ["resume", "r", "--runs-dir", "gs://runs-bucket-47/runs"]),
    ("logs", ["logs", "r", "--runs-dir", "gs://runs-bucket-47/runs"]),
    ("delete", ["delete", "run", "r", "--runs-dir", "gs://runs-bucket-47/runs", "--yes"]),
    ("convert", ["checkpoint-convert", "gs://runs-bucket-47/runs/r", "export"]),
]


def _within(secs: float) -> Callable[[Ctx, Run], list[str]]:
    return lambda c, run: [] if run.secs < secs else [f"took {run.secs:.1f} s, more than {secs}"]


def _silent_endpoint(argv: list[str]) -> Callable[[Ctx, Outcome], None]:
    def runner(c: Ctx, o: Outcome) -> None:
        with socket.socket() as silent:
            silent.bind(("127.0.0.1", 0))
            silent.listen(8)
            url = f"http://127.0.0.1:{silent.getsockname()[1]}"
            run = c.run(argv, {"STORAGE_EMULATOR_HOST": url})
        o.take(run)
        _judge_into(o, run, "silent endpoint", (7,), (url, "no answer in time"))
        o.unclear += _within(10)(c, run)

    return runner


def messages_cases() -> list[Case]:
    """#47 point 5: messages that tell the truth."""
    out = [
        Case(
            f"messages/data-{slug}",
            lambda c, name=name: c.train(override={"--data-path": str(c.p("data") / name)}),
            setup=_write_data(name, text),
            keywords=kws,
            train=True,
            needs=("model",),
            forbid=(r"max_prompt_tokens=\d{6,}",),
            timeout=120,
        )
        for slug, name, text, kws in DATA_47
    ]
    out += [
        Case(
            "messages/config-yaml-nested-deeply",
            lambda c: c.train(extra=["--config", str(c.p("deep.yaml"))]),
            setup=lambda c: (
                write(c.p("deep.yaml"), "a: " + "[" * 50_000 + "]" * 50_000 + "\n") and None
            ),
            keywords=("deep.yaml", "nested"),
            train=True,
            needs=("model",),
        ),
        Case(
            "messages/hub-offline-config-missing",
            lambda c: ["train", "grpo", "--dataset", "openai/gsm8k", "--runs-dir", str(c.runs)],
            setup=_hub_home,
            env=_hub_env,
            keywords=("main, socratic", "data.config"),
            train=True,
            timeout=120,
        ),
        Case(
            "messages/hub-offline-config-unknown",
            lambda c: [
                "train",
                "grpo",
                "--dataset",
                "openai/gsm8k",
                "--set",
                "data.config=nope",
                "--runs-dir",
                str(c.runs),
            ],
            setup=_hub_home,
            env=_hub_env,
            keywords=("nope", "main"),
            train=True,
            timeout=120,
        ),
    ]
    conv = [
        ("cut", ("checkpoint 2 is damaged", "--step")),
        ("cut-no-manifest", (("cannot be read", "cannot be opened"),)),
        ("no-metadata", ("checkpoint 2 is damaged", "_METADATA")),
        ("aside", ("no intact checkpoint", "--recover")),
    ]
    out += [
        Case(
            f"messages/convert-damaged-{kind}",
            lambda c: ["checkpoint-convert", str(c.runs / "good"), str(c.p("export"))],
            setup=_damaged_ckpt(kind),
            keywords=kws,
            forbid=(r"train it",),
            post=_no_export,
            needs=("store",),
            timeout=120,
        )
        for kind, kws in conv
    ]
    for slug, argv in GS_COMMANDS:
        out += [
            Case(
                f"messages/gs-closed-endpoint-{slug}",
                lambda c, a=argv: a,
                env=lambda c: {
                    "STORAGE_EMULATOR_HOST": c.state.setdefault(
                        "url", f"http://127.0.0.1:{_closed_port()}"
                    )
                },
                expect=(7,),
                keywords=("cannot reach Cloud Storage at http://127.0.0.1:", "connection refused"),
                check=_within(10),
            ),
            Case(f"messages/gs-silent-endpoint-{slug}", runner=_silent_endpoint(argv)),
            Case(
                f"messages/gs-wrong-bucket-{slug}",
                lambda c, a=argv: [x.replace("runs-bucket-47", "no-such-bucket-47") for x in a],
                env=lambda c: {"STORAGE_EMULATOR_HOST": c.fx.gcs_url},
                expect=(3,),
                keywords=("bucket 'no-such-bucket-47' does not exist",),
                check=_within(10),
                needs=("gcs",),
            ),
        ]
    out.append(
        Case(
            "messages/gs-missing-run-hint-names-the-store",
            lambda c: ["delete", "run", "r", "--runs-dir", "gs://runs-bucket-47/runs", "--yes"],
            env=lambda c: {"STORAGE_EMULATOR_HOST": c.fx.gcs_url},
            expect=(3,),
            keywords=("rlctl status --runs-dir gs://runs-bucket-47/runs",),
            needs=("gcs",),
        )
    )
    return out


def _noisy_log(c: Ctx, run: Run) -> list[str]:
    log = c.runs / "noisy" / "train.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    return [] if "printed: scoring" in text else ["the reward's print is not in train.log"]


def _ro_home(c: Ctx) -> None:
    c.state["home"] = ro_dir(c, "home")


def _gold_exprs(c: Ctx) -> None:
    golds = ["x^2+1", "{1,2}", "sqrt(2)", "2^{10}", "\\frac{1}{2}", "a+b"]
    write(
        c.p("gold.jsonl"),
        _jsonl({"question": f"Q{i}?", "answer": g} for i, g in enumerate(golds * 2)),
    )


# the shell named on the command line (typer's switch for tests), not detected from the
# parent processes, which under a background harness are no shell
NAMED_SHELL = {"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}


def guest_cases() -> list[Case]:
    """#47 point 6: a reward is a guest."""
    rw = {"needs": ("model",), "timeout": TRAIN_TIMEOUT}
    return [
        Case(
            "reward-guest/prints-with-json-output",
            lambda c: [
                *c.train(name="noisy", steps="1", rewards='rewards=["./r.py:noisy"]'),
                "-o",
                "json",
            ],
            setup=_reward_file,
            expect=(0,),
            post=_noisy_log,
            **rw,
        ),
        Case("reward-guest/exits-at-step-2", runner=_bad_then_fixed("exit"), **rw),
        Case(
            "reward-guest/exits-on-its-trial",
            lambda c: c.train(rewards='rewards=["./r.py:exits_at_once"]'),
            setup=_reward_file,
            keywords=("exits_at_once", "sys.exit(0)"),
            train=True,
            **rw,
        ),
        Case(
            "reward-guest/gold-answers-are-expressions",
            lambda c: c.train(
                override={"--data-path": str(c.p("gold.jsonl"))}, extra=["--print-prompt"]
            ),
            setup=_gold_exprs,
            expect=(0,),
            needs=("model",),
        ),
        Case(
            "reward-guest/install-completion-read-only-home",
            lambda c: ["--install-completion", "bash"],
            setup=_ro_home,
            env=lambda c: {"HOME": str(c.p("home")), **NAMED_SHELL},
            expect=(1,),
            keywords=("cannot install shell completion", "Read-only"),
            skip=need_mount,
        ),
        Case(
            "reward-guest/install-completion-home-is-a-file",
            lambda c: ["--install-completion", "bash"],
            setup=lambda c: write(c.p("homefile"), "x") and None,
            env=lambda c: {"HOME": str(c.p("homefile")), **NAMED_SHELL},
            expect=(1,),
            keywords=("cannot install shell completion",),
        ),
    ]


FAMILIES: dict[str, Callable[[], list[Case]]] = {
    "names": names_cases,
    "hyperparams": hyper_cases,
    "config-files": config_cases,
    "data": data_cases,
    "model": model_cases,
    "rewards": rewards_cases,
    "runs-dir": runs_dir_cases,
    "store-damage": store_cases,
    "cloud-no-creds": cloud_cases,
    "concurrency": concurrency_cases,
    "signals": signals_cases,
    "status-width": width_cases,
    "non-finite": nonfinite_cases,
    "spec-roundtrip": spec_cases,
    "first-save": first_save_cases,
    "store-truth": store_truth_cases,
    "messages": messages_cases,
    "reward-guest": guest_cases,
}


def all_cases() -> list[Case]:
    cases = [c for build in FAMILIES.values() for c in build()]
    ids = [c.cid for c in cases]
    dup = {i for i in ids if ids.count(i) > 1}
    assert not dup, f"duplicate case ids: {dup}"
    return cases


def list_cases(cases: list[Case]) -> None:
    fx = Fixtures(Path("$T"), listing=True)
    for case in cases:
        c = Ctx(Path("$T") / "case", fx, random.Random(0))
        c.state["ro"] = Path("$T") / "case" / "ro"
        if case.runner:
            cmd = f"(custom: {case.runner.__qualname__.split('.')[0].strip('_')})"
        else:
            assert case.argv is not None
            env = _env_of(case, c)
            cmd = Run(case.argv(c), env, 0, "", "", 0).cmd()
        print(f"{case.cid:58} expect {'/'.join(map(str, case.expect)):7} {cmd}")
    print(f"{len(cases)} cases")


def _short(text: str, root: Path) -> str:
    return text.replace(str(root), "$T").replace(str(REPO), "$REPO")


def report(outcomes: list[Outcome], root: Path, secs: float, fx: Fixtures) -> None:
    fams: dict[str, list[Outcome]] = {}
    for o in outcomes:
        fams.setdefault(o.family, []).append(o)
    head = (
        f"{'family':16} {'cases':>5} {'tracebacks':>10} {'unclear':>7} {'lost/wrong':>10} "
        f"{'skipped':>7}"
    )
    print("\n" + head + "\n" + "-" * len(head))
    tot = [0, 0, 0, 0, 0]
    for fam, os_ in fams.items():
        row = [
            len(os_),
            sum(o.traceback for o in os_),
            sum(bool(o.unclear) for o in os_),
            sum(bool(o.lost) for o in os_),
            sum(o.skipped is not None for o in os_),
        ]
        tot = [a + b for a, b in zip(tot, row)]
        print(f"{fam:16} {row[0]:5} {row[1]:10} {row[2]:7} {row[3]:10} {row[4]:7}")
    print("-" * len(head))
    print(
        f"{'TOTAL':16} {tot[0]:5} {tot[1]:10} {tot[2]:7} {tot[3]:10} {tot[4]:7}"
        f"   ({secs / 60:.1f} min"
        + (f"; one tiny 2-step train: {fx.train_secs:.1f} s)" if fx.train_secs else ")")
    )
    for what, why in fx.errors.items():
        print(f"FIXTURE {what}: {why}")
    bad = [o for o in outcomes if o.bad]
    if bad:
        print(f"\n{len(bad)} case(s) with a traceback, an unclear error or lost/wrong data:\n")
    for o in bad:
        tags = ",".join(
            t
            for t, on in (
                ("traceback", o.traceback),
                ("unclear", bool(o.unclear)),
                ("lost", bool(o.lost)),
            )
            if on
        )
        print(f"[{tags}] {o.cid}   exit {o.rc} (expected {o.expected or '-'})  {o.secs:.1f}s")
        print(f"    $ {_short(o.cmd, root)}")
        for w in o.lost:
            print(f"    lost/wrong: {_short(w, root)}")
        for w in o.unclear:
            print(f"    unclear: {_short(w, root)}")
        if o.note:
            print(f"    note: {_short(o.note.splitlines()[0], root)}")
        print(f"    stderr first: {_short(o.err_first, root)}")
        if o.err_error and o.err_error not in (o.err_first, o.err_last):
            print(f"    stderr error: {_short(o.err_error, root)}")
        if o.err_last != o.err_first:
            print(f"    stderr last:  {_short(o.err_last, root)}")
    skipped = [o for o in outcomes if o.skipped]
    if skipped:
        print(
            "\nskipped: " + "; ".join(f"{o.cid} ({_short(o.skipped or '', root)})" for o in skipped)
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    ap.add_argument(
        "--family",
        choices=sorted(FAMILIES),
        action="append",
        help="run only this family (repeatable)",
    )
    ap.add_argument("--case", action="append", help="run only cases whose id contains this")
    ap.add_argument("--json", metavar="PATH", help="write every result as JSON")
    ap.add_argument("--seed", type=int, default=0, help="seed of the signal moments")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folders")
    args = ap.parse_args(argv)

    cases = all_cases()
    if args.family:
        cases = [c for c in cases if c.family in args.family]
    if args.case:
        cases = [c for c in cases if any(s in c.cid for s in args.case)]
    if args.list:
        list_cases(cases)
        return 0
    if not cases:
        print("no cases selected", file=sys.stderr)
        return 2

    # A shell's background job inherits SIGINT ignored, and so would every rlctl we
    # start: catch it here, so that exec gives the children the default again.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    root = Path(tempfile.mkdtemp(prefix="rlctl-fuzz-"))
    fx = Fixtures(root)
    fx.gcloud.mkdir(parents=True)
    t0 = time.monotonic()
    outcomes: list[Outcome] = []
    print(f"rlctl fuzz: {len(cases)} cases, {RLCTL}, temp {root}", flush=True)
    try:
        for i, case in enumerate(cases, 1):
            o = run_case(case, fx, root, args.seed, args.keep)
            outcomes.append(o)
            mark = (
                "SKIP"
                if o.skipped
                else "TB"
                if o.traceback
                else "LOST"
                if o.lost
                else "UNCLEAR"
                if o.unclear
                else "ok"
            )
            print(f"[{i:3}/{len(cases)}] {mark:7} {o.cid}  ({o.secs:.1f}s)", flush=True)
    except KeyboardInterrupt:
        print("interrupted: reporting the cases run so far", file=sys.stderr)
    finally:
        fx.mounts.release_under(root)
        fx.close()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    secs = time.monotonic() - t0
    report(outcomes, root, secs, fx)
    if args.json:
        data = {
            "seconds": round(secs, 1),
            "seed": args.seed,
            "rlctl": str(RLCTL),
            "tiny_train_seconds": fx.train_secs,
            "fixture_errors": fx.errors,
            "cases": [
                {
                    **o.__dict__,
                    "cmd": _short(o.cmd, root),
                    "unclear": [_short(x, root) for x in o.unclear],
                    "lost": [_short(x, root) for x in o.lost],
                }
                for o in outcomes
            ],
        }
        Path(args.json).write_text(json.dumps(data, indent=2, default=str) + "\n")
        print(f"\nresults written to {args.json}")
    tbs = sum(o.traceback for o in outcomes)
    lost = sum(bool(o.lost) for o in outcomes)
    return 0 if tbs == 0 and lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
