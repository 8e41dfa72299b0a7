"""Options shared by every command, as ``Annotated`` aliases (typer's public API only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import typer

from rlctl.cli._output import Output

OutputOpt = Annotated[
    str,
    typer.Option(
        "--output", "-o", help="table (human) or json (only JSON on stdout).",
        envvar="RLCTL_OUTPUT", case_sensitive=False,
    ),
]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Show the plan and change nothing.")]
ConfigOpt = Annotated[
    str | None,
    typer.Option("--config", "-c", help="YAML file with the spec.", envvar="RLCTL_CONFIG"),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override any spec field: --set training.steps=5 (repeatable)."),
]
VerboseOpt = Annotated[int, typer.Option("--verbose", "-v", count=True, help="More detail.")]
ProjectOpt = Annotated[str | None, typer.Option("--project", help="Google Cloud project id.")]
RegionOpt = Annotated[str | None, typer.Option("--region", help="Region of the cluster.")]


@dataclass
class ClusterRefOpts:
    """Where a cluster run is, as given on the command line (None = look it up)."""

    cluster: str | None = None
    project: str | None = None
    region: str | None = None
    runs_dir: str | None = None
    accelerator: str | None = None

    def ref(self) -> Any:
        from rlctl.core.runs.cluster import ClusterRef

        return ClusterRef(cluster=self.cluster, project=self.project, region=self.region,
                          runs_dir=self.runs_dir, accelerator=self.accelerator)


@dataclass
class AppState:
    """What the root callback hands to every command through ``ctx.obj``.

    ``clients`` is the one factory for Google Cloud and Kubernetes clients; tests
    pass ``CliRunner().invoke(app, args, obj=AppState(clients=fake))``.
    """

    verbose: int = 0
    debug: bool = False
    clients: Any = None


def state(ctx: typer.Context) -> AppState:
    obj = ctx.find_root().obj
    return obj if isinstance(obj, AppState) else AppState()


def make_output(ctx: typer.Context, output: str = "table", yes: bool = False) -> Output:
    """Combine per-command flags with the root callback's settings."""
    from rlctl.core.errors import ConfigError

    fmt = output.lower()
    if fmt not in ("table", "json"):
        raise ConfigError(f"--output must be 'table' or 'json', not {output!r}")
    return Output(fmt, verbose=state(ctx).verbose, yes=yes)  # type: ignore[arg-type]
