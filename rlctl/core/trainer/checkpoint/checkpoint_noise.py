"""A failed checkpoint read kept to the one line that reports it.

Orbax's and TensorStore's reads of a damaged checkpoint leave noise behind long after
the restore failed and the fallback said so in one warning: unraisable exceptions from
read callbacks landing on a closed event loop, asyncio's "Task exception was never
retrieved" dumps, "coroutine ... was never awaited" warnings at exit. What is noise is
decided here, in one place, for the restore (``QuietRestore``) and for the run driver
(``restore_noise``, which ``runs/local.py`` installs for the rest of the process).
"""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Any


def _failed_read(exc: BaseException | None, tb: Any = None, text: str = "") -> bool:
    """Whether an exception (its traceback, its text, or the text it is reported
    with) comes from Orbax's or TensorStore's reads. Collected late, some come without
    a traceback ("Future exception was never retrieved"), so the text counts too:
    TensorStore's errors name their drivers ("Error opening \"zarr\" driver") or,
    reading a chunk past a cut file's end, only Orbax's OCDBT key-value store
    ("OUT_OF_RANGE: Error reading \"model.lm_head.w/0.0\" in OCDBT database at ...":
    a CI run in about ten met that one)."""
    tb = tb or getattr(exc, "__traceback__", None)
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if "/orbax/" in name or "/tensorstore/" in name:
            return True
        tb = tb.tb_next
    said = f"{text} {exc}"
    return (
        "/orbax/" in said
        or "TensorStore" in said
        or '" driver' in said
        or "in OCDBT database" in said
    )


def restore_noise(info: Any) -> bool:
    """An unraisable exception a failed Orbax restore leaves behind: one of
    TensorStore's read callbacks landing on the failed read's closed event loop, or
    one of Orbax's read coroutines (``_read_array_index_and_device_put``) raising
    its read error as it is garbage-collected unawaited ("Exception ignored in:
    <coroutine ...>", a 60-line TensorStore spec each, in whichever order the
    collector runs: why the same damage printed it in one test run in four)."""
    e = info.exc_value
    if isinstance(e, RuntimeError) and str(e) == "Event loop is closed":
        return True
    return _failed_read(e, info.exc_traceback, repr(getattr(info, "object", "")))


class _UnretrievedReads(logging.Filter):
    """Drop asyncio's "Task exception was never retrieved" dump (80 lines and a
    chained traceback each) for an Orbax read task of a restore that already failed
    and was reported in one line. Installed once, for the rest of the process: the
    tasks report when collected, often at exit."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "exception was never retrieved" not in str(record.msg) or not record.exc_info:
            return True
        _, exc, tb = record.exc_info
        return not _failed_read(exc, tb, record.getMessage())


_UNRETRIEVED = _UnretrievedReads()

# Orbax's read coroutines that a failed restore leaves unawaited: collected at exit,
# each printed "sys:1: RuntimeWarning: coroutine '_read_array_index_and_device_put'
# was never awaited" and a tracemalloc hint after the command's error and hint (a
# CI run in about ten, a checkpoint's largest data file cut in half).
_UNAWAITED_READS = (
    r"coroutine '(?:\w+\.)*_read_(?:shard|array_index_and_device_put"
    r"|and_create_array)' was never awaited"
)


class QuietRestore:
    """Keep a failed restore to the one warning line the fallback prints: without this
    each damaged checkpoint also printed its TensorStore reads' "Event loop is closed"
    tracebacks (unraisable exceptions), asyncio's "Task exception was never
    retrieved" dumps and, at exit, "coroutine ... was never awaited" warnings:
    hundreds of lines for the tiny test model, tens of thousands for a real one.
    Anything else still reaches the hook in place before."""

    def __init__(self) -> None:
        self.previous: Any = None

    def _hook(self, info: Any) -> None:
        if not restore_noise(info):
            self.previous(info)

    def install(self) -> None:
        logging.getLogger("asyncio").addFilter(_UNRETRIEVED)  # once: a set of filters
        # for the rest of the process too (they come at exit); Python keeps one copy
        warnings.filterwarnings("ignore", _UNAWAITED_READS, RuntimeWarning)
        if self.previous is None:
            self.previous, sys.unraisablehook = sys.unraisablehook, self._hook

    def remove(self) -> None:
        if self.previous is not None and sys.unraisablehook == self._hook:
            sys.unraisablehook = self.previous
        self.previous = None
