"""The learner's handle on a generator in a process of its own (``rollout.placement=process``).

On the learner's machine the learner starts it (``python -m
rlctl.core.trainer.run.generate``); on a cluster it runs in pods of its own (the
workload's generator group, ``RLCTL_GENERATOR=pods`` in the learner's pods) and the
learner only waits for it. Either way the learner writes each policy version's weights
and each step's request through the run store (``exchange.Exchange``), and waits for
the trajectory. A generator process that exits (killed, out of memory) is started
again by the next request, which the pipeline retries (``run/pipeline.py``); a
generator pod is started again by its Job. The learner does not stop, and since the
request names the version and the seed is the step's, the trajectory is the one the
dead process would have made.

A local generator's output goes to the run's ``generator.log``; a pod's to its own
log and the run store's ``generator.log`` (``rlctl logs`` shows both).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from rlctl.core.errors import ConfigError
from rlctl.core.store.base import GENERATOR_LOG, RunDir
from rlctl.core.trainer.rollout.exchange import Exchange, Trajectory, flat_state
from rlctl.core.trainer.rollout.generator import Push

GENERATOR_ENV = "RLCTL_GENERATOR"  # "pods": the workload runs the generator, not the learner
WAITING_SAY = 60.0  # seconds between lines saying the learner waits for its generator pods


class GeneratorProcess:
    """Starts, feeds and restarts the generator process of one run."""

    def __init__(
        self, run: RunDir, root: str, lag: int, say: Any = None, pods: bool | None = None
    ) -> None:
        self.run = run
        self.root = root  # the run store's root, as the generator opens it
        self.lag = lag
        self.say = say or (lambda message: None)
        # the generator runs in pods of the workload's own (never started from here)
        self.pods = os.environ.get(GENERATOR_ENV) == "pods" if pods is None else pods
        self.exchange = Exchange(run)
        self.proc: subprocess.Popen[bytes] | None = None
        self.attempts = itertools.count()
        self.log = Path(run.staging_dir()) / GENERATOR_LOG
        self.id = uuid.uuid4().hex
        self.exchange.begin(self.id)

    def spawn(self) -> None:
        """The generator process, started (again)."""
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "rlctl.core.trainer.run.generate",
                    "--root",
                    self.root,
                    "--name",
                    self.run.name,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    def alive(self) -> bool:
        """Whether the generator can still answer: a pod's is restarted by its Job, so
        the learner waits for it (and says so every minute)."""
        return self.pods or (self.proc is not None and self.proc.poll() is None)

    def push(self, version: int, model: Any) -> Push:
        """Version ``version``'s weights where the generator reads them."""
        from flax import nnx

        t0 = time.perf_counter()
        size = self.exchange.put_weights(version, flat_state(nnx.state(model)))
        # older than any step still to be sampled (from version - lag on) or redone
        self.exchange.drop_weights(below=version - self.lag)
        return Push(version, size, time.perf_counter() - t0)

    def sample(self, step: int, version: int) -> Trajectory:
        """Step ``step`` sampled and scored by version ``version``, in the generator."""
        if not self.alive():
            self.spawn()
        attempt = next(self.attempts)
        self.exchange.request(step, version, attempt)
        asked = time.monotonic()
        said = asked
        while True:
            got, error = self.exchange.result(step, attempt)
            if got is not None:
                return got
            if error is not None:
                raise ConfigError(error["message"], hint=error.get("hint"))
            if not self.alive():
                assert self.proc is not None
                raise RuntimeError(
                    f"the generator process exited with code {self.proc.returncode} "
                    f"({self._last_line()}; its log: {self.log})"
                )
            if self.pods and time.monotonic() - said > WAITING_SAY:
                said = time.monotonic()
                self.say(
                    f"waiting {said - asked:.0f} s for the generator pods to sample step "
                    f"{step + 1} (its log: rlctl logs {self.run.name} --generator)"
                )
            time.sleep(self.exchange.poll)

    def close(self) -> None:
        """Tell it to stop, make sure it did, and remove what they exchanged (nothing
        of it is needed again: a resume starts a new attempt)."""
        self.exchange.stop(self.id)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # generator pods read the stop when they look next (its JobSet deletes them once
        # the learner is done, too): only the plan and the stop stay, a few bytes
        self.exchange.clear(keep=("plan.json", "stop") if self.pods else ())

    def _last_line(self) -> str:
        try:
            lines = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        return lines[-1][:200] if lines else "an empty log"
