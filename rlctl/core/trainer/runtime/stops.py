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
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

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
