"""What a step may use, and running out of memory as one line.

The update is compiled ahead of time, so XLA's own memory analysis says what it
will ask for before it runs: a batch too big for the device is split into
micro-batches (``step.Update``) or refused with what to lower, instead of dying
in the allocator with a page of its dump.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
from dataclasses import dataclass
from typing import Any

from rlctl.core.errors import ConfigError, OutOfMemoryError
from rlctl.core.units import human_bytes, parse_bytes

LIMIT_ENV = "RLCTL_MEMORY_LIMIT"  # e.g. 8GB: what the update may use, whatever is free
HEADROOM = 0.85  # of what is free: the allocator's slack
# of that, the update's share; the rest holds the rollout's KV cache and the
# sampler's buffers, which are not allocated yet when the update is sized
UPDATE_SHARE = 0.5
# on the CPU the update may use as much as the state it updates, and at least this
# much: a small model's batch is not cut into micro-batches for a few megabytes
HOST_FLOOR = 2**30


@dataclass(frozen=True)
class DeviceMemory:
    free: int  # bytes a step may use: free memory less HEADROOM, or RLCTL_MEMORY_LIMIT
    total: int
    where: str  # "this machine", "the NVIDIA H100 80GB HBM3", ...
    limited: bool  # set by RLCTL_MEMORY_LIMIT
    host: bool = False  # the machine's RAM (CPU backend), shared with everything else


def device_memory() -> DeviceMemory:
    """The first device's memory, or the limit ``RLCTL_MEMORY_LIMIT`` sets."""
    import jax

    env = os.environ.get(LIMIT_ENV, "").strip()
    if env:
        try:
            limit = parse_bytes(env)
        except ValueError as e:
            raise ConfigError(
                f"{LIMIT_ENV}: {e}", hint=f"unset {LIMIT_ENV} or write e.g. 8GB"
            ) from e
        return DeviceMemory(limit, limit, LIMIT_ENV, limited=True)
    dev = jax.local_devices()[0]
    stats = dev.memory_stats() if dev.platform != "cpu" else None
    if stats and stats.get("bytes_limit"):
        total = int(stats["bytes_limit"])
        free = total - int(stats.get("bytes_in_use", 0))
        return DeviceMemory(int(free * HEADROOM), total, f"the {dev.device_kind}", False)
    return DeviceMemory(
        int(_available_ram() * HEADROOM), _total_ram(), "this machine", False, host=True
    )


def update_budget(state_bytes: int = 0) -> tuple[int, str]:
    """Bytes the update may allocate, and what that is: ``RLCTL_MEMORY_LIMIT``, or
    ``UPDATE_SHARE`` of the free memory, and on the CPU at most ``state_bytes``.

    On the CPU the update's working memory is held to the size of the state it
    updates (weights and optimizer moments, at least ``HOST_FLOOR``) and to what is
    free, so a run's peak stays near twice that state, not four times: RAM is shared
    with everything else on the machine, and measured on 2 cores, micro-batches of 4
    sequences ran the default update within 10% of the whole batch's time. The
    rollout's buffers are freed by the time the update runs, so it may use all that
    is free. An accelerator's memory is the run's alone, where larger micro-batches
    are faster: there the cap is half the free memory (the KV cache needs the rest).
    """
    m = device_memory()
    if m.limited:
        return m.free, f"allowed by {LIMIT_ENV}"
    if m.host and state_bytes:
        cap = max(state_bytes, HOST_FLOOR)
        if cap <= m.free:
            return cap, (
                f"the update may use on {m.where} (as much as the weights and "
                f"optimizer state it updates)"
            )
        return m.free, f"the update may use (what is free on {m.where})"
    return int(m.free * UPDATE_SHARE), f"the update may use (half of what is free on {m.where})"


class DevicePeak:
    """The device allocator's peak so far, read from JAX's statistics
    (``peak_bytes_in_use``, what TRL reports as torch's ``max_memory_allocated``).

    None on a CPU, whose client keeps no such count. Read during the run, after each
    step: a bench's probe at the process's exit read 0 on an H200 (docs/gpu.md), so the
    largest ``bytes_in_use`` seen counts as well, and the figure never falls."""

    def __init__(self) -> None:
        self.peak: int | None = None

    def read(self) -> int | None:
        import jax

        dev = jax.local_devices()[0]
        if dev.platform == "cpu":
            return None
        try:
            stats = dev.memory_stats() or {}
        except Exception:  # a backend without statistics
            return self.peak
        now = max(int(stats.get("peak_bytes_in_use", 0)), int(stats.get("bytes_in_use", 0)))
        if now:
            self.peak = max(self.peak or 0, now)
        return self.peak


def _total_ram() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _available_ram() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def compiled_need(compiled: Any) -> int:
    """Bytes a compiled program allocates beyond its (donated) inputs: temporaries
    plus outputs that do not reuse an input buffer."""
    ma = compiled.memory_analysis()
    if ma is None:
        return 0
    return int(ma.temp_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes)


_REFUSED = re.compile(r"required for HLO temporaries \(([0-9.]+)([KMGT])\)")


def refused_need(e: BaseException) -> int | None:
    """What a compiler that refused a program for its memory said it needs (a TPU's:
    "the total memory required for HLO temporaries (20.78G) exceeds available HBM
    (15.75G)", libtpu 0.0.42), in bytes; None if it did not say."""
    m = _REFUSED.search(str(e))
    if not m:
        return None
    return int(float(m.group(1)) * 2 ** (10 * "KMGT".index(m.group(2)) + 10))


def predicted_need(size: int, need: int, smaller: int, grad_bytes: int) -> int:
    """What the update in micro-batches of ``smaller`` sequences should need, from
    ``need`` measured at ``size``: activations scale with the sequences, and cutting
    the batch adds an accumulator the size of the gradients. A guess to skip
    compiles that cannot fit; the compiled program's own analysis decides."""
    per_row = max(0, need - grad_bytes) / size
    return int(2 * grad_bytes + per_row * smaller)


def too_big(need: int, have: int, where: str, what: str, hint: str) -> OutOfMemoryError:
    return OutOfMemoryError(
        f"{what} needs {human_bytes(need)}, more than the {human_bytes(have)} {where}", hint=hint
    )


_ASKED = re.compile(r"(?:allocate|allocating)\s+([0-9.]+)\s*([KMGT]?i?B|bytes)", re.I)


def is_oom(e: BaseException) -> bool:
    text = str(e)
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or isinstance(e, MemoryError)


def from_runtime(e: BaseException, what: str, hint: str) -> OutOfMemoryError:
    """An allocator failure (XLA's RESOURCE_EXHAUSTED) as one line: what was asked
    for, what the device has, what to lower."""
    m = _ASKED.search(str(e))
    asked = f" (asked for {m.group(1)} {m.group(2)})" if m else ""
    mem = device_memory()
    has = f"allowed by {LIMIT_ENV}" if mem.limited else f"in all on {mem.where}"
    return OutOfMemoryError(
        f"out of memory in {what}{asked}; {human_bytes(mem.total)} {has}", hint=hint
    )


@functools.cache
def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc; other C libraries have none
    except (AttributeError, OSError):
        return None


def return_freed_memory() -> None:
    """Hand the freed pages of the C heap back to the operating system.

    XLA:CPU's buffers come from malloc, and glibc keeps what is freed in its heap for
    reuse. Between the rollout and the update, whose buffers have different sizes,
    that kept memory is not reused and counts in the process's resident memory:
    measured on the default run, 1.9 GB after the first update's compilation and
    0.2 GB after each rollout. ``malloc_trim`` costs milliseconds.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
