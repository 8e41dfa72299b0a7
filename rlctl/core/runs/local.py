"""Run the trainer on this machine: create or reopen a run, keep status.json true.

``status.json`` moves pending -> evaluating/running -> completed | failed |
interrupted, and always names the latest complete checkpoint, so ``rlctl status``
and ``rlctl resume`` can trust it even after a crash. One process writes a run at a
time (the store's lock); a SIGKILLed run's file still says "running", which
``rlctl status`` shows as ``stale`` (no live process holds the run's lock) and resume
accepts.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from rlctl.core.config.load import build
from rlctl.core.config.models import MAX_STEPS, RunSpec
from rlctl.core.errors import (
    ConfigError,
    ConflictError,
    InterruptedRun,
    RlctlError,
    require_extra,
)
from rlctl.core.names import generate_run_name
from rlctl.core.phases import Phase, StatusUpdate
from rlctl.core.runs.results import Resize, TrainResult
from rlctl.core.runs.run_log import RunLog
from rlctl.core.runs.spec import check_name_free, local_paths_absolute, write_new_run
from rlctl.core.runs.status import checked_metrics, read_status, steps_done
from rlctl.core.store import open_store
from rlctl.core.store.base import (
    SPEC,
    STATUS,
    RunDir,
    latest_checkpoint_step,
    set_aside_checkpoints,
)
from rlctl.core.store.local import LocalRunDir
from rlctl.core.store.records import read_spec, spec_text, status_text
from rlctl.core.trainer import api as trainer
from rlctl.core.trainer.api import Stage, stops
from rlctl.core.trainer.api import phase as phase_event  # 'phase' names a Phase here

Progress = Callable[[dict[str, Any]], None]


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _created(run: RunDir) -> str:
    """When the run's spec.yaml was written (its creation), or now if unknown (a
    gs:// store's staging copy does not keep the object's time)."""
    if not isinstance(run, LocalRunDir) or not (run.path / SPEC).exists():
        return _now()
    spec = run.path / SPEC
    mtime = dt.datetime.fromtimestamp(spec.stat().st_mtime, dt.timezone.utc)
    return mtime.isoformat(timespec="seconds")


class StatusFile:
    def __init__(self, run: RunDir, spec: RunSpec) -> None:
        self.run = run
        self.data = read_status(run) if run.exists(STATUS) else {}
        self.data.pop("damaged", None)  # rebuilt from here on
        # the step count the run was last started with: spec.yaml edited since shows
        recorded = self.data.get("total_steps")
        self.recorded_steps = recorded if isinstance(recorded, int) else None
        self.data.update(
            name=run.name,
            algorithm=spec.algorithm,
            total_steps=spec.training.steps,
            backend="local",
        )
        if not isinstance(self.data.get("created"), str):
            # a lost or damaged status.json: the run was created when its spec was written
            self.data["created"] = _created(run)
        self.data.setdefault("step", 0)
        # what the store holds, never a checkpoint that was set aside or lost since
        self.data["latest_checkpoint"] = latest_checkpoint_step(run)

    def update(self, change: StatusUpdate | None = None, **fields: Any) -> Resize | None:
        """Write the fields ``change`` gives (or ``fields``, checked as a
        ``StatusUpdate``) and ``updated``; the rest stay. Returns the resize this
        change records (``resized``), or None."""
        change = change if change is not None else StatusUpdate(**fields)
        now = _now()
        resize = resized(self.data, change, now)
        if resize is not None:
            history = self.data.get("resizes")
            kept = history if isinstance(history, list) else []
            change = StatusUpdate(
                **change.fields(), resizes=[*kept, resize.model_dump(mode="json")]
            )
        self.data.update(change.fields(), updated=now)
        self.run.write_text(STATUS, status_text(self.data))  # checked by its reader
        return resize


def resized(before: dict[str, Any], change: StatusUpdate, at: str) -> Resize | None:
    """The resize ``change`` makes, or None: an attempt that starts on another count
    of hosts or devices than the last one ran on. An elastic Ray job that gained or
    lost hosts restarts its workers on the new count, and each resumes from the last
    checkpoint; status.json keeps every such change (``resizes``), so ``status``
    shows when the run grew or shrank, and from which step."""
    if change.processes is None or change.devices is None:
        return None
    hosts, devices = before.get("processes"), before.get("devices")
    if not isinstance(hosts, int) or not isinstance(devices, int):
        return None  # the run's first attempt, or a status.json that lost them
    if (hosts, devices) == (change.processes, change.devices):
        return None
    step = change.step if change.step is not None else _int_or_zero(before.get("step"))
    return Resize(
        step=step, hosts=(hosts, change.processes), devices=(devices, change.devices), at=at
    )


def _int_or_zero(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def train_local(spec: RunSpec, progress: Progress | None = None) -> TrainResult:
    """Start a new run. The name must be free: reusing one is what ``resume`` is for.

    Its progress goes to ``progress`` and to the run's ``train.log``; the first event
    comes before any heavy import, so a terminal shows a line within a second."""
    require_extra("tunix", "train")
    name = spec.name or generate_run_name(spec.algorithm)
    log = RunLog("train", progress)
    spec = local_paths_absolute(spec.model_copy(update={"name": name}))
    store = open_store(spec.output.root)
    check_name_free(store, name)  # a taken name is refused before any line says "run"
    # what follows can still refuse the run (its data, model, rewards): the first line
    # says it is being prepared, not that it started
    log(phase_event(Stage.STARTING, f"preparing run {name}"))
    trainer.preflight(spec, log)
    _quiet_closed_loops()
    # SIGTERM is Ctrl-C from the moment the run exists: a stop right after spec.yaml
    # is written leaves an 'interrupted' (or, SIGKILLed, 'stale') run, never 'pending'
    with _sigterm_as_interrupt():
        run = write_new_run(store, spec)
        with run.lock():  # one writer per run, for this process's whole life
            try:
                # a stop in here waits until status.json says pending and the log is
                # attached, then is recorded (one that landed in between left 'pending')
                with stops.deferred():
                    status = StatusFile(run, spec)
                    status.update(
                        StatusUpdate(
                            phase=Phase.PENDING, pid=os.getpid(), host=socket.gethostname()
                        )
                    )
                    log.attach(run)  # after status.json: 'logs -f' sees an active run
            except KeyboardInterrupt:
                _record_interrupt(run, StatusFile(run, spec), log)
            return _execute(spec, run, status, log)


def load_run_spec(run: RunDir) -> RunSpec:
    """The run's spec.yaml, through the one reader its writers also pass it through
    (``store/records.py``)."""
    where = f"{run.uri}/{SPEC}"
    try:
        text = run.read_text(SPEC)
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{where} is not valid YAML (not UTF-8 text)",
            hint="restore the run's spec.yaml (its settings)",
        ) from e
    return read_spec(text, where)


def resume_local(
    root: str,
    name: str,
    progress: Progress | None = None,
    recover: bool = False,
    steps: int | None = None,
    command: str = "resume",
) -> TrainResult:
    """Continue a run from its latest intact checkpoint. ``recover``: first bring back
    the checkpoints set aside as damaged whose data may be intact (see
    ``Checkpoints._recover``); a local run store only. ``steps``: train to that many
    steps in all (more than the run has done), a completed run included. ``command``:
    what the attempt's line in train.log says started it (a cluster pod: "pod")."""
    require_extra("tunix", "train")
    log = RunLog(command, progress)
    run = open_store(root).existing(name)
    local = isinstance(run, LocalRunDir)
    if recover and not local:
        raise ConfigError(
            "--recover is for a run store on this machine",
            hint="copy the run's folder here, recover it, then copy it back",
        )
    if steps is not None and not local:
        raise ConfigError(
            "--steps is for a run store on this machine", hint="resume it without --steps"
        )
    _quiet_closed_loops()
    with _sigterm_as_interrupt(), run.lock():  # before anything is read: one writer
        return _resume(run, log, recover, steps)


def _done(run: RunDir, status: StatusFile) -> int:
    """Steps the run has done, as its files hold them (``status.steps_done``: its
    latest complete checkpoint), never status.json's or a metrics row's word."""
    return steps_done(run)


def _steps_changed(
    run: RunDir, spec: RunSpec, status: StatusFile, steps: int | None, progress: Progress | None
) -> RunSpec:
    """The spec to resume with: ``--steps`` written into spec.yaml (atomically), and
    every change of ``training.steps`` (by --steps, or by editing spec.yaml) said
    once and recorded in status.json's ``steps_changes``; a step count below what
    the run has done is refused, never silently taken."""
    from rlctl.core.store.base import atomic_write

    done = _done(run, status)
    before = status.recorded_steps or spec.training.steps
    changes: list[dict[str, Any]] = []
    if before != spec.training.steps:
        changes.append({"from": before, "to": spec.training.steps, "by": SPEC, "at": _now()})
        if progress:
            progress(
                {
                    "event": "message",
                    "message": f"{SPEC} changed training.steps "
                    f"from {before} to {spec.training.steps}",
                }
            )
    if steps is not None:
        if steps <= done:
            raise ConfigError(
                f"--steps {steps} must be more than the {done} steps run {run.name!r} has done",
                hint=f"pass --steps {done + 1} or more",
            )
        if steps != spec.training.steps:
            changes.append(
                {"from": spec.training.steps, "to": steps, "by": "--steps", "at": _now()}
            )
            spec = _with_steps(spec, steps, done)  # bounded as 'train --steps' is
            assert isinstance(run, LocalRunDir)  # resume_local refuses --steps elsewhere
            atomic_write(run.path / SPEC, spec_text(spec, f"{run.uri}/{SPEC}"))
            if progress:
                progress(
                    {
                        "event": "message",
                        "message": f"training.steps {changes[-1]['from']}"
                        f" -> {steps} (written to {SPEC})",
                    }
                )
    elif spec.training.steps < done:
        raise ConfigError(
            f"{run.uri}/{SPEC} says training.steps {spec.training.steps}, "
            f"but run {run.name!r} has done {done} steps",
            hint=f"set training.steps back, or extend the run with "
            f"'rlctl resume {run.name} --steps N' (N > {done})",
        )
    if changes:
        history = status.data.get("steps_changes")
        status.update(
            StatusUpdate(
                steps_changes=[*(history if isinstance(history, list) else []), *changes],
                total_steps=spec.training.steps,
            )
        )
    return spec


def _with_steps(spec: RunSpec, steps: int, done: int) -> RunSpec:
    """``spec`` with ``training.steps`` set to ``steps``, validated as ``train
    --steps`` is (a ``model_copy`` is not: it wrote 10^20 into spec.yaml, #47)."""
    data = spec.model_dump(mode="json")
    data["training"]["steps"] = steps
    try:
        return build(RunSpec, data)
    except ConfigError as e:
        raise ConfigError(
            f"--steps {steps}: {e.message.removeprefix('invalid RunSpec: ')}",
            hint=f"pass --steps N with {done} < N <= {MAX_STEPS}; nothing was changed",
        ) from None


def _resume(
    run: RunDir, log: RunLog, recover: bool = False, steps: int | None = None
) -> TrainResult:
    name = run.name
    spec = load_run_spec(run)
    status = StatusFile(run, spec)
    phase = Phase.parse(status.data.get("phase"))
    # No pid check: this process holds the run's lock, so whatever status.json says
    # is active is not (a recorded pid may since belong to an unrelated process).
    if isinstance(run, LocalRunDir):
        spec = _steps_changed(run, spec, status, steps, log)
    if phase == Phase.COMPLETED and spec.training.steps <= _done(run, status):
        raise ConflictError(
            f"run {name!r} already completed {spec.training.steps} steps",
            hint=f"extend it with 'rlctl resume {name} --steps N', or start a new run "
            "with 'rlctl train'",
        )
    step = latest_checkpoint_step(run)
    aside = set_aside_checkpoints(run)
    if recover:  # nothing newer than the intact checkpoints: refused before any write
        newest, newer = trainer.recover_candidates(run)
        if not newer:
            raise trainer.nothing_to_recover(run, newest, [])
    if step is None and aside and not recover:
        # never from step 0 while a checkpoint exists, set aside or not
        refused = trainer.refusal(run)
        status.update(StatusUpdate(error=str(refused)))
        raise refused
    # only now: a refused resume prints nothing but its error, and leaves the log be
    log.attach(run)
    where = (
        f"checkpoint at step {step}"
        if step
        else "a checkpoint set aside as damaged (--recover)"
        if aside and recover
        else "the start (no checkpoint yet)"
    )
    log(phase_event(Stage.STARTING, f"resuming {name} from {where}"))
    return _execute(spec, run, status, log, recover)


def follow_run(root: str, name: str, progress: Progress | None = None) -> TrainResult:
    """Processes 1..N-1 of a multi-host run: the same training steps as process 0
    (they hold the other shards of the model), but status.json, metrics, eval and
    checkpoints are process 0's to write."""
    run = open_store(root).existing(name)
    spec = load_run_spec(run)
    _quiet_closed_loops()
    evals = trainer.train(spec, run, progress, on_status=lambda update: None)
    return TrainResult(
        name=run.name, path=run.uri, phase=Phase.COMPLETED, step=spec.training.steps, **evals
    )


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (kill, systemd, docker stop) stops the run as Ctrl-C does, recorded as
    ``interrupted``, partial checkpoint files removed, resumable. Inside a training
    step the first signal waits for the step's safe point and the last completed step
    is checkpointed on the way out; a second one stops at once (``trainer/runtime/stops.py``).

    Both signals are also remembered (``stops.received()``): a KeyboardInterrupt
    raised while JAX calls back into Python (a pytree comparison, say) comes out as
    some other exception, which after a stop signal still means "interrupted", not
    "failed"."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def unraisable(info: Any) -> None:
        # an interrupt that landed in a finalizer is lost there and printed as
        # "Exception ignored in ..."; on_status re-raises it at the next step instead
        if not isinstance(info.exc_value, KeyboardInterrupt):
            previous_hook(info)

    previous = {s: signal.signal(s, stops.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    previous_hook, sys.unraisablehook = sys.unraisablehook, unraisable
    stops.installed(True)
    try:
        yield
    finally:
        stops.installed(False)
        sys.unraisablehook = previous_hook
        for s, handler in previous.items():
            signal.signal(s, handler)


def _quiet_closed_loops() -> None:
    """Drop, for the rest of the process, the unraisable exceptions a failed
    checkpoint read leaves behind (``checkpoint_noise.restore_noise``: TensorStore's
    callbacks landing on a closed loop, Orbax's read coroutines collected
    unawaited), each reported with its traceback, some only at exit. The fallback
    already said it in one line (``checkpoint_noise.QuietRestore`` covers the restore
    itself, for library use)."""
    hook = sys.unraisablehook
    if getattr(hook, "rlctl_quiet", False):
        return

    def quiet(info: Any) -> None:
        if not trainer.restore_noise(info):
            hook(info)

    quiet.rlctl_quiet = True  # type: ignore[attr-defined]  # a mark on a function
    sys.unraisablehook = quiet


def _record_interrupt(
    run: RunDir, status: StatusFile, log: RunLog, stop: KeyboardInterrupt | None = None
) -> None:
    """Record the stop and say what it kept. The step recorded is at least the latest
    checkpoint's: a stop that lands just after a save (before status.json was told)
    must not report step N-1 while the metrics and the checkpoint hold step N; nor
    one whose save a second signal cut short report less than the metrics hold."""
    latest = latest_checkpoint_step(run)
    # a step whose save a second signal cut short is in the rows (never a row that
    # cannot be the run's: one of step 99 in a 6-step run, #57)
    total = status.data.get("total_steps")
    rows = checked_metrics(run, total if isinstance(total, int) else None, latest).rows
    step = max(_done(run, status), rows[-1]["step"] if rows else 0)
    status.update(StatusUpdate(phase=Phase.INTERRUPTED, step=step, latest_checkpoint=latest))
    if isinstance(stop, stops.StopRequested) and stop.saved == step and step:
        kept = f"saved checkpoint {step}"
    elif latest:
        lost = f"step {step}" if latest + 1 == step else f"steps {latest + 1}-{step}"
        kept = (
            f"latest checkpoint {latest}"
            if latest == step
            else f"latest checkpoint {latest}: resume repeats {lost}"
        )
    else:
        kept = "no checkpoint yet: resume starts from step 0"
    # a KeyboardInterrupt that says who raised it (a reward's own) keeps its words
    why = "" if stop is None or isinstance(stop, stops.StopRequested) else str(stop)
    why = f" ({why})" if why else ""
    log.end(f"run interrupted after step {step}{why}; {kept}")
    raise InterruptedRun(
        f"run {run.name!r} interrupted after step {step}{why}; {kept}",
        hint=f"resume with: rlctl resume {run.name}",
    ) from None


def _execute(
    spec: RunSpec, run: RunDir, status: StatusFile, log: RunLog, recover: bool = False
) -> TrainResult:
    def on_status(change: StatusUpdate) -> None:
        resize = status.update(change)
        if resize is not None:  # this attempt's, said once
            log({"event": "message", "message": f"resized: {resize.text}"})
        # a stop signal whose KeyboardInterrupt was swallowed somewhere (one that a
        # step defers is the loop's to take, at its safe point)
        if stops.received() and not stops.deferring():
            raise KeyboardInterrupt

    try:
        stops.reset()
        status.update(
            StatusUpdate(
                phase=Phase.STARTING,
                pid=os.getpid(),
                host=socket.gethostname(),
                started=_now(),
                error=None,
            )
        )
        # a stop is answered the moment it lands, not at the step's safe point (#53)
        acknowledge = stops.acknowledged(lambda m: log({"event": "message", "message": m}))
        with _sigterm_as_interrupt(), acknowledge:
            trainer.load_libraries(log)
            evals = trainer.train(spec, run, log, on_status, recover=recover)
    except KeyboardInterrupt as stop:
        _record_interrupt(run, status, log, stop)
    except Exception as e:
        if stops.received():  # the interrupt surfaced wrapped in another exception
            _record_interrupt(run, status, log)
        # latest_checkpoint: a checkpoint set aside during the attempt is no longer it
        if isinstance(e, RlctlError):
            status.update(
                StatusUpdate(
                    phase=Phase.FAILED, error=str(e), latest_checkpoint=latest_checkpoint_step(run)
                )
            )
            log.end(f"run failed: {(str(e).splitlines() or [''])[0]}")
            raise
        # one line in status.json: a library's dump stays in the log
        line = (str(e).strip().splitlines() or [""])[0][:300]
        status.update(
            StatusUpdate(
                phase=Phase.FAILED,
                error=f"{type(e).__name__}: {line}",
                latest_checkpoint=latest_checkpoint_step(run),
            )
        )
        log.end(f"run failed: {type(e).__name__}: {line}")
        raise
    status.update(
        StatusUpdate(
            phase=Phase.COMPLETED,
            finished=_now(),
            step=spec.training.steps,
            latest_checkpoint=latest_checkpoint_step(run),
        )
    )
    log.end(f"run completed: {spec.training.steps} steps")
    return TrainResult(
        name=run.name,
        path=run.uri,
        phase=Phase.COMPLETED,
        step=spec.training.steps,
        latest_checkpoint=latest_checkpoint_step(run),
        **evals,
    )
