"""Rollouts produced ahead of the learner, by policy version, in a bounded buffer.

A generator thread produces each step's trajectory (sampled and scored) while the
learner updates on an earlier one. Which policy version samples step ``j`` is fixed,
not raced: ``version_for(j) = max(start, j - lag)``, ``lag`` being
``rollout.max_staleness``. So the generator waits for that version's weights, every
sample of step ``j`` is at most ``lag`` versions old when the learner takes it, and a
run is the same whichever half is faster (verl's one-step-off-policy trainer fixes
its lag the same way; NeMo-RL's ``max_trajectory_age_steps`` and PipelineRL let the
lag float and filter by age instead). With ``lag`` 0 it is the synchronous run.

Nothing is lost by a crash of this buffer: what it holds is a pure function of
(seed, step) and a checkpointed version, so ``resume`` re-makes it; what was in flight
is dropped and the steps after the restored one are sampled from the restored policy
(``start``).

Each ``take`` guards the bound anyway: a trajectory older than ``lag`` versions (one
a scheduling rule other than ``version_for`` let through) is dropped, counted and
produced again from the newest version. A generator that raises is restarted on the
same step (``retries`` times) without stopping the learner; a ``ConfigError`` (the
user's reward, a prompt too long) is not retried but raised in the learner, as the
synchronous run raises it.

No JAX here: ``produce`` is given (``generator.Generator`` holds the weights), so
the scheduling is tested on its own (tests/core/trainer/test_pipeline.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from rlctl.core.errors import ConfigError

T = TypeVar("T")
WAIT = 0.2  # seconds between looks at a closed pipeline while blocked


@dataclass(frozen=True)
class Produced(Generic[T]):
    """Step ``step``'s trajectory, sampled by policy ``version`` in ``seconds``."""

    step: int
    version: int
    item: T
    seconds: float


@dataclass
class Figures:
    """What a step's metrics say about the pipeline since the previous ``take``."""

    staleness: int  # versions between the policy that sampled and the learner's
    dropped: int  # trajectories dropped for age, the whole run so far
    restarts: int  # generator restarts, the whole run so far
    generator_busy: float  # fraction of the interval the generator was producing
    learner_busy: float  # fraction of the interval the learner was not waiting for it
    ahead: int  # trajectories ready beyond this one when it was taken


@dataclass
class _Failed:
    error: BaseException


@dataclass
class _Busy:
    """The generator's busy intervals, for the fraction of each learner interval
    (read and written under the pipeline's lock)."""

    spans: list[tuple[float, float]] = field(default_factory=list)
    since: float | None = None

    def within(self, a: float, b: float, now: float) -> float:
        spans = [*self.spans, (self.since, now)] if self.since is not None else self.spans
        total = sum(max(0.0, min(e, b) - max(s, a)) for s, e in spans)
        self.spans = [(s, e) for s, e in self.spans if e > a]  # older ones never count again
        return total


class Pipeline(Generic[T]):
    """Steps ``start`` .. ``stop - 1`` produced in order by a thread, at most
    ``depth`` ready ahead of the learner (backpressure), each from the policy version
    ``version_for`` gives it, once ``publish`` said that version exists."""

    def __init__(
        self,
        produce: Callable[[int, int], T],
        *,
        start: int,
        stop: int,
        lag: int,
        retries: int = 2,
        say: Callable[[str], None] = lambda line: None,
        version_for: Callable[[int], int] | None = None,
    ) -> None:
        self.produce = produce
        self.start, self.stop, self.lag = start, stop, lag
        self.depth = max(1, lag)
        self.retries = retries
        self.say = say
        self.version_for = version_for or (lambda j: max(start, j - lag))
        self.cond = threading.Condition()
        self.published = start - 1  # the newest version the generator may sample from
        self.ready: dict[int, Produced[T] | _Failed] = {}
        self.redo: list[int] = []  # steps dropped for age, to produce again first
        self.dropped = 0
        self.restarts = 0
        self.closed = False
        self.busy = _Busy()
        self.last_take = time.perf_counter()
        self.thread: threading.Thread | None = None

    # --- the learner's side --------------------------------------------------------
    def begin(self) -> None:
        self.last_take = time.perf_counter()
        self.thread = threading.Thread(target=self._run, name="rlctl-generator", daemon=True)
        self.thread.start()

    def publish(self, version: int) -> None:
        """Version ``version``'s weights are where the generator reads them."""
        with self.cond:
            self.published = max(self.published, version)
            self.cond.notify_all()

    def take(self, step: int) -> tuple[Produced[T], Figures]:
        """Step ``step``'s trajectory (blocking until it is ready), and the figures of
        the interval since the last take."""
        waited = 0.0
        while True:
            t0 = time.perf_counter()
            with self.cond:
                while step not in self.ready:
                    if self.thread is not None and not self.thread.is_alive():
                        raise RuntimeError("the generator stopped without a result")
                    self.cond.wait(WAIT)
                got: Produced[T] | _Failed | None = self.ready.pop(step)
                self.cond.notify_all()  # room in the buffer
                if isinstance(got, Produced) and step - got.version > self.lag:
                    self.dropped += 1
                    self.redo.append(step)
                    self.say(
                        f"step {step + 1}: a rollout of policy version {got.version} is "
                        f"more than {self.lag} behind; dropped and sampled again"
                    )
                    got = None
                ahead = len(self.ready)
            waited += time.perf_counter() - t0
            if got is None:
                continue
            if isinstance(got, _Failed):
                raise got.error
            now = time.perf_counter()
            interval = max(now - self.last_take, 1e-9)
            with self.cond:
                busy = self.busy.within(self.last_take, now, now)
            self.last_take = now
            return got, Figures(
                staleness=step - got.version,
                dropped=self.dropped,
                restarts=self.restarts,
                generator_busy=round(min(1.0, busy / interval), 3),
                learner_busy=round(max(0.0, 1 - waited / interval), 3),
                ahead=ahead,
            )

    def close(self) -> None:
        """Stop the generator (what it holds is dropped) and wait for its thread."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        if self.thread is not None:
            self.thread.join()

    # --- the generator's side ------------------------------------------------------
    def _next(self, todo: list[int]) -> tuple[int, int] | None:
        """The next step to produce and the version to produce it from, once there is
        room and that version is published; None once closed."""
        with self.cond:
            while True:
                if self.closed:
                    return None
                if self.redo:
                    step = self.redo.pop(0)
                    return step, self.published  # the newest: now within the bound
                if not todo:
                    return None
                step = todo[0]
                version = self.version_for(step)
                if len(self.ready) < self.depth and self.published >= version:
                    todo.pop(0)
                    return step, version
                self.cond.wait(WAIT)

    def _run(self) -> None:
        todo = list(range(self.start, self.stop))
        while (job := self._next(todo)) is not None:
            step, version = job
            result = self._attempt(step, version)
            with self.cond:
                self.ready[step] = result
                self.cond.notify_all()
            if isinstance(result, _Failed):
                return

    def _attempt(self, step: int, version: int) -> Produced[T] | _Failed:
        for attempt in range(self.retries + 1):
            t0 = time.perf_counter()
            with self.cond:
                self.busy.since = t0
            try:
                item = self.produce(step, version)
            except ConfigError as e:  # the user's to fix: as the synchronous run says it
                return _Failed(e)
            except BaseException as e:
                if attempt == self.retries or not isinstance(e, Exception):
                    return _Failed(e)
                self.restarts += 1
                self.say(
                    f"the generator failed on step {step + 1} ({type(e).__name__}: {e}); "
                    f"restarting it ({attempt + 1} of {self.retries})"
                )
                continue
            finally:
                end = time.perf_counter()
                with self.cond:
                    self.busy.spans.append((t0, end))
                    self.busy.since = None
            return Produced(step, version, item, end - t0)
        raise AssertionError("unreachable")
