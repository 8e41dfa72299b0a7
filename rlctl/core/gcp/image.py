"""Cluster images in Artifact Registry, built by Cloud Build (``rlctl image``).

``plan_build`` compares what an image build needs with what exists: the Docker
repository (created if missing, labelled ``managed-by=rlctl``), the build context
in the cluster's bucket (uploaded once per content hash) and the image tag (the
content hash: an unchanged context is not built again). ``apply_build`` runs the
plan through the shared executor: it uploads the context, submits a Cloud Build
and follows it step by step until the image is pushed; a failed build is one line
naming the failing step and its log URL. ``image_exists`` is the pre-submit check
of ``train --cluster``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

from rlctl.core.config.infra import MANAGED_BY, RLCTL
from rlctl.core.errors import CloudError, ConfigError, NotFoundError
from rlctl.core.gcp import preflight, project_iam
from rlctl.core.gcp.api import GcpClients
from rlctl.core.gcp.operations import Event, call, execute
from rlctl.core.image.context import BuildContext, pins
from rlctl.core.plan import Change, Plan

BUILDER = "gcr.io/cloud-builders/docker"
CONTEXT_PREFIX = "rlctl/build-contexts"
BUILD_TIMEOUT_S = 3600
_AR_URI = re.compile(
    r"^(?P<location>[a-z0-9-]+)-docker\.pkg\.dev/(?P<project>[^/]+)/"
    r"(?P<repository>[^/]+)/(?P<package>[^:@]+)(?::(?P<tag>[^@]+))?$"
)


class ImageTarget(BaseModel):
    """Where an image goes and what it is for."""

    project: str
    region: str
    bucket: str
    accelerator: str
    repository: str = Field(default_factory=lambda: pins().repository)
    tags: list[str] = []  # more tags besides the content hash (--tag)

    def repository_name(self) -> str:
        return f"projects/{self.project}/locations/{self.region}/repositories/{self.repository}"

    def uri(self, tag: str) -> str:
        return image_uri(self.project, self.region, self.accelerator, tag, self.repository)


def image_uri(
    project: str, region: str, accelerator: str, tag: str, repository: str | None = None
) -> str:
    return (
        f"{region}-docker.pkg.dev/{project}/{repository or pins().repository}/"
        f"rlctl-{accelerator}:{tag}"
    )


def default_tag(accelerator: str) -> str:
    """The content-hash tag of this rlctl's image for ``accelerator`` (tpu, gpu, or a
    flavour: gpu-vllm)."""
    from rlctl.core.image.context import build_context

    return build_context(accelerator).tag


def default_image(project: str, region: str, accelerator: str) -> str:
    """The image ``rlctl image build`` makes for this rlctl and accelerator (its content
    hash tag), which ``train --cluster`` uses unless ``--image`` names another."""
    return image_uri(project, region, accelerator, default_tag(accelerator))


# --- observe -----------------------------------------------------------------------------
def _get(clients: GcpClients, what: str, fn: Callable[..., Any], **kw: Any) -> Any | None:
    try:
        return call(clients, what, fn, **kw)
    except NotFoundError:
        return None


def _tag_name(project: str, location: str, repository: str, package: str, tag: str) -> str:
    return (
        f"projects/{project}/locations/{location}/repositories/{repository}/packages/"
        f"{package.replace('/', '%2F')}/tags/{tag}"
    )


def image_exists(clients: GcpClients, uri: str) -> bool | None:
    """Whether an Artifact Registry image tag exists; None for other registries (or a
    digest reference), which rlctl cannot check."""
    m = _AR_URI.match(uri)
    if m is None or not m["tag"]:
        return None
    name = _tag_name(m["project"], m["location"], m["repository"], m["package"], m["tag"])
    return (
        _get(clients, f"reading image {uri}", clients.artifactregistry.get_tag, name=name)
        is not None
    )


def image_tags(clients: GcpClients, repository: str) -> list[str] | None:
    """The tags of an Artifact Registry image (``LOC-docker.pkg.dev/P/REPO/PACKAGE``, no
    tag), from its repository's docker images; None for other registries."""
    m = _AR_URI.match(repository)
    if m is None or m["tag"]:
        return None
    parent = f"projects/{m['project']}/locations/{m['location']}/repositories/{m['repository']}"
    images = call(
        clients,
        f"listing the images of {repository}",
        clients.artifactregistry.list_docker_images,
        parent=parent,
    )
    return sorted(
        {t for i in images for t in i.tags if i.uri.split("@")[0].endswith("/" + m["package"])}
    )


def _context_object(ctx: BuildContext) -> str:
    return f"{CONTEXT_PREFIX}/{ctx.accelerator}-{ctx.sha256}.tar.gz"


def plan_build(
    clients: GcpClients, target: ImageTarget, ctx: BuildContext, engine: str | None = None
) -> Plan:
    """Repository, context upload and build, each create or unchanged. With a local
    ``engine`` (docker/podman path) there is no upload: the engine builds and pushes."""
    notes: list[str] = []
    if engine is None:  # Cloud Build: its APIs, and the roles of the account it runs as
        preflight.require_apis(clients, target.project, preflight.IMAGE_BUILD_APIS)
    repo = _get(
        clients,
        f"reading repository {target.repository}",
        clients.artifactregistry.get_repository,
        name=target.repository_name(),
    )
    repo_key = f"repository/{target.repository}"
    changes = []
    fields = {"format": "DOCKER", "location": target.region}
    if repo is None:
        changes.append(
            Change(
                kind="repository",
                name=target.repository,
                action="create",
                fields={**fields, "labels": f"{MANAGED_BY}={RLCTL}"},
            )
        )
    else:
        if dict(repo.labels).get(MANAGED_BY) != RLCTL:
            notes.append(
                f"repository {target.repository} exists and is not rlctl's; "
                "images are pushed into it, it is never changed"
            )
        changes.append(
            Change(kind="repository", name=target.repository, action="unchanged", fields=fields)
        )
    deps = [repo_key]
    if engine is None:
        obj = _context_object(ctx)
        blob = _blob(clients, target.bucket, obj)
        changes.append(
            Change(
                kind="context",
                name=f"gs://{target.bucket}/{obj}",
                action="unchanged" if blob else "create",
                fields={
                    "files": ", ".join(ctx.files),
                    "bytes": len(ctx.archive),
                    "sha256": ctx.sha256[:12],
                },
            )
        )
        deps.append(f"context/gs://{target.bucket}/{obj}")
    uri = target.uri(ctx.tag)
    built = image_exists(clients, uri)
    extra = [target.uri(t) for t in target.tags]
    changes.append(
        Change(
            kind="image",
            name=uri,
            action="unchanged" if built and not extra else "create",
            fields={
                "builder": engine or "Cloud Build",
                "tags": [ctx.tag, *target.tags],
                "platform": pins().platform,
            },
            depends_on=deps,
            body={"engine": engine} if engine else None,
        )
    )
    if built and not extra:
        notes.append(f"the context is unchanged: {uri} already exists and is reused")
    if engine is None and not (built and not extra):
        grants, grant_notes = _build_grants(clients, target.project)
        for c in changes:
            if c.kind == "image":
                c.depends_on += [g.key for g in grants]
        changes = grants + changes
        notes += grant_notes
    return Plan(
        operation="create",
        target=uri,
        project=target.project,
        location=target.region,
        changes=changes,
        notes=notes,
    )


def _build_grants(clients: GcpClients, project: str) -> tuple[list[Change], list[str]]:
    """The builder role for the account Cloud Build runs as: projects from before 2024
    build as the legacy NUMBER@cloudbuild.gserviceaccount.com, which holds it; newer
    ones as the Compute Engine default account, which does not (project_iam.py)."""
    number = str(
        call(clients, f"reading project {project}", clients.projects.get, project=project).id
    )
    legacy = f"serviceAccount:{number}@cloudbuild.gserviceaccount.com"
    changes, notes = project_iam.plan_grants(
        clients, project, project_iam.default_service_account(number), project_iam.BUILD_ROLES
    )
    if any(c.action == "create" for c in changes):
        policy = clients.resource_manager.get_iam_policy(
            request={"resource": f"projects/{project}"}
        )
        if any(
            legacy in b.members
            for b in policy.bindings
            if b.role == "roles/cloudbuild.builds.builder"
        ):
            return [], []
    return [c for c in changes if c.action == "create"], notes  # a build shows only grants


def _blob(clients: GcpClients, bucket: str, name: str) -> Any | None:
    b = call(clients, f"reading gs://{bucket}", clients.storage.lookup_bucket, bucket)
    if b is None:
        raise ConfigError(
            f"bucket {bucket!r} does not exist",
            hint="make it with 'rlctl cluster create NAME --bucket "
            f"{bucket}', or pass --bucket of an existing one",
        )
    return call(clients, f"reading gs://{bucket}/{name}", b.get_blob, name)


# --- act -----------------------------------------------------------------------------------
def _create_repository(clients: GcpClients, target: ImageTarget) -> None:
    t = clients.artifactregistry_types
    repo = t.Repository(
        format_=t.Repository.Format.DOCKER,
        description="container images of rlctl cluster runs",
        labels={MANAGED_BY: RLCTL},
    )
    op = call(
        clients,
        f"creating repository {target.repository}",
        clients.artifactregistry.create_repository,
        parent=f"projects/{target.project}/locations/{target.region}",
        repository_id=target.repository,
        repository=repo,
    )
    try:
        op.result(timeout=300)
    except Exception as e:  # the operation's own error (GoogleAPICallError)
        from rlctl.core.gcp.errors import translate

        raise translate(e, f"creating repository {target.repository}") from e


def _upload(clients: GcpClients, bucket: str, name: str, data: bytes) -> None:
    blob = clients.storage.bucket(bucket).blob(name)
    call(
        clients,
        f"uploading gs://{bucket}/{name}",
        blob.upload_from_string,
        data,
        content_type="application/gzip",
        if_generation_match=0,
    )


def build_request(target: ImageTarget, ctx: BuildContext, types: Any) -> Any:
    """The Cloud Build: one docker build of the context, pushed under every tag."""
    uris = [target.uri(ctx.tag), *(target.uri(t) for t in target.tags)]
    args = ["build", "--platform", pins().platform, "--network", "cloudbuild"]
    for u in uris:
        args += ["-t", u]
    args.append(".")
    return types.Build(
        source=types.Source(
            storage_source=types.StorageSource(bucket=target.bucket, object_=_context_object(ctx))
        ),
        steps=[types.BuildStep(name=BUILDER, id="build", args=args)],
        images=uris,
        tags=["rlctl", f"rlctl-{target.accelerator}", f"ctx-{ctx.sha256[:12]}"],
        timeout={"seconds": BUILD_TIMEOUT_S},
        options=types.BuildOptions(machine_type=types.BuildOptions.MachineType.E2_HIGHCPU_8),
    )


def _failure(build: Any) -> str:
    steps = list(build.steps)
    bad = next(
        (
            i
            for i, s in enumerate(steps)
            if s.status.name in ("FAILURE", "TIMEOUT", "INTERNAL_ERROR", "CANCELLED")
        ),
        None,
    )
    where = (
        ""
        if bad is None
        else f" at step {bad} ({steps[bad].id or steps[bad].name} {' '.join(steps[bad].args[:1])})"
    )
    detail = build.failure_info.detail or build.status_detail or build.status.name
    return (
        f"Cloud Build {build.id} {build.status.name.lower()}{where}: {detail}; "
        f"logs: {build.log_url}"
    )


def run_build(
    clients: GcpClients,
    target: ImageTarget,
    ctx: BuildContext,
    on_poll: Callable[[str], None],
    timeout: float = BUILD_TIMEOUT_S,
) -> Any:
    """Submit the build and follow it until it ends; the finished Build."""
    t = clients.cloudbuild_types
    cb = clients.cloudbuild
    parent = f"projects/{target.project}/locations/{target.region}"
    # regional builds (parent=...locations/REGION): the request leaves project_id empty,
    # so the client uses the regional REST path, next to the regional repository
    op = call(
        clients,
        "submitting the Cloud Build",
        cb.create_build,
        parent=parent,
        build=build_request(target, ctx, t),
    )
    build_id = op.metadata.build.id
    name = f"{parent}/builds/{build_id}"
    delay = clients.poll_interval
    deadline = time.monotonic() + timeout
    while True:
        build = call(clients, f"reading Cloud Build {build_id}", cb.get_build, name=name)
        status = build.status.name
        working = [i for i, s in enumerate(build.steps) if s.status.name == "WORKING"]
        on_poll(f"{status}" + (f" step {working[0] + 1}/{len(build.steps)}" if working else ""))
        if status == "SUCCESS":
            return build
        if status in ("FAILURE", "INTERNAL_ERROR", "TIMEOUT", "CANCELLED", "EXPIRED"):
            raise CloudError(_failure(build))
        if time.monotonic() > deadline:
            raise CloudError(
                f"Cloud Build {build_id} still {status} after {timeout:.0f}s; logs: {build.log_url}"
            )
        time.sleep(delay)
        delay = min(delay * 1.5, clients.poll_interval * 10)


class BuildResult(BaseModel):
    image: str
    tags: list[str]
    built: bool
    build_id: str | None = None
    log_url: str | None = None
    applied: list[str] = []


def apply_build(
    clients: GcpClients,
    plan: Plan,
    target: ImageTarget,
    ctx: BuildContext,
    on_event: Event | None = None,
) -> BuildResult:
    """Apply ``plan_build``'s plan: repository, upload, build (concurrently where it can)."""
    out: dict[str, Any] = {}

    def handler(c: Change, on_poll: Callable[[str], None]) -> None:
        if c.kind == "repository":
            _create_repository(clients, target)
        elif c.kind == "context":
            _upload(clients, target.bucket, _context_object(ctx), ctx.archive)
        elif c.kind == project_iam.KIND:
            project_iam.apply(clients, c)
        elif c.body and c.body.get("engine"):
            from rlctl.core.image.local import build_local

            build_local(
                ctx, [target.uri(t) for t in [ctx.tag, *target.tags]], c.body["engine"], on_poll
            )
            out["build_id"] = None
        else:
            build = run_build(clients, target, ctx, on_poll)
            out.update(build_id=build.id, log_url=build.log_url)

    done = execute(plan.pending(), handler, on_event or (lambda *a: None))
    return BuildResult(
        image=target.uri(ctx.tag),
        tags=[ctx.tag, *target.tags],
        built="build_id" in out,
        applied=done,
        **out,
    )


def cluster_accelerator(clients: GcpClients, project: str, region: str, cluster: str) -> str:
    """tpu or gpu: what the cluster's accelerator pools are (TPU when it has both)."""
    from rlctl.core.gcp.cluster import get_cluster, slices_from_pools

    cur = get_cluster(clients, project, region, cluster)
    if cur is None:
        raise NotFoundError(
            f"cluster {cluster!r} not found in {project}/{region}",
            hint="list clusters with 'rlctl cluster list'",
        )
    kinds = {s.accelerator.kind for s in slices_from_pools(list(cur.node_pools))[0]}
    if not kinds:
        raise ConfigError(
            f"cluster {cluster!r} has no TPU or GPU node pool", hint="pass --accelerator tpu|gpu"
        )
    return "tpu" if "tpu" in kinds else "gpu"


def prepare(
    clients: GcpClients,
    project: str,
    region: str,
    accelerator: str | None = None,
    cluster: str | None = None,
    bucket: str | None = None,
    tags: list[str] | None = None,
    engine: str | None = None,
    flavour: str | None = None,
) -> tuple[ImageTarget, BuildContext, Plan]:
    """Everything ``rlctl image build`` shows before it acts: where the image goes (the
    accelerator and bucket from the cluster unless given; ``flavour``: vllm for
    ``rlctl-gpu-vllm``), the context, the plan."""
    from rlctl.core.gcp.storage import runs_bucket
    from rlctl.core.image.context import build_context, image_name

    if accelerator is None:
        accelerator = cluster_accelerator(clients, project, region, cluster) if cluster else "tpu"
    accelerator = image_name(accelerator, flavour)  # before any cloud call: tpu + vllm fails
    if engine is None and not bucket:
        if not cluster:
            raise ConfigError(
                "Cloud Build needs a bucket for the build context",
                hint="pass --cluster NAME (its run bucket) or --bucket B; "
                "or --local to build with Docker/Podman",
            )
        bucket = runs_bucket(clients, project, cluster)
    ctx = build_context(accelerator)
    target = ImageTarget(
        project=project,
        region=region,
        bucket=bucket or "",
        accelerator=accelerator,
        tags=list(tags or []),
    )
    return target, ctx, plan_build(clients, target, ctx, engine)


# --- read ------------------------------------------------------------------------------------
def list_images(
    clients: GcpClients, project: str, region: str, repository: str | None = None
) -> list[dict[str, Any]]:
    """rlctl's images in the repository: URI, tags, size, upload time (newest first)."""
    repo = repository or pins().repository
    parent = f"projects/{project}/locations/{region}/repositories/{repo}"
    try:
        pages = call(
            clients,
            f"listing images in {repo}",
            clients.artifactregistry.list_docker_images,
            parent=parent,
        )
    except NotFoundError:
        raise NotFoundError(
            f"no Artifact Registry repository {repo!r} in {project}/{region}",
            hint="build an image first: rlctl image build --cluster NAME",
        ) from None
    rows = [
        {
            "uri": img.uri,
            "tags": list(img.tags),
            "bytes": int(img.image_size_bytes),
            "uploaded": img.upload_time.isoformat() if img.upload_time else None,
        }
        for img in pages
        if "/rlctl-" in img.uri
    ]
    return sorted(rows, key=lambda r: r["uploaded"] or "", reverse=True)
