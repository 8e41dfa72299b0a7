"""Read-only views of runs for ``rlctl status``: pure reads of the run store."""

from __future__ import annotations

import json
import os
import socket
from typing import Any

from rlctl.core.config.models import RunSpec
from rlctl.core.errors import ConfigError
from rlctl.core.phases import Phase
from rlctl.core.runs.curve import Curve, build_curve
from rlctl.core.runs.results import EVALS, EvalSummary, Resize, RunEvals, RunInfo
from rlctl.core.store.base import (
    CHECKPOINTS,
    EVAL,
    SPEC,
    STATUS,
    RunDir,
    RunStore,
    set_aside_checkpoints,
)
from rlctl.core.store.local import LocalRunDir
from rlctl.core.store.metrics_rows import MetricsRows, read_rows
from rlctl.core.store.records import parse_json, read_spec, read_status_text


def _read_json(run: RunDir, rel: str) -> tuple[Any, str | None]:
    """(the parsed file, None), or (None, why it cannot be read): a damaged file is
    described, never raised, so one bad run cannot break ``status`` for the others."""
    try:
        return parse_json(run.read_text(rel)), None
    except UnicodeDecodeError:
        return None, f"{rel} is not UTF-8 text"
    except json.JSONDecodeError as e:
        return None, f"{rel} is not valid JSON (line {e.lineno})"
    except ValueError as e:  # NaN, or nested too deeply
        return None, f"{rel} is not valid JSON ({e})"


def read_status(run: RunDir) -> dict[str, Any]:
    """status.json as a dict, through the one reader its writers also pass it through
    (``store/records.py``); missing -> phase ``unknown``; damaged -> the fields that
    can be trusted, ``damaged`` saying what is wrong (so ``resume`` can rebuild it)."""
    if not run.exists(STATUS):
        return {"name": run.name, "phase": Phase.UNKNOWN}
    try:
        data, why = read_status_text(run.read_text(STATUS))
    except UnicodeDecodeError:
        data, why = {}, f"{STATUS} is not UTF-8 text"
    if why is not None:
        return {"name": run.name, "phase": Phase.UNKNOWN, **data, "damaged": why}
    return data


def checked_metrics(run: RunDir, steps: int | None, latest: int | None) -> MetricsRows:
    """The run's metrics rows that can be its own, and each line that cannot
    (``store/metrics_rows.py``). ``steps``: what its spec asks for (None: unknown);
    a checkpoint beyond it (the spec edited down since) raises the bound to it."""
    bound = max(steps, latest or 0) if steps is not None else None
    return read_rows(run, bound)


def read_spec_of(run: RunDir) -> tuple[RunSpec | None, str | None]:
    """(the run's spec, None), (None, why it cannot be read, naming the file), or
    (None, None) when it has none."""
    if not run.exists(SPEC):
        return None, None
    try:
        return read_spec(run.read_text(SPEC), SPEC), None
    except ConfigError as e:
        return None, e.message[:160]
    except UnicodeDecodeError:
        return None, f"{SPEC} is not UTF-8 text"
    except OSError as e:  # a folder where the file should be
        return None, f"{SPEC} cannot be read ({e.strerror or type(e).__name__})"


def read_eval(run: RunDir, which: str) -> dict[str, Any] | None:
    """An eval record; absent or damaged -> None (the run shows no such eval)."""
    rel = f"{EVAL}/{which}.json"
    if not run.exists(rel):
        return None
    data, why = _read_json(run, rel)
    return data if why is None and isinstance(data, dict) else None


def read_curve(run: RunDir, rows: list[dict[str, Any]]) -> Curve:
    """The learning curve of ``rows`` (the run's metrics) and every readable eval in
    ``eval/`` (baseline, step-N, final): one listing plus one read per eval file."""
    evals = {}
    for entry in run.list(EVAL):
        which = entry.removesuffix(".json")
        if entry.endswith(".json") and (data := read_eval(run, which)) is not None:
            evals[which] = data
    return build_curve(rows, evals)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_resizes(value: Any) -> list[Resize] | None:
    """status.json's ``resizes`` as records; an entry that is not one is left out (a
    hand-edited or damaged file must not break ``status``)."""
    if not isinstance(value, list):
        return None
    out = []
    for entry in value:
        try:
            out.append(Resize.model_validate(entry))
        except ValueError:
            continue
    return out or None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _seconds(value: Any) -> dict[str, float] | None:
    """A ``{program: seconds}`` record as status.json holds it; a damaged one, None."""
    if not isinstance(value, dict):
        return None
    return {
        str(k): float(v)
        for k, v in value.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    } or None


def process_alive(pid: Any, host: Any) -> bool:
    """Whether ``pid`` on ``host`` (as status.json records them) still runs. Only this
    machine's processes can be checked: another host's is assumed alive."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    if host != socket.gethostname():
        return True
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _phase(status: dict[str, Any], run: RunDir) -> tuple[Phase, str | None]:
    """The stored phase, or ``stale`` and why for a run trained on this machine whose
    trainer is gone. "Running" needs the run's lock held by the process the lock
    records (``RunDir.lock_state``: pid and start time), never a pid alone (#57: a
    reused pid read as a live run); only where the store cannot tell (gs://) does
    status.json's pid decide."""
    phase = Phase.parse(status.get("phase", Phase.UNKNOWN))
    if not (phase.active and status.get("backend") == "local"):
        return phase, None
    pid = status.get("pid")
    lock = run.lock_state()
    if lock.held is None:
        if "pid" not in status or process_alive(pid, status.get("host")):
            return phase, None
    elif lock.held:
        return phase, None
    ended = f"its process (pid {pid})" if "pid" in status else "its process"
    why = f": {lock.why}" if lock.why else ""
    here = status.get("host") == socket.gethostname()
    if lock.held is False and here and process_alive(pid, status.get("host")):
        why += f"; pid {pid} is another process now"  # kill(pid, 0) alone said 'running'
    return Phase.STALE, f"{ended} ended without finishing, killed or crashed{why}"


def folder_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes of every file under ``path`` (0 when absent); a file removed while it is
    counted (a checkpoint pruned by the running trainer) is skipped."""
    total = 0
    for folder, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(folder, f)).st_size
            except OSError:
                continue
    return total


def verified_checkpoints(run: RunDir) -> tuple[int | None, list[str]]:
    """(the newest complete checkpoint whose files are all there at their recorded
    sizes, what is wrong with each newer one): the checkpoint ``resume`` will
    restore, judged without reading a byte of it (``manifest.verify`` without its
    hashes; a bit flipped in place is found by resume alone). A gs:// store's
    checkpoints are taken as its COMMITTED markers say, unread."""
    steps = sorted(run.checkpoint_steps(), reverse=True)
    if not isinstance(run, LocalRunDir):
        return (steps[0] if steps else None), []
    from rlctl.core.store.manifest import verify

    damaged: list[str] = []
    for step in steps:
        why = verify(run.path / CHECKPOINTS / str(step), hashes=False)
        if why is None:
            return step, damaged
        damaged.append(f"checkpoint {step} is damaged ({why}): resume sets it aside")
    return None, damaged


def _sizes(run: RunDir, latest: int | None) -> tuple[int | None, int | None]:
    """(latest checkpoint's bytes, the whole run folder's bytes) of a run on this
    machine; (None, None) for a gs:// store, where it would mean listing every object."""
    if not isinstance(run, LocalRunDir):
        return None, None
    ckpt = folder_bytes(run.path / CHECKPOINTS / str(latest)) if latest else None
    return ckpt, folder_bytes(run.path)


def _evals(run: RunDir) -> tuple[dict[str, EvalSummary], list[str]]:
    """The baseline and final evals, and what is wrong with each that is there but
    cannot be read."""
    evals, problems = {}, []
    for which in EVALS:
        data = read_eval(run, which)
        if data is None and run.exists(f"{EVAL}/{which}.json"):
            problems.append(
                f"{EVAL}/{which}.json is unreadable (resume re-creates a baseline)"
                if which == "baseline"
                else f"{EVAL}/{which}.json is unreadable"
            )
        if data is not None:
            try:
                evals[which] = EvalSummary.model_validate(
                    {k: data.get(k) for k in EvalSummary.model_fields}
                )
            except ValueError:  # wrong types in the record: shown as absent
                problems.append(f"{EVAL}/{which}.json holds values of the wrong type")
    return evals, problems


def describe_run(run: RunDir, curve: bool = False) -> RunInfo:
    """The run as ``status`` shows it; ``curve`` adds its learning curve (one run's
    view: a listing of many runs leaves it out, to read no eval/ folder per run).

    Its progress is its latest complete checkpoint: metrics rows after it are steps
    a resume repeats (``steps_after_checkpoint``), and a row that cannot be the
    run's is damage (#57). ``damaged`` says every such problem; ``error`` begins
    with it, then says why a stale run stopped and the one command that helps."""
    status = read_status(run)
    spec, spec_damage = read_spec_of(run)
    latest, ckpt_damage = verified_checkpoints(run)
    steps = spec.training.steps if spec is not None else _int(status.get("total_steps"))
    metrics = checked_metrics(run, steps, latest)
    evals, eval_damage = _evals(run)
    aside = set_aside_checkpoints(run)  # one listing of checkpoints/
    problems = [status.get("damaged"), spec_damage, *ckpt_damage, metrics.damaged, *eval_damage]
    if aside:
        problems.append(
            f"checkpoint{'s' if len(aside) > 1 else ''} set aside: "
            + ", ".join(f"{CHECKPOINTS}/{n}" for n in aside)
        )
    damaged = "; ".join(filter(None, problems)) or None
    if not run.exists(SPEC):
        damaged = f"no {SPEC} (the run's settings): it cannot be resumed"
    done = steps_done(run, latest)
    phase, gone = _phase(status, run)
    error = _str(status.get("error"))
    if damaged or phase is Phase.STALE:
        # what is wrong first, then the one command that helps (a stale run's plain
        # 'resume' was refused when its checkpoints were all set aside, #47)
        error = "; ".join(
            filter(
                None,
                [
                    f"damaged: {damaged}" if damaged else None,
                    gone,
                    remedy(run, spec, latest, aside, done, phase),
                ],
            )
        )
    checkpoint_bytes, disk_bytes = _sizes(run, latest)
    return RunInfo(
        name=run.name,
        path=run.uri,
        phase=phase,
        algorithm=_str(status.get("algorithm")),
        step=done,
        steps_after_checkpoint=metrics.after(done),
        total_steps=_int(status.get("total_steps")),
        latest_checkpoint=latest,
        checkpoint_bytes=checkpoint_bytes,
        disk_bytes=disk_bytes,
        processes=_int(status.get("processes")),
        devices=_int(status.get("devices")),
        resizes=read_resizes(status.get("resizes")),
        engine=_str(status.get("engine")),
        precision=_str(status.get("precision")),
        sampling_precision=_str(status.get("sampling_precision")),
        rollout=_str(status.get("rollout")),
        compiles=_seconds(status.get("compiles")),
        last_save=status.get("last_save") if isinstance(status.get("last_save"), dict) else None,
        peak_device_bytes=_int(status.get("peak_device_bytes")),
        created=_str(status.get("created")),
        updated=_str(status.get("updated")),
        damaged=damaged,
        error=error,
        latest_metrics=metrics.rows[-1] if metrics.rows else None,
        eval=RunEvals(**evals),
        curve=read_curve(run, metrics.rows) if curve else None,
    )


def steps_done(run: RunDir, latest: int | None = None) -> int:
    """The steps the run has done: its newest checkpoint that verifies
    (``verified_checkpoints``; 0 before the first), the one resume restores. Never
    status.json's word (#47: a status.json saying 50 over files holding 2 made
    resume hint '--steps 51'), nor a metrics row's (#57: a garbage row of step 99
    did the same): rows after the checkpoint are steps a resume repeats.
    ``latest``: already found by the caller."""
    if latest is None:
        latest = verified_checkpoints(run)[0]
    return latest or 0


def remedy(
    run: RunDir,
    spec: RunSpec | None,
    latest: int | None,
    aside: list[str],
    done: int,
    phase: Phase = Phase.UNKNOWN,
) -> str | None:
    """The command that helps a damaged or stale run, as ``resume`` would judge it:
    its spec is missing or unreadable, its checkpoints are all set
    aside, or its spec asks for fewer steps than it has done; else plain resume
    (None for a completed run: resume would refuse it, and its damage is in files
    no step rewrites)."""
    name = run.name
    if not run.exists(SPEC):
        return f"restore its {SPEC} to resume it, or remove it with 'rlctl delete run {name}'"
    if spec is None:
        return f"fix its {SPEC}, then 'rlctl resume {name}'"  # what is wrong: in damaged
    if latest is None and aside:
        if isinstance(run, LocalRunDir):
            return (
                f"'rlctl resume {name} --recover' reads the set-aside checkpoints back "
                f"and resumes from the newest intact one"
            )
        return (
            f"copy the run here and 'rlctl resume {name} --recover' it (the set-aside "
            "checkpoints may be intact)"
        )
    if spec.training.steps < done:
        return (
            f"its {SPEC} asks for {spec.training.steps} steps of the {done} done: "
            f"'rlctl resume {name} --steps N' (N > {done})"
        )
    if phase is Phase.COMPLETED and spec.training.steps <= done:
        return None
    return f"continue with 'rlctl resume {name}'"


def list_runs(store: RunStore) -> list[RunInfo]:
    return [describe_run(store.run(name)) for name in store.list_runs()]


def run_phase(run: RunDir) -> Phase:
    """The run's phase as ``status`` shows it (``stale`` when its process is gone)."""
    return _phase(read_status(run), run)[0]
