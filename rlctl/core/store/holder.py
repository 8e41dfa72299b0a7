"""Who holds a run's writer lock, and whether that is still the process it names.

A pid names a process only until it ends: the kernel then hands the number to the
next process that asks, so a killed trainer's pid may soon be a shell's (#57: a
status.json naming such a pid read as a live run). The lock's record therefore
keeps, beside the pid, the process's start time as the kernel counts it
(``/proc/PID/stat`` field 22, clock ticks since boot: what psutil's
``create_time`` is computed from), and the boot and pid namespace it was read in
(``machine``). A pid whose start time differs is another process; a record made on
another machine, or in another pid namespace, cannot be checked from here.

Where there is no ``/proc`` (macOS) there is no start time, and the pid is checked
alone; so it is for a record an rlctl before #57 wrote (pid, host, since).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
from pathlib import Path
from typing import Any


def machine() -> str:
    """This boot of this machine and this pid namespace (Linux), or "": a pid can be
    checked with kill(pid, 0) only from inside the same ones, and containers on one
    node (hostNetwork) share a host name but not their pids."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


def process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/PID/stat``
    field 22); None where the process is gone or there is no ``/proc``. The command
    name (field 2) may hold spaces and parentheses: the fields are counted from
    the last ``)``."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    try:
        return int(text[text.rindex(")") + 1 :].split()[19])
    except (ValueError, IndexError):
        return None


def this_process() -> dict[str, Any]:
    """This process as a lock's record names its holder."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "start": process_start(os.getpid()),
    }


def read_record(raw: bytes) -> dict[str, Any] | None:
    """A lock's record, or None when it is none (empty, garbage, not an object)."""
    try:
        data = json.loads(raw)
    except ValueError:  # UnicodeDecodeError is one
        return None
    return data if isinstance(data, dict) else None


def describe(record: dict[str, Any] | None) -> str:
    """``pid P on HOST since T``, or "another process" for a record that names none."""
    if record is None or not {"pid", "host", "since"} <= record.keys():
        return "another process"
    return f"pid {record['pid']} on {record['host']} since {record['since']}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, another user's
        return True
    return True


def _pid(record: dict[str, Any]) -> int | None:
    pid = record.get("pid")
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None


def not_its_holder(record: dict[str, Any] | None) -> str | None:
    """None when the process ``record`` names is alive and is that process, or it
    cannot be checked from here (another host or pid namespace); else why not, as
    "pid 4242 has ended" or "pid 4242 is another process now"."""
    pid = _pid(record) if record is not None else None
    if record is None or pid is None:
        return "the lock's record names no process"
    if record.get("host") != socket.gethostname():
        return None  # a shared file system: only the lock tells
    here, there = machine(), record.get("machine")
    if isinstance(there, str) and there and here and there != here:
        if there.split("/")[0] != here.split("/")[0]:
            return f"pid {pid} ran before this machine restarted"
        return None  # another pid namespace (a container): its pids are not ours
    start = process_start(pid)
    if start is None:  # gone, or no /proc: the pid alone
        return None if _alive(pid) else f"pid {pid} has ended"
    recorded = record.get("start")
    if isinstance(recorded, int) and recorded != start:
        return f"pid {pid} is another process now"
    return None  # the same start time, or an older rlctl's record that kept none
