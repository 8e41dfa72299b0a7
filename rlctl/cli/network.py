"""``rlctl network``: the extra VPC networks for multi-slice DCN traffic, on their own."""

from __future__ import annotations

from typing import Annotated

import typer

from rlctl.cli._errors import guarded
from rlctl.cli._infra import (
    assumed_location,
    assumed_note,
    build_spec,
    existing_cluster,
    plan_clients,
    run_plan,
)
from rlctl.cli._options import (
    CidrOpt,
    ClusterNameArg,
    DryRunOpt,
    InfraConfigOpt,
    MtuOpt,
    OutputOpt,
    ProjectOpt,
    RegionOpt,
    SetOpt,
    YesOpt,
    make_output,
)
from rlctl.cli._output import make_table
from rlctl.core.errors import require_cloud

app = typer.Typer(
    help="DCN networks (VPCs with MTU 8896, subnets, firewall rules).\n\n"
    "Example: rlctl network create rl --region us-east5 --count 2 --dry-run",
    no_args_is_help=True,
)

CountOpt = Annotated[int, typer.Option("--count", min=1, max=4, help="How many networks (1-4).")]


@guarded
def create(
    ctx: typer.Context,
    name: ClusterNameArg = None,
    project: ProjectOpt = None,
    region: RegionOpt = None,
    count: CountOpt = 2,
    mtu: MtuOpt = None,
    dcn_cidr: CidrOpt = None,
    config: InfraConfigOpt = None,
    set_: SetOpt = None,
    output: OutputOpt = "table",
    yes: YesOpt = False,
    dry_run: DryRunOpt = False,
) -> None:
    """Create the DCN networks for a cluster (also done by 'rlctl cluster create').

    Example: rlctl network create rl-v6e --region us-east5 --count 2 --dry-run
    """
    require_cloud("gcp")  # before any work: exit 8 with the install line
    from rlctl.core.gcp import cluster as core

    out = make_output(ctx, output, yes)
    # no credentials: plan against an empty project, as 'cluster create' does (#53)
    assumed = assumed_location(ctx, dry_run, config, project, region)
    if assumed:
        project, region = assumed
        out.info(assumed_note(project, region))
    spec = build_spec(
        config,
        name,
        project=project,
        region=region,
        dcn_networks=count,
        mtu=mtu,
        dcn_cidrs=dcn_cidr,
        overrides=set_,
    )
    clients = plan_clients(ctx, assumed, spec)
    plan = core.network_plan_create(clients, spec)
    if assumed:
        plan = plan.model_copy(update={"notes": [assumed_note(*assumed), *plan.notes]})
    run_plan(
        out,
        plan,
        dry_run,
        lambda ev: core.apply_plan(clients, plan, ev),
        f"networks for {spec.cluster} are ready",
    )


@guarded
def show(
    ctx: typer.Context,
    name: ClusterNameArg = None,
    project: ProjectOpt = None,
    region: RegionOpt = None,
    config: InfraConfigOpt = None,
    output: OutputOpt = "table",
    yes: YesOpt = False,
) -> None:
    """Show the networks, subnets and firewall rules rlctl made for a cluster.

    Example: rlctl network show rl-v6e --region us-east5 -o json
    """
    require_cloud("gcp")  # before any work: exit 8 with the install line
    from rlctl.core.gcp import network as core

    out = make_output(ctx, output, yes)
    name, project, region, clients = existing_cluster(ctx, name, config, project, region)
    rows = [{"kind": c.kind, "name": c.name, **c.fields} for c in core.found(clients, name, region)]
    out.result(
        rows,
        make_table(
            None,
            ["RESOURCE", "NAME", "DETAILS"],
            [
                [
                    r["kind"],
                    r["name"],
                    " ".join(f"{k}={v}" for k, v in r.items() if k not in ("kind", "name")),
                ]
                for r in rows
            ],
        ),
    )


@guarded
def delete(
    ctx: typer.Context,
    name: ClusterNameArg = None,
    project: ProjectOpt = None,
    region: RegionOpt = None,
    config: InfraConfigOpt = None,
    output: OutputOpt = "table",
    yes: YesOpt = False,
    dry_run: DryRunOpt = False,
) -> None:
    """Delete a cluster's DCN networks (firewalls, subnets, then networks).

    Example: rlctl network delete rl-v6e --region us-east5 --yes
    """
    require_cloud("gcp")  # before any work: exit 8 with the install line
    from rlctl.core.gcp import cluster as core

    out = make_output(ctx, output, yes)
    name, project, region, clients = existing_cluster(ctx, name, config, project, region)
    plan = core.network_plan_delete(clients, project, region, name)
    run_plan(
        out,
        plan,
        dry_run,
        lambda ev: core.apply_plan(clients, plan, ev),
        f"networks for {name} are deleted",
    )


app.command("create")(create)
app.command("show")(show)
app.command("delete")(delete)
