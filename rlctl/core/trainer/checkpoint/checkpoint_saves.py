"""The bookkeeping of saves: which one a thread is writing, which completed since the
run last asked, and the signals held while one is made.

At most one save is in flight (``SaveLedger.start``); the next save, a stop and the
end of the run wait for it (``wait``), and its failure is raised there, on the run's
thread. ``Checkpoints`` (checkpointing.py) does the writing; this only keeps count.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from rlctl.core.trainer.runtime.memory import return_freed_memory


@dataclass
class Saved:
    """One save: its step, the seconds it held the step up (the copy, or the whole
    save in the step) and the seconds its write took, in the background or not."""

    step: int
    held_s: float
    write_s: float = 0.0
    background: bool = False
    bytes: int | None = None  # the checkpoint's size on disk (its manifest's total)

    def record(self) -> dict[str, Any]:
        """status.json's ``last_save``: what ``status`` shows of it."""
        return {
            "step": self.step,
            "bytes": self.bytes,
            "seconds": round(self.write_s if self.background else self.held_s, 2),
            "background": self.background,
        }


@dataclass
class _Flight:
    """The save a thread is writing: its thread, what it reports, its failure."""

    thread: threading.Thread
    saved: Saved
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


class SaveLedger:
    """The save in flight (at most one) and the saves completed, not yet handed over."""

    def __init__(self) -> None:
        self._flight: _Flight | None = None
        self._finished: list[Saved] = []

    def done(self, saved: Saved) -> None:
        """A save made in the step (not in the background), complete."""
        self._finished.append(saved)

    def start(self, saved: Saved, write: Callable[[Any], int | None], copies: Any) -> None:
        """A thread that runs ``write(copies)`` (which returns the checkpoint's bytes
        on disk); ``saved`` is what it reports once complete."""
        flight = _Flight(
            threading.Thread(
                target=self._write,
                args=(saved, write, copies),
                daemon=True,
                name=f"rlctl-save-{saved.step}",
            ),
            saved,
        )
        self._flight = flight
        flight.thread.start()

    def _write(self, saved: Saved, write: Callable[[Any], int | None], copies: Any) -> None:
        """The thread of a background save: its failure is kept for ``wait``."""
        flight = self._flight
        assert flight is not None and flight.saved is saved
        t0 = time.perf_counter()
        try:
            saved.bytes = write(copies)
        except BaseException as e:  # raised on the run's thread by wait()
            flight.error = e
        finally:
            del copies  # the device copy's memory, as soon as it is written
            saved.write_s = time.perf_counter() - t0
            flight.done.set()
            return_freed_memory()

    def in_flight(self) -> int | None:
        """The step a background save is writing now, or None."""
        flight = self._flight
        return None if flight is None or flight.done.is_set() else flight.saved.step

    def wait(self) -> None:
        """Until the save in flight (if any) is complete. Its failure is raised here,
        on the run's thread."""
        flight, self._flight = self._flight, None
        if flight is None:
            return
        flight.thread.join()
        if flight.error is not None:
            raise flight.error
        self._finished.append(flight.saved)

    def finished(self) -> list[Saved]:
        """The saves completed since the last call (a background one once it is
        complete)."""
        flight = self._flight
        if flight is not None and flight.done.is_set():
            self.wait()
        out, self._finished = self._finished, []
        return out

    def settle(self, then: Callable[[bool], None]) -> None:
        """At close: join the save in flight without raising its failure (the run
        raised it already, or is failing for another reason, which stays the one
        reported), then ``then(idle)``: idle when nothing is left writing (a second
        stop signal can cut the join short; the thread then still owns Orbax's
        manager and its temporary folder)."""
        flight = self._flight
        try:
            if flight is not None:
                flight.thread.join()
        finally:
            self._flight = None
            then(flight is None or flight.done.is_set())


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM for the block, then deliver them to the handlers that
    were in place. An interrupt inside a save leaves Orbax's writer threads filling a
    temp folder after the folder was cleaned up; a save takes seconds, so the stop
    waits for it and the run stops at a safe point with one more complete checkpoint."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    wanted = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, frame: held.append(signum)) for s in wanted}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    for signum in dict.fromkeys(held):
        signal.raise_signal(signum)
