"""``rlctl image``: the container image cluster runs use (build it, list them)."""

from __future__ import annotations

from typing import Annotated

import typer

from rlctl.cli._errors import guarded
from rlctl.cli._infra import (
    adc_project,
    assumed_location,
    assumed_note,
    clients_for,
    run_plan,
)
from rlctl.cli._options import (
    DryRunOpt,
    OutputOpt,
    ProjectOpt,
    RegionOpt,
    YesOpt,
    make_output,
)
from rlctl.cli._output import make_table
from rlctl.core.errors import require_cloud

app = typer.Typer(
    help="Container images for cluster runs (Cloud Build -> Artifact Registry)."
    "\n\nExample: rlctl image build --cluster rl --region us-east5",
    no_args_is_help=True,
)

ClusterOpt = Annotated[
    str | None,
    typer.Option(
        "--cluster",
        help="Build for this cluster: its accelerator and its bucket (for the build context).",
    ),
]
KindOpt = Annotated[
    str | None,
    typer.Option("--accelerator", "-a", help="tpu or gpu (default: the cluster's, else tpu)."),
]
WithOpt = Annotated[
    str | None,
    typer.Option(
        "--with",
        help="A flavour of the image: vllm (GPU: vLLM's CUDA wheel, for rollout.engine=vllm).",
    ),
]
TagOpt = Annotated[
    list[str] | None,
    typer.Option("--tag", help="Another tag besides the content hash (repeatable), e.g. latest."),
]
BucketOpt = Annotated[
    str | None,
    typer.Option(
        "--bucket", help="Bucket for the build context (default: the cluster's run bucket)."
    ),
]
LocalOpt = Annotated[
    bool,
    typer.Option(
        "--local", help="Build and push with a local Docker or Podman instead of Cloud Build."
    ),
]


def _where(project: str | None, region: str | None) -> tuple[str, str]:
    from rlctl.core.config.infra import resolve_location

    return resolve_location(None, project, region, adc_project=adc_project)


@guarded
def build(
    ctx: typer.Context,
    cluster: ClusterOpt = None,
    accelerator: KindOpt = None,
    with_: WithOpt = None,
    tag: TagOpt = None,
    bucket: BucketOpt = None,
    local: LocalOpt = False,
    project: ProjectOpt = None,
    region: RegionOpt = None,
    output: OutputOpt = "table",
    yes: YesOpt = False,
    dry_run: DryRunOpt = False,
) -> None:
    """Build the image of this rlctl for TPU or GPU hosts and push it to Artifact Registry.

    The context: a Dockerfile, the pinned requirements and a wheel of this rlctl.

    Its SHA-256 is the image tag: an unchanged context is reused, not rebuilt.

    Cloud Build by default (the context goes to the cluster's bucket); --local: Docker/Podman.

    Prints the image URI, which 'train --cluster' then picks by itself.

    --with vllm builds rlctl-gpu-vllm, which 'train --cluster' picks for a GPU run with
    --set rollout.engine=vllm.

    Example: rlctl image build --cluster rl --region us-east5 --dry-run
    """
    require_cloud("gcp")  # before any work: exit 8 with the install line
    from rlctl.core.gcp import image as core

    out = make_output(ctx, output, yes)
    engine = None
    if local:
        from rlctl.core.image.local import find_engine

        engine = find_engine()
    assumed = assumed_location(ctx, dry_run, None, project, region)
    if assumed:  # no credentials: plan against an empty project (and the cluster's bucket)
        from rlctl.core.clients import EmptyProject
        from rlctl.core.runs.cluster import assumed_bucket

        project, region = assumed
        clients = EmptyProject(project, region)
        if bucket:  # the bucket named is assumed to exist (and to be empty)
            clients.buckets[bucket] = {}
        if cluster:
            from rlctl.core.config.infra import CLUSTER_LABEL, MANAGED_BY, RLCTL

            clients.buckets[assumed_bucket(project, cluster)] = {
                MANAGED_BY: RLCTL,
                CLUSTER_LABEL: cluster,
            }
        out.info(
            assumed_note(project, region)
            + (
                ""
                if accelerator or not cluster
                else f"; cluster {cluster}'s accelerator is not known: a tpu image (-a gpu for "
                "the other)"
            )
        )
        accelerator = accelerator or "tpu"
    else:
        project, region = _where(project, region)
        clients = clients_for(ctx, project, region)
    out.info("packing the build context ...")
    target, context, plan = core.prepare(
        clients, project, region, accelerator, cluster, bucket, tag, engine, flavour=with_
    )
    uri = target.uri(context.tag)
    run_plan(
        out,
        plan,
        dry_run,
        lambda ev: core.apply_build(clients, plan, target, context, ev).model_dump(),
        f"image {uri} is ready (train --cluster uses it)",
    )
    if not out.json and not dry_run:
        out.result(None, uri)


@guarded
def list_(
    ctx: typer.Context,
    project: ProjectOpt = None,
    region: RegionOpt = None,
    output: OutputOpt = "table",
    yes: YesOpt = False,
) -> None:
    """List rlctl's images in Artifact Registry, newest first.

    Example: rlctl image list --project my-proj --region us-east5 -o json
    """
    require_cloud("gcp")  # before any work: exit 8 with the install line
    from rlctl.core.gcp import image as core

    out = make_output(ctx, output, yes)
    project, region = _where(project, region)
    rows = core.list_images(clients_for(ctx, project, region), project, region)
    out.result(
        rows,
        make_table(
            None,
            ["IMAGE", "TAGS", "SIZE", "UPLOADED"],
            [[r["uri"], ",".join(r["tags"]), r["bytes"], r["uploaded"] or ""] for r in rows],
        ),
    )


app.command("build")(build)
app.command("list")(list_)
