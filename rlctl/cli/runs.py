"""``rlctl status`` and ``rlctl resume``: look at runs, continue them."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from rlctl.cli._errors import guarded
from rlctl.cli._options import OutputOpt, YesOpt, make_output
from rlctl.cli._output import make_table

RunArg = Annotated[str, typer.Argument(help="Run name.")]
OptRunArg = Annotated[str | None, typer.Argument(help="Run name; omit to list all runs.")]
RootOpt = Annotated[
    str, typer.Option("--runs-dir", help="Run store root.", envvar="RLCTL_RUNS_DIR")
]


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _runs_table(rows: list[dict[str, Any]]):
    return make_table(
        None,
        ["RUN", "ALGO", "PHASE", "STEP", "REWARD", "CKPT", "BASELINE ACC", "FINAL ACC"],
        [
            [
                r["name"], r.get("algorithm") or "-", r["phase"],
                f"{r['step']}/{r.get('total_steps') or '?'}",
                _fmt((r.get("latest_metrics") or {}).get("reward_mean")),
                _fmt(r.get("latest_checkpoint")),
                _fmt(r["eval"].get("baseline", {}).get("accuracy")),
                _fmt(r["eval"].get("final", {}).get("accuracy")),
            ]
            for r in rows
        ],
    )


def _run_view(r: dict[str, Any]) -> str:
    lines = [
        f"[bold]{r['name']}[/bold]  ({r['path']})",
        f"  phase       {r['phase']}",
        f"  algorithm   {r.get('algorithm') or '-'}",
        f"  step        {r['step']}/{r.get('total_steps') or '?'}",
        f"  checkpoint  {_fmt(r.get('latest_checkpoint'))}",
    ]
    if r.get("error"):
        lines.append(f"  error       {r['error']}")
    m = r.get("latest_metrics")
    if m:
        keys = ("loss", "reward_mean", "format_rate", "kl", "grad_norm", "step_seconds")
        lines.append("  last step   " + "  ".join(f"{k}={_fmt(m.get(k))}" for k in keys))
    for which, e in r["eval"].items():
        lines.append(
            f"  eval/{which:<8} accuracy={_fmt(e.get('accuracy'))} "
            f"format={_fmt(e.get('format_rate'))} n={e.get('n')}"
        )
    return "\n".join(lines)


@guarded
def status(
    ctx: typer.Context,
    run: OptRunArg = None,
    runs_dir: RootOpt = "./runs",
    output: OutputOpt = "table",
) -> None:
    """Show all runs, or one run's phase, step, latest metrics, checkpoint and eval.

    Example: rlctl status my-first-run -o json
    """
    from rlctl.core.runs.status import describe_run, list_runs
    from rlctl.core.runs.store import open_store

    out = make_output(ctx, output)
    store = open_store(runs_dir)
    if run is None:
        rows = list_runs(store)
        human = _runs_table(rows) if rows else f"no runs in {store.uri}"
        out.result(rows, human)
        return
    info = describe_run(store.existing(run))
    out.result(info, _run_view(info))


@guarded
def resume(
    ctx: typer.Context,
    run: RunArg,
    runs_dir: RootOpt = "./runs",
    output: OutputOpt = "table",
    yes: YesOpt = False,
) -> None:
    """Continue a run from its latest complete checkpoint to its planned step count.

    Example: rlctl resume my-first-run
    """
    from rlctl.cli.progress import TrainProgress
    from rlctl.core.runs.local import resume_local

    out = make_output(ctx, output, yes)
    with TrainProgress(out) as progress:
        record = resume_local(runs_dir, run, progress=progress.callback)
    out.result(record, progress.summary(record))
