"""A run's own log, ``train.log`` in its folder: what every attempt printed.

A local run has no pod to ask for its output once the terminal is closed, so the
run keeps it: the plain lines of ``log_lines`` (those a non-terminal stderr shows),
each with a UTC timestamp, every attempt (train, each resume) opened by a marker
line and closed by how it ended. ``rlctl logs RUN [-f]`` reads it back.

Each line is appended with one ``write`` on an ``O_APPEND`` descriptor, so a
reader never sees half a line except at the very end of a write in progress, and
a killed run loses at most the line it was writing. A ``gs://`` store's copy is
the staging file, uploaded at each phase, step and eval (not per line: an upload
per eval batch would cost more than the batch) and when the attempt ends.

The log never stops a run: a write that fails (a full disk) is said once on the
terminal and the log stops there; the run goes on, or fails on its own terms.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rlctl.core.errors import ConfigError, RlctlError
from rlctl.core.runs.log_lines import PlainLines
from rlctl.core.runs.status import run_phase
from rlctl.core.store.base import LOG, RunDir
from rlctl.core.store.local import LocalRunDir
from rlctl.core.trainer.api import parse_phase

Progress = Callable[[dict[str, Any]], None]
MARKER = "==== attempt"  # the first words of each attempt's first line


def _stamp() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class RunLog:
    """A progress callback that passes each event on and appends its plain lines to
    the run's log. Lines that come before the run's folder exists (``attach``) are
    held: a run refused before it is created leaves no file behind."""

    def __init__(self, command: str, downstream: Progress | None = None) -> None:
        # "train" | "resume" | "pod" (a cluster pod's trainer): named in the attempt's marker
        self.command = command
        self.downstream = downstream
        self.lines = PlainLines()
        self._held: list[str] = []
        self._run: RunDir | None = None
        self._path: Path | None = None
        self._broken = False
        self._started = _stamp()  # the marker's time: the attempt's, not the folder's
        self._mutex = threading.RLock()  # attach holds it while it appends

    def __call__(self, event: dict[str, Any]) -> None:
        if self.downstream is not None:
            self.downstream(event)  # the terminal first: a log write never delays it
        lines = self.lines.lines(event)
        in_progress = event.get("event") == "phase" and parse_phase(event).in_progress
        self._write(lines, upload=not in_progress)

    def attach(self, run: RunDir) -> None:
        """Start writing into ``run``: its marker line, then the held lines."""
        with self._mutex:
            try:
                run.pull(LOG)  # a gs:// store: continue the log of earlier attempts
                self._path = Path(run.path_for(LOG))
                self._run = run
                attempt = 1 + _count_markers(self._path)
            except (OSError, RlctlError) as e:
                self._stop(e)
                return
            what = (
                f"{run.name} in a cluster pod"
                if self.command == "pod"
                else f"rlctl {self.command} {run.name}"
            )
            marker = (
                f"{MARKER} {attempt}: {what} (pid {os.getpid()} on {socket.gethostname()}) ===="
            )
            held, self._held = self._held, []
            self._append(f"{self._started}  {marker}\n" + "".join(held), upload=True)

    def end(self, line: str) -> None:
        """The attempt's last line (completed, failed, interrupted), uploaded."""
        self._write([line], upload=True)

    def _write(self, lines: list[str], upload: bool) -> None:
        if not lines:
            return
        stamp = _stamp()  # each line stamped, a message of several lines too
        text = "".join(f"{stamp}  {part}\n" for x in lines for part in x.splitlines() or [""])
        with self._mutex:
            if self._run is None and not self._broken:
                self._held.append(text)
                return
            self._append(text, upload)

    def _append(self, text: str, upload: bool) -> None:
        with self._mutex:
            if self._broken or self._path is None or self._run is None:
                return
            try:
                if text:
                    fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                    try:
                        os.write(fd, text.encode("utf-8", errors="replace"))
                    finally:
                        os.close(fd)
                if upload:
                    self._run.push(LOG)  # a no-op for a local store
            except (OSError, RlctlError) as e:
                self._stop(e)

    def _stop(self, e: Exception) -> None:
        self._broken = True
        why = getattr(e, "strerror", None) or str(e)
        if self.downstream is not None:
            self.downstream(
                {
                    "event": "message",
                    "message": f"warning: the run's {LOG} cannot be written ({why}); "
                    "it stops here, the run goes on",
                }
            )


def _count_markers(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(1 for line in f if MARKER.encode() in line[:40])
    except FileNotFoundError:
        return 0


# --- reading it back: rlctl logs ----------------------------------------------------
def read_log(run: RunDir, log: str = LOG) -> str | None:
    """The log's text (undecodable bytes as U+FFFD), or None when the run has none:
    a run trained before rlctl kept logs. ``log``: train.log, or the generator's
    (``rlctl logs --generator``)."""
    if isinstance(run, LocalRunDir):
        p = run.path / log
        try:
            return p.read_bytes().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            raise ConfigError(
                f"{p} is a folder where the run keeps its log", hint="move it aside"
            ) from None
        except OSError as e:
            raise ConfigError(f"cannot read {p} ({e.strerror or e})") from e
    if not run.exists(log):
        return None
    try:
        return run.read_text(log)
    except UnicodeDecodeError as e:
        return bytes(e.object).decode("utf-8", errors="replace")


def tail_lines(text: str, n: int) -> list[str]:
    return text.splitlines()[-n:] if n > 0 else []


def follow_log(
    run: RunDir,
    tail: int,
    interval: float,
    sleep: Callable[[float], None] | None = None,
    log: str = LOG,
) -> Iterator[str]:
    """The last ``tail`` lines, then each new line as it is written, until the run
    is no longer active (finished, failed, interrupted, or its process gone). The
    phase is read before the file each round, so the lines written before the end
    are all shown."""
    shown = 0  # characters of the text already shown (whole lines only)
    first = True
    # A run that has ended but whose writer lock is held is starting again: a resume
    # takes the lock before it marks the run active (#53: 'logs -f' started as a resume
    # started ended at once, on the old 'interrupted'). Followed until it is active,
    # then as any run; or until the lock is let go without that.
    starting = not run_phase(run).active and _being_written(run)
    while True:
        active = run_phase(run).active
        if starting and (active or not _being_written(run)):
            starting = False
        ended = not active and not starting
        text = read_log(run, log) or ""
        if len(text) < shown:  # the file was replaced by a shorter one: start over
            shown = 0
        cut = len(text) if ended else text.rfind("\n", shown) + 1  # whole lines only
        new = text[shown:cut] if cut > shown else ""
        shown = max(shown, cut)
        lines = new.splitlines()
        yield from (lines[-tail:] if first and tail else lines)
        first = False
        if ended:
            return
        (sleep or time.sleep)(interval)


def _being_written(run: RunDir) -> bool:
    """Whether a process holds the run's writer lock now (a store that cannot tell:
    no)."""
    try:
        return run.lock_state().held is True
    except (OSError, AttributeError):
        return False
