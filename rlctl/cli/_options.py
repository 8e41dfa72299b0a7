"""Options shared by several commands, as ``Annotated`` aliases (typer's public API only).

Each flag is declared here once; where two commands explain the same flag
differently (``--runs-dir`` of a new run vs. an existing one), the flag, type and
env var come from one helper and only the help differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import typer

from rlctl.cli._complete import backends as complete_backends
from rlctl.cli._complete import cluster_names
from rlctl.cli._groups import OptionGroup
from rlctl.cli._output import Output
from rlctl.core.gcp.api import GcpClients
from rlctl.core.k8s import backends

OutputOpt = Annotated[
    str,
    typer.Option(
        "--output",
        "-o",
        help="table (human) or json (only JSON on stdout).",
        envvar="RLCTL_OUTPUT",
        case_sensitive=False,
    ),
]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Show the plan and change nothing.")]
# Two env vars, not one: a training config in RLCTL_CONFIG must not become the spec
# of 'cluster create' (an infra spec) in the same shell.
ConfigOpt = Annotated[
    str | None,
    typer.Option("--config", "-c", help="YAML file with the run spec.", envvar="RLCTL_CONFIG"),
]
InfraConfigOpt = Annotated[
    str | None,
    typer.Option(
        "--config",
        "-c",
        help="YAML file with the cluster/network spec.",
        envvar="RLCTL_INFRA_CONFIG",
    ),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override any spec field: --set training.steps=5 (repeatable)."),
]
ProjectOpt = Annotated[str | None, typer.Option("--project", help="Google Cloud project id.")]
RegionOpt = Annotated[str | None, typer.Option("--region", help="Region of the cluster.")]


@dataclass(frozen=True)
class Cloud(OptionGroup):
    """The Google Cloud project and region a command calls (default: gcloud's own)."""

    project: ProjectOpt = None
    region: RegionOpt = None


# --- cluster and network commands ----------------------------------------------------
ClusterNameArg = Annotated[
    str | None,
    typer.Argument(help="Cluster name (or 'cluster' in --config).", autocompletion=cluster_names),
]
MtuOpt = Annotated[int | None, typer.Option("--mtu", help="MTU of DCN networks (8896).")]
CidrOpt = Annotated[list[str] | None, typer.Option("--dcn-cidr", help="Subnet range per network.")]


# --- where a run is: `train` (a new run) and the run commands (an existing one) ------
def _not_empty(value: str | None) -> str | None:
    """``--runs-dir ''`` is a mistake (an unset shell variable), not "the default"."""
    if value is not None and not value.strip():
        raise typer.BadParameter("is empty: pass a folder (default ./runs) or gs://BUCKET/runs")
    return value


def _runs_dir(help_: str) -> Any:
    return typer.Option("--runs-dir", help=help_, envvar="RLCTL_RUNS_DIR", callback=_not_empty)


def _cluster(help_: str) -> Any:
    return typer.Option("--cluster", help=help_, autocompletion=cluster_names)


def _image(help_: str) -> Any:
    return typer.Option("--image", help=help_, envvar="RLCTL_IMAGE")


RootOpt = Annotated[
    str | None, _runs_dir("Run store root: a local path (default ./runs) or gs://BUCKET/runs.")
]
ClusterOpt = Annotated[
    str | None,
    _cluster(
        "GKE cluster of the run (default: the one its status records); its bucket's "
        "gs://BUCKET/runs is the run store."
    ),
]
ImageOpt = Annotated[
    str | None, _image("Image for the re-submitted workload (default: the one recorded).")
]
TrainRootOpt = Annotated[str | None, _runs_dir("Run store root.")]
TrainClusterOpt = Annotated[str | None, _cluster("Run on this GKE cluster instead of locally.")]
TrainImageOpt = Annotated[
    str | None,
    _image(
        "Container image of the trainer (cluster runs; default: the one 'rlctl image build' "
        "made of this rlctl for the cluster's accelerator)."
    ),
]


def _backend_help() -> str:
    """One phrase per registered backend; the name is checked when the run is submitted
    (``runs/cluster.py``), so a local run ignores --backend as before."""
    *first, last = [f"{b.name} ({b.help})" for b in backends.registered()]
    return f"Cluster workload: {', '.join(first)} or {last}."


@dataclass(frozen=True)
class RunWhere(OptionGroup):
    """Where an existing run is: the options ``status``, ``logs``, ``resume`` and
    ``delete run`` share, declared once."""

    runs_dir: RootOpt = None
    cluster: ClusterOpt = None
    cloud: Cloud = field(default_factory=Cloud)


BackendOpt = Annotated[
    str, typer.Option("--backend", help=_backend_help(), autocompletion=complete_backends)
]


@dataclass
class AppState:
    """What the root callback hands to every command through ``ctx.obj``.

    ``clients`` is the one factory for Google Cloud and Kubernetes clients; tests
    pass ``CliRunner().invoke(app, args, obj=AppState(clients=fake))``.
    """

    verbose: int = 0
    debug: bool = False
    clients: GcpClients | None = None


def state(ctx: typer.Context) -> AppState:
    obj = ctx.find_root().obj
    return obj if isinstance(obj, AppState) else AppState()


def make_output(ctx: typer.Context, output: str = "table", yes: bool = False) -> Output:
    """Combine per-command flags with the root callback's settings."""
    from rlctl.core.errors import ConfigError

    if output.lower() not in ("table", "json"):
        raise ConfigError(f"--output must be 'table' or 'json', not {output!r}")
    fmt: Literal["table", "json"] = "json" if output.lower() == "json" else "table"
    return Output(fmt, verbose=state(ctx).verbose, yes=yes)
