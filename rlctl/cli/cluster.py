"""``rlctl cluster``: the GKE cluster, its node pools, DCN networks, bucket and IAM."""

from __future__ import annotations

from typing import Annotated

import typer

from rlctl.cli._complete import accelerators
from rlctl.cli._errors import guarded
from rlctl.cli._infra import (
    adc_project,
    assumed_location,
    assumed_note,
    build_spec,
    clients_for,
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
    help="GKE clusters with TPU/GPU node pools (plan, then apply).\n\n"
    "Example: rlctl cluster create rl --region us-east5 -a v6e-16 --dry-run",
    no_args_is_help=True,
)

ZoneOpt = Annotated[str | None, typer.Option("--zone", help="Zone of accelerator pools.")]
AccelOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--accelerator",
        "-a",
        autocompletion=accelerators,
        help="Slices as you say them: 'v6e-16 x2', v5p-128, tpu7x-128, a3-highgpu-8g (repeatable).",
    ),
]
NumSlicesOpt = Annotated[
    int | None,
    typer.Option("--num-slices", min=1, help="Slices per --accelerator given without 'xN'."),
]
SpotOpt = Annotated[bool, typer.Option("--spot", help="Spot capacity for accelerator pools.")]
ReservationOpt = Annotated[str | None, typer.Option("--reservation", help="Reservation name.")]
DcnOpt = Annotated[int | None, typer.Option("--dcn-networks", help="Extra VPC networks for DCN.")]
BucketOpt = Annotated[str | None, typer.Option("--bucket", help="GCS bucket for runs.")]
BucketLocOpt = Annotated[
    str | None, typer.Option("--bucket-location", help="Bucket location (must be the region).")
]
NamespaceOpt = Annotated[str | None, typer.Option("--namespace", help="Kubernetes namespace.")]
KsaOpt = Annotated[
    str | None, typer.Option("--service-account", help="Kubernetes service account.")
]
ChannelOpt = Annotated[
    str | None, typer.Option("--release-channel", help="rapid, regular, stable or none.")
]
VersionOpt = Annotated[str | None, typer.Option("--cluster-version", help="GKE version.")]
AutopilotOpt = Annotated[
    bool,
    typer.Option("--autopilot", help="GKE Autopilot mode: refused (runs need TPU/GPU node pools)."),
]
KeepBucketOpt = Annotated[bool, typer.Option("--keep-bucket", help="Do not delete the bucket.")]


@guarded
def create(
    ctx: typer.Context,
    name: ClusterNameArg = None,
    project: ProjectOpt = None,
    region: RegionOpt = None,
    zone: ZoneOpt = None,
    accelerator: AccelOpt = None,
    num_slices: NumSlicesOpt = None,
    spot: SpotOpt = False,
    reservation: ReservationOpt = None,
    dcn_networks: DcnOpt = None,
    mtu: MtuOpt = None,
    dcn_cidr: CidrOpt = None,
    bucket: BucketOpt = None,
    bucket_location: BucketLocOpt = None,
    namespace: NamespaceOpt = None,
    service_account: KsaOpt = None,
    release_channel: ChannelOpt = None,
    cluster_version: VersionOpt = None,
    autopilot: AutopilotOpt = False,
    config: InfraConfigOpt = None,
    set_: SetOpt = None,
    output: OutputOpt = "table",
    yes: YesOpt = False,
    dry_run: DryRunOpt = False,
) -> None:
    """Create (or converge) the cluster, node pools, DCN networks, bucket and IAM binding,
    then what runs need inside it: the JobSet and PathwaysJob controllers (pinned
    versions shipped with rlctl), the namespace and the service account.

    Shows the plan with an hourly cost estimate, asks, then applies; re-running is safe.
    Autopilot is refused: runs need one TPU/GPU node pool per slice.

    Example: rlctl cluster create rl -a 'v6e-16 x2' --dcn-networks 2 --bucket rl-runs --dry-run
    """
    require_cloud()  # before any work: exit 8 with the install line
    from rlctl.core.runs import readiness as core

    out = make_output(ctx, output, yes)
    assumed = assumed_location(ctx, dry_run, config, project, region)
    if assumed:
        project, region = assumed
        out.info(assumed_note(project, region))
    spec = build_spec(
        config,
        name,
        project=project,
        region=region,
        zone=zone,
        accelerators=accelerator,
        num_slices=num_slices,
        spot=spot,
        reservation=reservation,
        dcn_networks=dcn_networks,
        mtu=mtu,
        dcn_cidrs=dcn_cidr,
        bucket=bucket,
        bucket_location=bucket_location,
        namespace=namespace,
        service_account=service_account,
        release_channel=release_channel,
        version=cluster_version,
        autopilot=autopilot,
        overrides=set_,
    )
    if assumed:
        from rlctl.core.config.infra import check_location

        check_location(spec.project, spec.region, spec.zone, known_only=True)  # and its zone
    clients = plan_clients(ctx, assumed, spec)
    out.info(f"planning cluster {spec.cluster} in {spec.project}/{spec.region} ...")
    plan = core.plan_create(clients, spec)
    if assumed:
        plan = plan.model_copy(update={"notes": [assumed_note(*assumed), *plan.notes]})
    run_plan(
        out,
        plan,
        dry_run,
        lambda ev: core.apply_plan(clients, plan, ev),
        f"cluster {spec.cluster} is ready "
        f"(next: gcloud container clusters get-credentials {spec.cluster} "
        f"--region {spec.region} --project {spec.project})",
    )


@guarded
def delete(
    ctx: typer.Context,
    name: ClusterNameArg = None,
    project: ProjectOpt = None,
    region: RegionOpt = None,
    keep_bucket: KeepBucketOpt = False,
    config: InfraConfigOpt = None,
    output: OutputOpt = "table",
    yes: YesOpt = False,
    dry_run: DryRunOpt = False,
) -> None:
    """Delete what rlctl made for a cluster: controllers, pools, cluster, firewalls, subnets,
    networks, bucket.

    Lists exactly what it found with rlctl's labels first; a non-empty bucket is kept.

    Example: rlctl cluster delete rl-v6e --region us-east5 --yes
    """
    require_cloud()  # before any work: exit 8 with the install line
    from rlctl.core.runs import readiness as core

    out = make_output(ctx, output, yes)
    name, project, region, clients = existing_cluster(ctx, name, config, project, region)
    plan = core.plan_delete(clients, project, region, name, keep_bucket)
    run_plan(
        out,
        plan,
        dry_run,
        lambda ev: core.apply_plan(clients, plan, ev),
        f"deleted what rlctl made for {name}",
    )


@guarded
def list_(
    ctx: typer.Context,
    project: ProjectOpt = None,
    region: RegionOpt = None,
    all_: Annotated[bool, typer.Option("--all", help="Also clusters not made by rlctl.")] = False,
    config: InfraConfigOpt = None,
    output: OutputOpt = "table",
    yes: YesOpt = False,
) -> None:
    """List GKE clusters in the project (rlctl's only, unless --all).

    Example: rlctl cluster list --project my-proj -o json
    """
    require_cloud("gcp")  # before any work: exit 8 with the install line
    from rlctl.core.config.infra import resolve_location
    from rlctl.core.gcp import cluster as core

    out = make_output(ctx, output, yes)
    project, default_region = resolve_location(
        config, project, region or "-", adc_project=adc_project
    )
    clients = clients_for(ctx, project, default_region)
    rows = [
        c
        for c in core.list_clusters(clients, project, region or "-")
        if all_ or c["managed_by_rlctl"]
    ]
    out.result(
        rows,
        make_table(
            None,
            ["NAME", "LOCATION", "STATUS", "VERSION", "POOLS"],
            [[c["name"], c["location"], c["status"], c["version"], c["node_pools"]] for c in rows],
        ),
    )


@guarded
def describe(
    ctx: typer.Context,
    name: ClusterNameArg = None,
    project: ProjectOpt = None,
    region: RegionOpt = None,
    config: InfraConfigOpt = None,
    output: OutputOpt = "table",
    yes: YesOpt = False,
) -> None:
    """Show a cluster, its node pools, their state and versions.

    Example: rlctl cluster describe rl-v6e --region us-east5
    """
    require_cloud()  # before any work: exit 8 with the install line
    from rlctl.core.gcp import cluster as core

    out = make_output(ctx, output, yes)
    name, project, region, clients = existing_cluster(ctx, name, config, project, region)
    from rlctl.core.k8s import backends

    d = core.describe(clients, project, region, name, backends.cluster_needs())
    addons = "  ".join(f"{k}={v}" for k, v in d["addons"].items())
    head = (
        f"{d['name']}  {d['location']}  {d['status']}  GKE {d['version']}\n"
        f"  add-ons: {addons}  dataplane v2={d['dataplane_v2']}  "
        f"multi-networking={d['multi_networking']}\n  workload pool: {d['workload_pool']}"
    )
    pools = make_table(
        "node pools",
        ["NAME", "STATUS", "VERSION", "MACHINE", "NODES", "TOPOLOGY", "NETWORKS"],
        [
            [
                p["name"],
                p["status"],
                p["version"],
                p["machine_type"],
                p["nodes"],
                p.get("topology", ""),
                ",".join(p.get("additional_networks", [])),
            ]
            for p in d["node_pools"]
        ],
    )
    if out.json:
        out.result(d)
    else:
        out.result(None, head)
        out.result(None, pools)


app.command("create")(create)
app.command("delete")(delete)
app.command("list")(list_)
app.command("describe")(describe)
