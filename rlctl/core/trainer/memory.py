"""What a step may use, and running out of memory as one line.

The update is compiled ahead of time, so XLA's own memory analysis says what it
will ask for before it runs: a batch too big for the device is split into
micro-batches (``step.Update``) or refused with what to lower, instead of dying
in the allocator with a page of its dump.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class DeviceMemory:
    free: int  # bytes a step may use: free memory less HEADROOM, or RLCTL_MEMORY_LIMIT
    total: int
    where: str  # "this machine", "the NVIDIA H100 80GB HBM3", ...
    limited: bool  # set by RLCTL_MEMORY_LIMIT


def device_memory() -> DeviceMemory:
    """The first device's memory, or the limit ``RLCTL_MEMORY_LIMIT`` sets."""
    import jax

    env = os.environ.get(LIMIT_ENV, "").strip()
    if env:
        try:
            limit = parse_bytes(env)
        except ValueError as e:
            raise ConfigError(f"{LIMIT_ENV}: {e}", hint=f"unset {LIMIT_ENV} or write e.g. 8GB"
                              ) from e
        return DeviceMemory(limit, limit, LIMIT_ENV, limited=True)
    dev = jax.local_devices()[0]
    stats = dev.memory_stats() if dev.platform != "cpu" else None
    if stats and stats.get("bytes_limit"):
        total = int(stats["bytes_limit"])
        free = total - int(stats.get("bytes_in_use", 0))
        return DeviceMemory(int(free * HEADROOM), total, f"the {dev.device_kind}", False)
    return DeviceMemory(int(_available_ram() * HEADROOM), _total_ram(), "this machine", False)


def update_budget() -> tuple[int, str]:
    """Bytes the update may allocate, and what that is (``RLCTL_MEMORY_LIMIT``, or
    ``UPDATE_SHARE`` of the free memory)."""
    m = device_memory()
    if m.limited:
        return m.free, f"allowed by {LIMIT_ENV}"
    return int(m.free * UPDATE_SHARE), f"the update may use (half of what is free on {m.where})"


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


def too_big(need: int, have: int, where: str, what: str, hint: str) -> OutOfMemoryError:
    return OutOfMemoryError(
        f"{what} needs {human_bytes(need)}, more than the {human_bytes(have)} {where}",
        hint=hint)


_ASKED = re.compile(r"(?:allocate|allocating)\s+([0-9.]+)\s*([KMGT]?i?B|bytes)", re.I)


def is_oom(e: BaseException) -> bool:
    text = str(e)
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or isinstance(e, MemoryError)


def from_runtime(e: BaseException, what: str, hint: str) -> OutOfMemoryError:
    """An allocator failure (XLA's RESOURCE_EXHAUSTED) as one line: what was asked
    for, what the device has, what to lower."""
    m = _ASKED.search(str(e))
    asked = f" (asked for {m.group(1)} {m.group(2)})" if m else ""
    m = device_memory()
    has = f"allowed by {LIMIT_ENV}" if m.limited else f"in all on {m.where}"
    return OutOfMemoryError(
        f"out of memory in {what}{asked}; {human_bytes(m.total)} {has}", hint=hint)
