"""Stop signals (Ctrl-C, SIGTERM) while a run trains: a stop costs at most one step.

Raised at once, a KeyboardInterrupt in the middle of a step or a save loses every
step since the last checkpoint (Ctrl-C at step 8 with checkpoints every 5 lost 6-8).
So inside a step (``deferred()``) the first signal is only recorded: the loop checks
for it at safe points (after the rollout, before the update touches the model; after
the step), checkpoints the last completed step and stops. A second signal raises at
once, skipping that save: a user who presses Ctrl-C twice wants out now.

Outside a step (loading the model, evaluating) there is nothing to save, and the
first signal raises at once, as before. The state is the process's, as signal
handlers are; ``on_signal`` is installed by the run driver (``runs/local.py``).

A stop is acknowledged at once (``acknowledged``), not at the safe point: Python runs
``on_signal`` only when the main thread next runs Python, which inside a compiled step
can be a minute away, and a user who sees nothing presses Ctrl-C again, which skips
the save (#53).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator

_received: list[int] = []  # stop signals since reset()
_depth = 0  # > 0: inside deferred(); the first signal waits for a safe point
_installed = False  # on_signal is the process's handler (set by the run driver)


class StopRequested(KeyboardInterrupt):
    """A stop taken at a safe point: ``step`` steps done, ``saved`` the checkpoint
    written on the way out (None: none was needed or none could be)."""

    def __init__(self, step: int, saved: int | None) -> None:
        super().__init__(f"stopped after step {step}")
        self.step = step
        self.saved = saved


class Abandoned(Exception):
    """The step in progress is dropped before it changed the model (internal: the
    loop turns it into a StopRequested for the previous step)."""


def on_signal(signum: int, frame: object) -> None:
    """The SIGINT/SIGTERM handler: record; raise now unless a step defers it."""
    _received.append(signum)
    if len(_received) > 1 or _depth == 0:
        raise KeyboardInterrupt


def installed(value: bool) -> None:
    global _installed
    _installed = value


def is_installed() -> bool:
    return _installed


def reset() -> None:
    _received.clear()


def received() -> list[int]:
    """The stop signals this process received since the run started."""
    return list(_received)


def requested() -> bool:
    """A first stop signal is waiting for a safe point."""
    return bool(_received)


def deferring() -> bool:
    return _depth > 0


@contextlib.contextmanager
def deferred(enabled: bool = True) -> Iterator[None]:
    """The first stop signal inside the block waits for the caller's safe point
    (``requested()``); with no caller left to take it (the outermost block ends
    normally), it is delivered then as a KeyboardInterrupt. ``enabled=False``: no
    deferral (a multi-process run, whose processes would have to agree on it)."""
    global _depth
    if not (enabled and _installed):
        yield
        return
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
    if _depth == 0 and _received:
        raise KeyboardInterrupt


ACK_IN_STEP = "stopping after this step; Ctrl-C again to stop without saving"
ACK_AGAIN = "stopping now, without saving the step in progress"


@contextlib.contextmanager
def acknowledged(say: Callable[[str], None]) -> Iterator[None]:
    """Within the block, ``say`` what a stop signal will do the moment it arrives.

    ``signal.set_wakeup_fd`` has the interpreter's C-level handler write each signal's
    number to a pipe as it lands, whatever the main thread is doing; a thread reading
    the pipe says it. A no-op outside the main thread (signals go to the main thread's
    handlers only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    r, w = os.pipe()
    os.set_blocking(w, False)  # the C handler must never block on a full pipe
    try:
        previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (ValueError, OSError):  # not possible here: no acknowledgement, as before
        os.close(r)
        os.close(w)
        yield
        return

    def watch() -> None:
        seen = 0
        while True:
            try:
                data = os.read(r, 64)
            except OSError:
                return
            if not data:  # the block ended: the write end is closed
                return
            for signum in data:
                if signum not in (signal.SIGINT, signal.SIGTERM):
                    continue
                seen += 1
                if seen == 1 and _depth > 0:
                    say(ACK_IN_STEP)
                elif seen == 2 and _depth > 0:
                    say(ACK_AGAIN)

    thread = threading.Thread(target=watch, name="rlctl-stop-ack", daemon=True)
    thread.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous)
        os.close(w)
        thread.join(timeout=1.0)
        if not thread.is_alive():
            os.close(r)
