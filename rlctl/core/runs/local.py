"""Run the trainer on this machine: create or reopen a run, keep status.json true.

``status.json`` moves pending -> evaluating/running -> completed | failed |
interrupted, and always names the latest complete checkpoint, so ``rlctl status``
and ``rlctl resume`` can trust it even after a crash. One process writes a run at a
time (the store's lock); a SIGKILLed run's file still says "running", which
``rlctl status`` shows as ``stale`` (its pid is gone) and resume accepts.
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
from rlctl.core.config.models import RunSpec
from rlctl.core.errors import (
    ConfigError,
    ConflictError,
    InterruptedRun,
    RlctlError,
    require_extra,
)
from rlctl.core.names import generate_run_name
from rlctl.core.runs.results import TrainResult
from rlctl.core.runs.run_log import RunLog
from rlctl.core.runs.spec import local_paths_absolute, write_new_run
from rlctl.core.runs.status import process_alive, read_status
from rlctl.core.store import open_store
from rlctl.core.store.base import (
    SPEC,
    STATUS,
    Phase,
    latest_checkpoint_step,
    set_aside_checkpoints,
)
from rlctl.core.store.local import LocalRunDir
from rlctl.core.trainer.events import Stage
from rlctl.core.trainer.events import phase as phase_event  # 'phase' names a Phase here

Progress = Callable[[dict[str, Any]], None]


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _created(run: LocalRunDir) -> str:
    """When the run's spec.yaml was written (its creation), or now if unknown (a
    gs:// store's staging copy does not keep the object's time)."""
    if not isinstance(run, LocalRunDir) or not (run.path / SPEC).exists():
        return _now()
    spec = run.path / SPEC
    mtime = dt.datetime.fromtimestamp(spec.stat().st_mtime, dt.timezone.utc)
    return mtime.isoformat(timespec="seconds")


class StatusFile:
    def __init__(self, run: LocalRunDir, spec: RunSpec) -> None:
        self.run = run
        self.data = read_status(run) if run.exists(STATUS) else {}
        self.data.pop("damaged", None)  # rebuilt from here on
        self.data.update(
            name=run.name, algorithm=spec.algorithm, total_steps=spec.training.steps,
            backend="local",
        )
        if not isinstance(self.data.get("created"), str):
            # a lost or damaged status.json: the run was created when its spec was written
            self.data["created"] = _created(run)
        self.data.setdefault("step", 0)
        # what the store holds, never a checkpoint that was set aside or lost since
        self.data["latest_checkpoint"] = latest_checkpoint_step(run)

    def update(self, **fields: Any) -> None:
        self.data.update(fields, updated=_now())
        self.run.write_json(STATUS, self.data)


def train_local(spec: RunSpec, progress: Progress | None = None) -> TrainResult:
    """Start a new run. The name must be free: reusing one is what ``resume`` is for.

    Its progress goes to ``progress`` and to the run's ``train.log``; the first event
    comes before any heavy import, so a terminal shows a line within a second."""
    require_extra("tunix", "train")
    name = spec.name or generate_run_name(spec.algorithm)
    log = RunLog("train", progress)
    log(phase_event(Stage.STARTING, f"starting run {name}"))
    spec = local_paths_absolute(spec.model_copy(update={"name": name}))
    store = open_store(spec.output.root)
    _preflight(spec, log)
    _quiet_closed_loops()
    # SIGTERM is Ctrl-C from the moment the run exists: a stop right after spec.yaml
    # is written leaves an 'interrupted' (or, SIGKILLed, 'stale') run, never 'pending'
    with _sigterm_as_interrupt():
        run = write_new_run(store, spec)
        with run.lock():  # one writer per run, for this process's whole life
            status = StatusFile(run, spec)
            try:
                status.update(phase=Phase.PENDING, pid=os.getpid(),
                              host=socket.gethostname())
            except KeyboardInterrupt:
                _record_interrupt(run, status, log)
            log.attach(run)  # after status.json: 'logs -f' sees an active run, and waits
            return _execute(spec, run, status, log)


def _preflight(spec: RunSpec, emit: Progress) -> None:
    """Fail on a bad model, dataset or reward before anything is written."""
    from rlctl.core.trainer.data import load_source
    from rlctl.core.trainer.models import resolve_model_dir
    from rlctl.core.trainer.rewards import resolve, total_reward
    from rlctl.core.trainer.tokenizer import ChatTokenizer

    folder = resolve_model_dir(spec.model.source, on_convert=lambda: emit(phase_event(
        Stage.CONVERTING, "converting the default model to safetensors (first use only)")))
    _load_libraries(emit)
    from rlctl.core.trainer.tunix_adapter import check_family

    check_family(folder)
    ChatTokenizer(folder)  # its files parse and name an eos token
    load_source(spec.data, spec.eval.size)
    for fn in resolve(spec.rewards):  # one trial call: a reward that raises or returns
        total_reward([fn], "<answer>1</answer>", "1")  # no number fails here, not at step 1


def _load_libraries(emit: Progress) -> None:
    """Import the trainer (JAX, Flax, Tunix: seconds on a fast machine, more on a busy
    one), saying so first unless this process already has."""
    import sys

    if "rlctl.core.trainer.tunix_adapter" not in sys.modules:
        emit(phase_event(Stage.LIBRARIES, "loading libraries (jax, flax, tunix)"))
    import rlctl.core.trainer.loop
    import rlctl.core.trainer.tunix_adapter  # noqa: F401


def load_run_spec(run: LocalRunDir) -> RunSpec:
    import yaml

    where = f"{run.uri}/{SPEC}"
    try:
        data = yaml.safe_load(run.read_text(SPEC))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"{where} is not valid YAML",
                          hint="restore the run's spec.yaml (its settings)") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{where} is empty or not a mapping",
                          hint="restore the run's spec.yaml (its settings)")
    try:
        return build(RunSpec, data)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e.message}", hint="fix or restore the run's spec.yaml"
                          ) from e


def resume_local(root: str, name: str, progress: Progress | None = None,
                 recover: bool = False) -> TrainResult:
    """Continue a run from its latest intact checkpoint. ``recover``: first bring back
    the checkpoints set aside as damaged whose data may be intact (see
    ``Checkpoints._recover``); a local run store only."""
    require_extra("tunix", "train")
    log = RunLog("resume", progress)
    run = open_store(root).existing(name)
    if recover and not isinstance(run, LocalRunDir):
        raise ConfigError("--recover is for a run store on this machine",
                          hint="copy the run's folder here, recover it, then copy it back")
    _quiet_closed_loops()
    with _sigterm_as_interrupt(), run.lock():  # before anything is read: one writer
        return _resume(run, log, recover)


def _resume(run: LocalRunDir, log: RunLog, recover: bool = False) -> TrainResult:
    name = run.name
    spec = load_run_spec(run)
    status = StatusFile(run, spec)
    phase = Phase.parse(status.data.get("phase"))
    if phase == Phase.COMPLETED:
        raise ConflictError(
            f"run {name!r} already completed {spec.training.steps} steps",
            hint="start a new run with 'rlctl train'",
        )
    if phase.active and _alive(status.data.get("pid"), status.data.get("host")):
        raise ConflictError(
            f"run {name!r} is still {phase} (pid {status.data['pid']})",
            hint="wait for it, or stop it first",
        )
    step = latest_checkpoint_step(run)
    aside = set_aside_checkpoints(run)
    if step is None and aside and not recover:
        from rlctl.core.trainer.checkpointing import refusal

        # never from step 0 while a checkpoint exists, set aside or not
        refused = refusal(run)
        status.update(error=str(refused))
        raise refused
    # only now: a refused resume prints nothing but its error, and leaves the log be
    log.attach(run)
    where = (f"checkpoint at step {step}" if step else
             "a checkpoint set aside as damaged (--recover)" if aside and recover else
             "the start (no checkpoint yet)")
    log(phase_event(Stage.STARTING, f"resuming {name} from {where}"))
    return _execute(spec, run, status, log, recover)


def follow_run(root: str, name: str, progress: Progress | None = None) -> TrainResult:
    """Processes 1..N-1 of a multi-host run: the same training steps as process 0
    (they hold the other shards of the model), but status.json, metrics, eval and
    checkpoints are process 0's to write."""
    from rlctl.core.trainer.loop import run_trainer

    run = open_store(root).existing(name)
    spec = load_run_spec(run)
    _quiet_closed_loops()
    evals = run_trainer(spec, run, progress, on_status=lambda fields: None)
    return TrainResult(name=run.name, path=run.uri, phase=Phase.COMPLETED,
                       step=spec.training.steps, **evals)


def _alive(pid: Any, host: Any) -> bool:
    """Another live process on this machine owns the run (ours does not count)."""
    return pid != os.getpid() and host == socket.gethostname() and process_alive(pid, host)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (kill, systemd, docker stop) stops the run as Ctrl-C does: at once,
    recorded as ``interrupted``, partial checkpoint files removed, resumable.

    Both signals are also remembered (``_STOPPED``): a KeyboardInterrupt raised while
    JAX calls back into Python (a pytree comparison, say) comes out as some other
    exception, which after a stop signal still means "interrupted", not "failed"."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        _STOPPED.append(signum)
        raise KeyboardInterrupt

    def unraisable(info: Any) -> None:
        # an interrupt that landed in a finalizer is lost there and printed as
        # "Exception ignored in ..."; on_status re-raises it at the next step instead
        if not isinstance(info.exc_value, KeyboardInterrupt):
            previous_hook(info)

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    previous_hook, sys.unraisablehook = sys.unraisablehook, unraisable
    try:
        yield
    finally:
        sys.unraisablehook = previous_hook
        for s, handler in previous.items():
            signal.signal(s, handler)


_STOPPED: list[int] = []  # stop signals this process received


def _quiet_closed_loops() -> None:
    """Drop, for the rest of the process, the "Event loop is closed" errors that a
    failed checkpoint read leaves behind: TensorStore's callbacks of the failed read
    land on its closed asyncio loop, each reported as an unraisable exception with
    its traceback, some only at exit. The fallback already said it in one line
    (``checkpointing._QuietRestore`` covers the restore itself, for library use)."""
    hook = sys.unraisablehook
    if getattr(hook, "rlctl_quiet", False):
        return

    def quiet(info: Any) -> None:
        e = info.exc_value
        if not (isinstance(e, RuntimeError) and str(e) == "Event loop is closed"):
            hook(info)

    quiet.rlctl_quiet = True  # type: ignore[attr-defined]
    sys.unraisablehook = quiet


def _record_interrupt(run: LocalRunDir, status: StatusFile, log: RunLog) -> None:
    status.update(phase=Phase.INTERRUPTED, latest_checkpoint=latest_checkpoint_step(run))
    log.end(f"run interrupted at step {status.data.get('step')}")
    raise InterruptedRun(
        f"run {run.name!r} interrupted at step {status.data.get('step')}",
        hint=f"continue with 'rlctl resume {run.name}'",
    ) from None


def _execute(spec: RunSpec, run: LocalRunDir, status: StatusFile,
             log: RunLog, recover: bool = False) -> TrainResult:
    def on_status(fields: dict[str, Any]) -> None:
        status.update(**fields)
        if _STOPPED:  # a stop signal whose KeyboardInterrupt was swallowed somewhere
            raise KeyboardInterrupt

    _STOPPED.clear()
    try:
        status.update(phase=Phase.STARTING, pid=os.getpid(), host=socket.gethostname(),
                      started=_now(), error=None)
        with _sigterm_as_interrupt():
            _load_libraries(log)
            from rlctl.core.trainer.loop import run_trainer

            evals = run_trainer(spec, run, log, on_status, recover=recover)
    except KeyboardInterrupt:
        _record_interrupt(run, status, log)
    except Exception as e:
        if _STOPPED:  # the interrupt surfaced wrapped in another exception
            _record_interrupt(run, status, log)
        # latest_checkpoint: a checkpoint set aside during the attempt is no longer it
        if isinstance(e, RlctlError):
            status.update(phase=Phase.FAILED, error=str(e),
                          latest_checkpoint=latest_checkpoint_step(run))
            log.end(f"run failed: {(str(e).splitlines() or [''])[0]}")
            raise
        # one line in status.json: a library's dump stays in the log
        line = (str(e).strip().splitlines() or [""])[0][:300]
        status.update(phase=Phase.FAILED, error=f"{type(e).__name__}: {line}",
                      latest_checkpoint=latest_checkpoint_step(run))
        log.end(f"run failed: {type(e).__name__}: {line}")
        raise
    status.update(phase=Phase.COMPLETED, finished=_now(), step=spec.training.steps,
                  latest_checkpoint=latest_checkpoint_step(run))
    log.end(f"run completed: {spec.training.steps} steps")
    return TrainResult(name=run.name, path=run.uri, phase=Phase.COMPLETED,
                       step=spec.training.steps, latest_checkpoint=latest_checkpoint_step(run),
                       **evals)
