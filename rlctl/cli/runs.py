"""``rlctl status``, ``logs``, ``resume`` and ``delete run``: look at runs, continue them.

A local run store (``./runs``) is read directly. A ``gs://`` store, or
``--cluster`` (whose bucket holds ``gs://BUCKET/runs``), also asks the cluster
about the run's workload; the run's status.json says which cluster it is on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from rlctl.cli._complete import run_names
from rlctl.cli._errors import guarded
from rlctl.cli._groups import grouped
from rlctl.cli._options import (
    DryRunOpt,
    ImageOpt,
    OutputOpt,
    RunWhere,
    YesOpt,
    make_output,
)
from rlctl.cli._output import Output, make_table

if TYPE_CHECKING:  # pragma: no cover
    from rlctl.core.runs.results import RunInfo
    from rlctl.core.runs.where import Where

RunArg = Annotated[str, typer.Argument(help="Run name.", autocompletion=run_names)]
OptRunArg = Annotated[
    str | None, typer.Argument(help="Run name; omit to list all runs.", autocompletion=run_names)
]
WatchOpt = Annotated[
    bool,
    typer.Option(
        "--watch", "-w", help="Refresh until the run ends (table output only; not with -o json)."
    ),
]
IntervalOpt = Annotated[
    float, typer.Option("--interval", min=0.5, help="Seconds between refreshes (--watch, logs -f).")
]
FollowOpt = Annotated[
    bool,
    typer.Option(
        "--follow", "-f", help="Keep printing new lines until the run ends (Ctrl-C stops)."
    ),
]
TailOpt = Annotated[int, typer.Option("--tail", min=1, help="Lines to show first.")]
GeneratorOpt = Annotated[
    bool,
    typer.Option(
        "--generator",
        help="The generator's log instead (rollout.placement=process: its process or pods).",
    ),
]
RecoverOpt = Annotated[
    bool,
    typer.Option(
        "--recover",
        help="Bring back the checkpoints set aside as damaged whose data may be "
        "intact (a missing or damaged manifest), read every array to check it, and resume "
        "from the newest that reads (a run on this machine only).",
    ),
]
PlotOpt = Annotated[
    str | None,
    typer.Option(
        "--plot",
        metavar="FILE.png",
        help="Also write the run's learning curve (reward, "
        "accuracy with the held-out evals, loss) as a PNG (needs the 'plot' extra).",
    ),
]
ResumeStepsOpt = Annotated[
    int | None,
    typer.Option(
        "--steps",
        help="Train to this many steps in all (more than the run has done): extends "
        "a completed run too; written to its spec.yaml, the final eval redone at the new end "
        "(a run on this machine only).",
    ),
]
PurgeOpt = Annotated[
    bool,
    typer.Option(
        "--purge",
        help="Also delete the run's files (spec, status, metrics, checkpoints) from the store.",
    ),
]


def _where(ctx: typer.Context, at: RunWhere, run: str | None = None) -> Where:
    """The flags mapped to ``core/runs/where.py``, which decides local or cluster
    (``run``: also ask the store whether that run was trained on this machine)."""
    from rlctl.cli._infra import clients_for
    from rlctl.core.runs.where import locate

    project, region = at.cloud.project, at.cloud.region
    return locate(
        at.runs_dir,
        at.cluster,
        project,
        region,
        lambda: clients_for(ctx, project, region),
        run=run,
    )


def _check_name(run: str | None) -> None:
    """A bad run name is one line before any credentials or store are touched."""
    if run is not None:
        from rlctl.core.names import validate_name

        validate_name(run, "run")


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


TABLE_MIN_WIDTH = 100  # below this the table's cells are cut to nothing: fold instead
_COLUMNS = ["RUN", "ALGO", "PHASE", "STEP", "REWARD", "CKPT", "BASELINE ACC", "FINAL ACC"]


def _phase_cell(r: RunInfo) -> str:
    """The phase, marked as ``-o json`` marks the run: ``damaged`` set (#57)."""
    return f"{r.phase} (damaged)" if r.damaged else str(r.phase)


def _step_cell(r: RunInfo) -> str:
    """'2/6', or '2/6 (+1 unsaved)': steps done (the latest checkpoint), and the steps
    the metrics hold after it."""
    done = f"{r.step}/{r.total_steps or '?'}"
    return f"{done} (+{r.steps_after_checkpoint} unsaved)" if r.steps_after_checkpoint else done


def _step_line(r: RunInfo) -> str:
    """The step of one run's view, the steps after its checkpoint said in full."""
    n = r.steps_after_checkpoint
    if not n:
        return f"{r.step}/{r.total_steps or '?'}"
    repeats = "" if r.phase.active else f": resume repeats {'it' if n == 1 else 'them'}"
    return f"{r.step}/{r.total_steps or '?'} (+{n} after the last checkpoint{repeats})"


def _cells(r: RunInfo) -> list[str]:
    return [
        r.name,
        r.algorithm or "-",
        _phase_cell(r),
        _step_cell(r),
        _fmt((r.latest_metrics or {}).get("reward_mean")),
        _fmt(r.latest_checkpoint),
        _fmt(r.eval.baseline.accuracy if r.eval.baseline else None),
        _fmt(r.eval.final.accuracy if r.eval.final else None),
    ]


def _runs_table(rows: list[RunInfo], width: int | None = None):
    """One row per run; on a narrow terminal one short block per run, so every
    value stays readable (a table at 40 columns cuts each cell to a letter)."""
    import shutil

    width = width or shutil.get_terminal_size((TABLE_MIN_WIDTH, 24)).columns
    if width >= TABLE_MIN_WIDTH:
        return make_table(None, _COLUMNS, [_cells(r) for r in rows])
    blocks = []
    for r in rows:
        c = _cells(r)
        blocks.append(
            f"{c[0]}\n  {c[2]}\n  {c[1]} step {c[3]}\n  reward {c[4]} ckpt {c[5]}"
            f"\n  acc {c[6]} -> {c[7]}"
        )
    return "\n".join(blocks)


def _last_save(r: RunInfo) -> str:
    """' (saved 1.5 GB in 4.2 s)': the newest save, as status.json recorded it."""
    from rlctl.core.units import human_bytes

    s = r.last_save or {}
    if s.get("step") != r.latest_checkpoint or not isinstance(s.get("seconds"), (int, float)):
        return ""
    size = f"{human_bytes(s['bytes'])} " if isinstance(s.get("bytes"), int) else ""
    where = " in the background" if s.get("background") else ""
    return f" (saved {size}in {s['seconds']:.1f} s{where})"


def _disk(r: RunInfo) -> str:
    """'1.4 GB (checkpoint 10: 0.5 GB)': what the run's folder takes on disk."""
    from rlctl.core.units import human_bytes

    text = human_bytes(r.disk_bytes or 0)
    if r.checkpoint_bytes is not None:
        text += f" (checkpoint {r.latest_checkpoint}: {human_bytes(r.checkpoint_bytes)})"
    return text


# status's words for the trainer's programs (status.json's ``compiles`` keys)
_PROGRAMS = {"step": "update", "sample_groups": "sampler", "policy_logps": "log-probs"}


def _compiles(seconds: dict[str, float]) -> str:
    """'update 41.2 s, sampler 12.0 s': each program's compiles this attempt, summed."""
    return ", ".join(f"{_PROGRAMS.get(k, k)} {v:.1f} s" for k, v in seconds.items())


def _run_view(r: RunInfo) -> str:
    lines = [
        f"{r.name}  ({r.path})",
        f"  phase       {_phase_cell(r)}",
        f"  algorithm   {r.algorithm or '-'}",
        f"  step        {_step_line(r)}",
        f"  checkpoint  {_fmt(r.latest_checkpoint)}" + _last_save(r),
    ]
    if r.disk_bytes is not None:
        lines.append(f"  disk        {_disk(r)}")
    if r.devices:
        lines.append(f"  devices     {r.devices} on {r.processes or 1} host(s)")
    if r.resizes:
        lines.append("  resized     " + "; ".join(x.text for x in r.resizes))
    if r.engine:
        lines.append(f"  engine      {r.engine}")
    if r.precision:
        sampling = r.sampling_precision
        lines.append(
            f"  precision   {r.precision} matmuls"
            + (f" (sampling {sampling})" if sampling and sampling != r.precision else "")
        )
    if r.rollout:
        lines.append(f"  rollout     {r.rollout}")
    if r.compiles:
        lines.append("  compiled    " + _compiles(r.compiles))
    if r.peak_device_bytes is not None:
        from rlctl.core.units import human_bytes

        lines.append(f"  device mem  {human_bytes(r.peak_device_bytes)} at its peak")
    if r.error:
        lines.append(f"  error       {r.error}")
    m = r.latest_metrics  # one metrics.jsonl row: its keys are the trainer's
    if m:  # the run's own rewards lead; accuracy only where it scores with 'correct'
        from rlctl.core.runs.headline import step_parts

        keys = ("loss", "kl", "grad_norm", "step_seconds")
        lines.append(
            "  last step   "
            + "  ".join(p.replace(" ", "=", 1) for p in step_parts(m))
            + "  "
            + "  ".join(f"{k}={_fmt(m.get(k))}" for k in keys)
        )
        from rlctl.core.runs.headline import pipeline_parts

        if pipeline := pipeline_parts(m):
            lines.append("  pipeline    " + "  ".join(pipeline))
    for which, e in r.eval.present():
        from rlctl.core.runs.headline import eval_parts

        shown = " ".join(p.replace(" ", "=", 1) for p in eval_parts(e.model_dump()))
        lines.append(f"  eval/{which:<8} {shown} n={e.n}")
    if r.curve is not None:
        lines += [f"  {line}" for line in _chart_lines(r.curve)]
    return "\n".join(lines)


def _chart_lines(curve: Any) -> list[str]:
    """The curve drawn for this terminal's width (80 in a pipe), in ASCII when stdout's
    encoding has no block characters (a latin-1 or C locale log)."""
    import shutil
    import sys

    from rlctl.cli._chart import BLOCKS, curve_lines

    try:
        (BLOCKS + "→…").encode(sys.stdout.encoding or "ascii")
        ascii_only = False
    except (UnicodeEncodeError, LookupError):
        ascii_only = True
    width = shutil.get_terminal_size((80, 24)).columns
    return curve_lines(curve, width - 2, ascii_only)


def _view(info: RunInfo) -> str:
    from rlctl.core.runs.results import ClusterRunInfo

    text = _run_view(info)
    if isinstance(info, ClusterRunInfo):
        w = info.workload
        pods = ", ".join(f"{n} {ph}" for ph, n in w.pods.items()) or "none"
        text += (
            f"\n  cluster     {info.cluster or '-'} ({info.backend})"
            f"\n  workload    {w.phase}  pods: {pods}"
        )
        if info.reason:
            text += f"\n  why         {info.reason}"
    return text


def _dump(data: RunInfo | list[RunInfo]) -> Any:
    """``-o json`` of a run (or a listing): the model's dump."""
    if isinstance(data, list):
        return [r.model_dump(mode="json") for r in data]
    return data.model_dump(mode="json")


@guarded
@grouped
def status(
    ctx: typer.Context,
    run: OptRunArg = None,
    at: RunWhere = RunWhere(),
    watch: WatchOpt = False,
    interval: IntervalOpt = 5.0,
    plot: PlotOpt = None,
    output: OutputOpt = "table",
) -> None:
    """Show all runs, or one run's phase, step, latest metrics, checkpoint, eval and
    learning curve (reward, accuracy and loss over the steps, and the held-out evals).

    For a cluster run (a gs:// --runs-dir, or --cluster) it adds the workload's state
    and, when it is not running, why (e.g. a pending reason). --watch refreshes on
    stderr until the run ends; it is for people, so it refuses -o json. Into a pipe or
    a file, --watch prints one line per change on stdout instead (NAME phase=... step=...).
    --plot also writes the curve as a PNG; -o json of one run carries it as "curve".

    Example: rlctl status my-first-run --plot curve.png
    """
    from rlctl.core.errors import ConfigError

    out = make_output(ctx, output)
    if watch and out.json:
        raise ConfigError(
            "--watch is table output only",
            hint="drop -o json, or poll 'rlctl status RUN -o json' yourself",
        )
    _check_name(run)
    plot_path = _plot_path(plot, run, watch)
    where = _where(ctx, at)

    def fetch() -> tuple[Any, Any, bool]:
        """(data, renderable, finished)"""
        if run is None:
            uri, rows = where.runs()
            return rows, _runs_table(rows) if rows else f"no runs in {uri}", False
        info = where.describe(run)
        return info, _view(info), info.finished

    if not watch:
        data, human, _ = fetch()
        if plot_path is not None:  # before the result: a failed write is the last line
            from rlctl.core.runs.plot import write_plot

            write_plot(plot_path, data.curve, _plot_title(data))
            out.info(f"wrote the learning curve to {plot_path}")
        out.result(_dump(data), human)
        return
    _watch(out, fetch, interval)


def _plot_path(plot: str | None, run: str | None, watch: bool) -> Any:
    """``--plot``'s file, checked (and the extra it needs) before any run is read."""
    if plot is None:
        return None
    from rlctl.core.errors import ConfigError, require_extra
    from rlctl.core.runs.plot import EXTRA, check_plot_path

    if run is None:
        raise ConfigError(
            "--plot draws one run's curve: name the run", hint="rlctl status RUN --plot curve.png"
        )
    if watch:
        raise ConfigError(
            "--plot writes the curve once; not with --watch",
            hint="drop --watch, or plot again when the run has ended",
        )
    path = check_plot_path(plot)
    require_extra("matplotlib", EXTRA)
    return path


def _plot_title(r: RunInfo) -> str:
    algo = f"{r.algorithm.upper()}, " if r.algorithm else ""
    return f"{r.name}  ({algo}step {r.step}/{r.total_steps or '?'}, {r.phase.value})"


def _watch(out: Output, fetch: Any, interval: float) -> None:
    """Redraw ``fetch()`` on stderr every ``interval`` s until it says finished.

    Outside a terminal a live display shows nothing until the end and then one cut
    line, so there it prints one plain line per run on stdout whenever the run changes
    (step, phase, checkpoint...), each whole and flushed: a log or ``grep`` sees it now.
    """
    import time

    if not out.watching_person:
        seen: dict[str, str] = {}
        while True:
            data, _, finished = fetch()
            for r in data if isinstance(data, list) else [data]:
                line = _watch_line(r)
                if seen.get(r.name) != line:
                    seen[r.name] = line
                    out.line(f"{time.strftime('%H:%M:%S')}  {line}")
            if finished:
                return
            time.sleep(interval)
    with out.live() as live:
        while True:
            _, human, finished = fetch()
            live.update(human, refresh=True)
            if finished:
                return
            time.sleep(interval)


def _watch_line(r: RunInfo) -> str:
    """One run as ``NAME key=value ...``: the table's cells, on one line."""
    from rlctl.core.runs.results import ClusterRunInfo

    c = _cells(r)
    unsaved = f" unsaved={r.steps_after_checkpoint}" if r.steps_after_checkpoint else ""
    line = (
        f"{c[0]} phase={c[2].replace(' ', '-')} step={r.step}/{r.total_steps or '?'}{unsaved} "
        f"reward={c[4]} ckpt={c[5]} baseline_acc={c[6]} final_acc={c[7]}"
    )
    if isinstance(r, ClusterRunInfo):
        line += f" workload={r.workload.phase}"
    return line


@guarded
@grouped
def resume(
    ctx: typer.Context,
    run: RunArg,
    at: RunWhere = RunWhere(),
    image: ImageOpt = None,
    recover: RecoverOpt = False,
    steps: ResumeStepsOpt = None,
    output: OutputOpt = "table",
    yes: YesOpt = False,
) -> None:
    """Continue a run from its latest complete checkpoint to its planned step count
    (or to --steps N, which also extends a completed run).

    A local run trains on this machine again. A cluster run (gs:// --runs-dir or
    --cluster) is re-submitted to its cluster with the recorded backend, image and
    accelerator; it is refused while the workload is pending or running, or when no
    checkpoint is complete yet.

    Example: rlctl resume my-first-run

    Example: rlctl resume my-first-run --steps 40
    """
    out = make_output(ctx, output, yes)
    _check_name(run)
    where = _where(ctx, at, run)
    if where.trains_here:  # this process trains: its progress is shown live
        from rlctl.cli.progress import TrainProgress

        with out.stdout_for_json_only(), TrainProgress(out) as progress:
            record = where.resume(
                run, image=image, recover=recover, steps=steps, progress=progress.callback
            )
        out.result(record.model_dump(mode="json"), progress.summary(record))
        return
    # a cluster run's checks first: its programs compiled for the accelerator again
    with out.phases(f"checking run {run} before it is re-submitted ...") as say:
        result = where.resume(
            run,
            image=image,
            recover=recover,
            steps=steps,
            progress=lambda line: say(f"device memory: {line} ..."),
        )
    for line in result.applied:
        out.info(f"  {line}")
    out.result(
        result.model_dump(mode="json"),
        f"resumed run {run} on {result.cluster} "
        f"from checkpoint {result.checkpoint} ({result.backend})",
    )


@guarded
@grouped
def logs(
    ctx: typer.Context,
    run: RunArg,
    at: RunWhere = RunWhere(),
    follow: FollowOpt = False,
    tail: TailOpt = 100,
    interval: IntervalOpt = 2.0,
    generator: GeneratorOpt = False,
    output: OutputOpt = "table",
) -> None:
    """Print a run's log; -f keeps following until the run ends.

    A run trained on this machine (./runs or --runs-dir PATH; or a gs:// store it
    wrote to from here) prints its train.log: every attempt's phase, step and eval
    lines with their times. A cluster run (a gs:// --runs-dir or --cluster) prints the
    same file, which its trainer writes into the run store whatever the backend; before
    it has written one, the log of its leading pod (JobSet: process 0; Pathways: the
    head; Ray: the job submitter). -f polls every --interval seconds and stops when the
    run (or its workload) has ended; Ctrl-C exits with 130. With -o json (not with -f):
    {"run": ..., "log": ..., "lines": [...]}, or {"run": ..., "pod": ..., "lines": [...]}
    from a pod. --generator prints the generator's generator.log instead: a run with
    rollout.placement=process samples in a process (on a cluster, pods) of its own.

    Example: rlctl logs my-first-run -f
    """
    from rlctl.core.errors import ConfigError

    out = make_output(ctx, output)
    _check_name(run)
    if follow and out.json:
        raise ConfigError("-f is text output only", hint="drop -o json")
    where = _where(ctx, at, run)
    from rlctl.core.store.base import GENERATOR_LOG, LOG

    log = GENERATOR_LOG if generator else LOG
    if follow:
        following = where.follow(run, tail, interval, log)
        if following.note:
            out.info(following.note)
        for line in following.lines:
            out.line(line)
        out.info(following.end())
        return
    got, note = where.tail(run, tail, log)
    if note:
        out.info(note)
    if out.json:
        out.result(got.model_dump(mode="json", exclude_none=True))
        return
    for line in got.lines:
        out.line(line)


@guarded
@grouped
def delete_run(
    ctx: typer.Context,
    run: RunArg,
    at: RunWhere = RunWhere(),
    purge: PurgeOpt = False,
    output: OutputOpt = "table",
    yes: YesOpt = False,
    dry_run: DryRunOpt = False,
) -> None:
    """Delete a run: a local run's folder, or a cluster run's labelled objects.

    Shows the plan of what it will remove, asks (--yes skips), then deletes. A local
    run (./runs or --runs-dir PATH) is its whole folder: spec, status, metrics,
    checkpoints; a run being trained is refused. A cluster run loses its workload,
    spec ConfigMap, HF token Secret and DRANET claim (with --purge also its files in
    the gs:// store); the shared ServiceAccount and everything else stay.

    Example: rlctl delete run my-run --runs-dir gs://my-bucket/runs --purge --yes
    """
    from rlctl.cli._infra import run_plan

    out = make_output(ctx, output, yes)
    _check_name(run)
    deletion = _where(ctx, at).plan_delete(run, purge)
    run_plan(out, deletion.plan, dry_run, deletion.apply, deletion.done)
