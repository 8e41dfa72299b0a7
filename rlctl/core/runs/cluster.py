"""Find the cluster a run goes to, then submit, watch, resume or delete it there.

Hop 3 behind ``rlctl train --cluster``, ``status``/``logs``/``resume`` of a
cluster run and ``delete run``. It resolves what ``submit.py`` needs from the
GKE API (endpoint, CA, accelerator shape from the node pools via the catalog,
the run bucket by its rlctl labels) and builds the Kubernetes API client through
the client factory (``Clients.kubernetes``). Nothing here prints or exits.

Where a run lives is recorded in its status.json at submit (cluster, project,
region, image, accelerator, backend, namespace), so later commands need only
``--runs-dir gs://...`` (or ``--cluster``, whose bucket holds the run store).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from rlctl.core.config.catalog import lookup, multislice_refusal, parse_slices
from rlctl.core.config.infra import DEFAULT_KSA, DEFAULT_NAMESPACE, KSA_LABEL, NAMESPACE_LABEL
from rlctl.core.config.models import RunSpec
from rlctl.core.config.nodes import NodePool
from rlctl.core.errors import ConfigError, ConflictError, NotFoundError
from rlctl.core.gcp.api import GcpClients
from rlctl.core.gcp.image import default_image, default_tag, image_exists
from rlctl.core.gcp.storage import runs_bucket
from rlctl.core.k8s import backends
from rlctl.core.k8s.apply import KubeApi, describe_workload, trainer_logs
from rlctl.core.k8s.backends.base import Backend
from rlctl.core.k8s.shapes import SliceShape, slice_shape
from rlctl.core.plan import ApplyResult, Plan
from rlctl.core.runs import device_fit
from rlctl.core.runs.placement import check_placement
from rlctl.core.runs.results import (
    ClusterRunInfo,
    LogTail,
    ResumeResult,
    RunInfo,
    SubmitPreview,
    SubmitResult,
)
from rlctl.core.runs.status import read_status
from rlctl.core.runs.submit import (
    ClusterOptions,
    apply_delete_run,
    cluster_engine,
    describe_cluster_run,
    image_for,
    learner_shape,
    plan_delete_run,
    render_run,
    resume_run,
    rlctl_image,
    submit_run,
)
from rlctl.core.store import open_store
from rlctl.core.store.base import LOG, RunDir, RunStore

RUNS_PREFIX = "runs"
HF_TOKEN_ENV = "HF_TOKEN"


class ClusterRef(BaseModel):
    """Where a cluster run is, as the user said it (None = not given: look it up)."""

    cluster: str | None = None
    project: str | None = None
    region: str | None = None
    runs_dir: str | None = None
    accelerator: str | None = None
    namespace: str | None = None


@dataclass
class ClusterTarget:
    """What a workload needs to know about its cluster, read from the GKE API."""

    name: str
    project: str
    region: str
    endpoint: str
    ca_cert: str | None
    shapes: dict[str, SliceShape] = field(default_factory=dict)
    dcn_networks: list[str] = field(default_factory=list)
    pools: list[NodePool] = field(default_factory=list)  # its nodes, as the scheduler sees them
    unmodelled: list[str] = field(default_factory=list)  # pools of machine types rlctl lacks
    namespace: str | None = None  # as 'cluster create' recorded them (None: older clusters)
    service_account: str | None = None

    def shape(self, accelerator: str | None = None) -> tuple[str, SliceShape]:
        """(catalog name, shape) of the accelerator pools to run on; several single-host
        TPU pools are refused (``catalog.multislice_refusal``)."""
        key, shape = self._shape(accelerator)
        if why := multislice_refusal(lookup(key), shape.num_slices):
            raise ConfigError(
                f"cluster {self.name!r}: {why}",
                hint=f"remove the extra {key} pools with 'rlctl cluster "
                f"create {self.name} -a {key}' (it plans the change first)",
            )
        return key, shape

    def _shape(self, accelerator: str | None = None) -> tuple[str, SliceShape]:
        if not self.shapes:
            raise ConfigError(
                f"cluster {self.name!r} has no TPU or GPU node pool",
                hint=f"add one with 'rlctl cluster create {self.name} -a v6e-16'",
            )
        if accelerator:
            name, count = parse_slices(accelerator)
            key = lookup(name).name
            if key not in self.shapes:
                raise ConfigError(
                    f"cluster {self.name!r} has no {key} node pool",
                    hint=f"it has: {', '.join(sorted(self.shapes))}",
                )
            shape = self.shapes[key]
            if not re.search(r"\s[xX*]\s*\d", accelerator):  # no count: all of them
                return key, shape
            have = shape.count
            if count > have:
                what = shape.strategy.count_word
                raise ConfigError(
                    f"cluster {self.name!r} has {have} {key} {what}"
                    f"{'s' if have != 1 else ''}, not {count}",
                    hint=f"pass -a '{key} x{have}' or fewer",
                )
            return key, shape.with_count(count)
        if len(self.shapes) > 1:
            raise ConfigError(
                f"cluster {self.name!r} has several accelerator types: "
                f"{', '.join(sorted(self.shapes))}",
                hint="choose one with --accelerator",
            )
        return next(iter(self.shapes.items()))


# --- the cluster, from the GKE API ---------------------------------------------------
def find_cluster(clients: GcpClients, project: str, region: str, name: str) -> ClusterTarget:
    from rlctl.core.gcp.cluster import get_cluster, node_pools_of, slices_from_pools

    cur = get_cluster(clients, project, region, name)
    if cur is None:
        raise NotFoundError(
            f"cluster {name!r} not found in {project}/{region}",
            hint="list clusters with 'rlctl cluster list', or pass --project/--region",
        )
    if cur.status.name != "RUNNING":
        raise ConflictError(
            f"cluster {name!r} is {cur.status.name}, not RUNNING",
            hint=f"wait for it: 'rlctl cluster describe {name}'",
        )
    slices, networks = slices_from_pools(list(cur.node_pools))
    shapes = {
        s.accelerator.name: slice_shape(s.accelerator, s.count, s.threads_per_core) for s in slices
    }
    pools, unmodelled = node_pools_of(list(cur.node_pools))
    labels = dict(cur.resource_labels or {})
    return ClusterTarget(
        name=name,
        project=project,
        region=region,
        endpoint=cur.endpoint,
        ca_cert=cur.master_auth.cluster_ca_certificate or None,
        shapes=shapes,
        dcn_networks=networks,
        pools=pools,
        unmodelled=unmodelled,
        namespace=labels.get(NAMESPACE_LABEL),
        service_account=labels.get(KSA_LABEL),
    )


def assumed_cluster(
    project: str, region: str, cluster: str, accelerator: str | None, dcn_networks: int = 0
) -> GcpClients:
    """What a dry run of ``train --cluster`` without credentials plans against: an empty
    project holding only the cluster ``rlctl cluster create CLUSTER -a ACCELERATOR
    --dcn-networks N --bucket PROJECT-CLUSTER-runs`` would make, RUNNING, and that bucket."""
    from rlctl.core.clients import EmptyProject
    from rlctl.core.config.infra import CLUSTER_LABEL, MANAGED_BY, RLCTL, DcnSpec, InfraSpec
    from rlctl.core.gcp.cluster import planned_cluster

    if not accelerator:
        raise ConfigError(
            f"without Google Cloud credentials rlctl cannot read the node "
            f"pools of cluster {cluster}",
            hint="pass -a TYPE[ xN] to plan against the cluster 'rlctl cluster "
            f"create {cluster} -a TYPE' would make, e.g. -a 'v6e-16 x2'",
        )
    # pydantic's typed __init__ wants SliceSpecs; SliceSpec's validator parses 'TYPE xN'
    spec = InfraSpec(
        project=project,
        region=region,
        cluster=cluster,
        accelerators=[accelerator],  # type: ignore[list-item]  # parsed by SliceSpec
        dcn=DcnSpec(count=dcn_networks),
    )
    clients = EmptyProject(project, region)
    clients.clusters[cluster] = planned_cluster(clients, spec, backends.cluster_needs())
    clients.buckets[assumed_bucket(project, cluster)] = {MANAGED_BY: RLCTL, CLUSTER_LABEL: cluster}
    return clients


def assumed_bucket(project: str, cluster: str) -> str:
    return f"{project}-{cluster}-runs"


def kube_api(clients: GcpClients, target: ClusterTarget, namespace: str) -> KubeApi:
    return KubeApi(clients.kubernetes(target.endpoint, target.ca_cert), namespace)


def _location(ref: ClusterRef, recorded: dict[str, Any]) -> tuple[str, str]:
    """Flags, then what submit recorded, then env / gcloud config / ADC."""
    from rlctl.core.config.infra import resolve_location

    project = ref.project or recorded.get("project")
    region = ref.region or recorded.get("region")
    if project and region:
        return project, region
    from rlctl.core.clients import adc_project

    return resolve_location(None, project, region, adc_project=adc_project)


def _store(clients: GcpClients, uri: str) -> RunStore:
    if not uri.startswith("gs://"):
        raise ConfigError(
            f"a cluster run needs a gs:// run store, not {uri!r}",
            hint="pass --runs-dir gs://BUCKET/runs",
        )
    return open_store(uri, client=clients.storage)


# --- submit ------------------------------------------------------------------------
def _image_lines(
    clients: GcpClients, target: ClusterTarget, shape: SliceShape, image: str
) -> list[str]:
    """One line if the image is known to be missing (Artifact Registry images only)."""
    if image_exists(clients, image) is not False:
        return []
    name = rlctl_image(image, shape.kind) or shape.kind  # gpu, or its flavour gpu-vllm
    flavour = name[len(shape.kind) + 1 :]
    return [
        f"image {image} does not exist: run 'rlctl image build --cluster {target.name} "
        f"--region {target.region} --accelerator {shape.kind}"
        + (f" --with {flavour}'" if flavour else "'")
        + (
            ""
            if image.rsplit(":", 1)[-1] == default_tag(name)
            else ", then pass the image it prints with --image (or leave --image out)"
        )
    ]


def _version_key(tag: str) -> tuple[int, ...] | None:
    m = re.fullmatch(r"[a-z-]*?(\d+(?:\.\d+)*)", tag)
    return None if m is None else tuple(int(x) for x in m.group(1).split("."))


def newest_alike(tags: list[str], tag: str) -> str | None:
    """The newest of ``tags`` spelt like ``tag`` (``jax-0.10.0`` for ``jax-0.10.2``)."""
    prefix = re.sub(r"\d.*$", "", tag)
    alike = [t for t in tags if t.startswith(prefix) and _version_key(t) is not None]
    return max(alike, key=lambda t: _version_key(t) or ()) if alike else None


def pulled_image_lines(clients: GcpClients, backend: Backend, shape: SliceShape) -> list[str]:
    """One line per image the backend's controller pulls (``Backend.pulled_images``) that
    its registry says does not exist, with the newest tag spelt alike that does. An image
    that cannot be looked up from here (another registry, no access) is left to the pods."""
    from rlctl.core.errors import RlctlError
    from rlctl.core.gcp.image import image_exists, image_tags

    out = []
    for ref, what in backend.pulled_images(shape).items():
        try:
            if image_exists(clients, ref) is not False:
                continue
            repository, tag = ref.rsplit(":", 1)
            newest = newest_alike(image_tags(clients, repository) or [], tag)
        except RlctlError:
            continue
        out.append(
            f"image {ref} ({what}) does not exist in its registry"
            + (f"; the newest tag there is {newest}" if newest else "")
            + f": every pod that pulls it would fail after the nodes were made; use another "
            f"--backend (not {backend.name}), or an rlctl whose image pins a release with it"
        )
    return out


def _ready_or_raise(
    api: KubeApi, target: ClusterTarget, backend: Backend, opts: ClusterOptions, lines: list[str]
) -> None:
    """The pre-submit checks: the backend's CRD, the namespace, the KSA and the image
    are there.

    Without them the workload is refused with "the server could not find the
    requested resource", or its pods never start; each missing piece is one line
    naming the command that adds it (nothing is written before this passes).
    """
    from rlctl.core.errors import PreflightError
    from rlctl.core.k8s.controllers import missing_for_run

    lines = (
        missing_for_run(
            api, target.name, backend, opts.namespace, opts.service_account, target.region
        )
        + lines
    )
    if lines:
        raise PreflightError(lines)


class HostResources(BaseModel):
    """What one accelerator host's pod asks for, how far an elastic run may shrink, and
    the Kueue queue and priority it waits with (the name is older than the last two);
    None = the default (the machine type's allocatable from the catalog; every slice; no
    queue). Recorded in the run's status, so ``resume`` submits the same."""

    cpu: str | None = None
    memory: str | None = None
    min_slices: int | None = None
    queue: str | None = None  # Kueue: the LocalQueue the workload waits in
    priority: str | None = None  # Kueue: its WorkloadPriorityClass


def submit(
    clients: GcpClients,
    ref: ClusterRef,
    spec: RunSpec,
    backend: str,
    image: str | None,
    hf_token: str | None = None,
    dry_run: bool = False,
    resources: HostResources | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> SubmitResult | SubmitPreview:
    """Render (``dry_run``) or submit a run to ``ref.cluster``.

    A dry run returns a ``SubmitPreview`` (the manifests, no Secret value, nothing
    written); a submit ``submit_run``'s result with where the run went. Both first
    place the pods on the cluster's pools and compile the run's programs for its
    accelerator (``device_fit``: ``on_progress`` hears each compile), refusing a run
    that cannot fit before anything is written or applied.
    """
    res = resources or HostResources()
    chosen = backends.get(backend)  # resolved once; ConfigError naming the registered ones
    if not ref.cluster:
        raise ConfigError("no cluster given", hint="pass --cluster NAME")
    project, region = _location(ref, {})
    target = find_cluster(clients, project, region, ref.cluster)
    acc, shape = target.shape(ref.accelerator)
    # no --image: the one 'rlctl image build' makes of this rlctl for the accelerator
    # the vLLM flavour (rlctl-gpu-vllm) for a run that asks for vLLM, where rlctl makes one
    image = image or default_image(project, region, image_for(shape.kind, spec.rollout.engine))
    runs_dir = ref.runs_dir or f"gs://{runs_bucket(clients, project, target.name)}/{RUNS_PREFIX}"
    store = _store(clients, runs_dir)
    if res.min_slices is not None and res.min_slices > shape.num_slices:
        raise ConfigError(
            f"--min-slices {res.min_slices} is more than the cluster's "
            f"{shape.num_slices} {acc} slice(s)",
            hint=f"pass a number from 1 to {shape.num_slices}",
        )
    opts = ClusterOptions(
        image=image,
        namespace=ref.namespace or target.namespace or DEFAULT_NAMESPACE,
        service_account=target.service_account or DEFAULT_KSA,
        dcn_networks=target.dcn_networks,
        cpu=res.cpu or "",
        memory=res.memory or "",
        min_slices=res.min_slices or 1,
        queue=res.queue,
        priority=res.priority,
    )
    where = {
        "cluster": target.name,
        "project": project,
        "region": region,
        "accelerator": acc,
        "image": image,
    }
    # recorded for resume, which renders the workload again
    record = {**where, **res.model_dump(exclude_none=True)}
    engine = cluster_engine(spec.rollout.engine, shape.kind, image)
    # a pipelined run the pods' trainer would refuse is refused before anything renders
    pipelined = pipelined_notes(spec, shape, chosen, engine.name, acc)
    objs = render_run(spec, chosen, shape, store, opts, with_hf_secret=bool(hf_token))
    # every pod has a node before anything is written or applied (UnschedulableError)
    report, notes = check_placement(objs, target.pools, target.unmodelled, target.name, region, acc)
    notes = [f"rollout engine: {engine.why}", *notes, *pipelined]
    # device memory: the run's programs compiled for the accelerator (not here)
    from rlctl.core.clients import EmptyProject

    storage = None if isinstance(clients, EmptyProject) else clients.storage
    if not isinstance(clients, EmptyProject):  # the images the backend's controller pulls
        missing = pulled_image_lines(clients, chosen, shape)
        if missing:
            from rlctl.core.errors import PreflightError

            raise PreflightError(missing)
    # the learner's hosts (a generator host of its own runs the same programs' rollout)
    learner = learner_shape(spec, shape, acc)
    fit = device_fit.check(spec, acc, learner.count, engine.name, on_progress, storage)
    device_fit.refuse(fit)
    if dry_run:
        return SubmitPreview(
            **where,
            runs_dir=store.uri,
            manifests=objs,
            placements=report.placements,
            notes=notes,
            device_fit=fit,
        )
    from rlctl.core.gcp import preflight

    registry = (preflight.REGISTRY_API,) if ".pkg.dev/" in image else ()
    preflight.require_apis(clients, project, (*preflight.TRAIN_APIS, *registry))
    api = kube_api(clients, target, opts.namespace)
    lines = _image_lines(clients, target, shape, image)
    if opts.queue:
        from rlctl.core.k8s import kueue

        local = api.list(kueue.WORKLOAD_API, "LocalQueue")
        lines += [x for x in [kueue.missing_queue(local, opts.queue, opts.namespace)] if x]
    _ready_or_raise(api, target, chosen, opts, lines)
    out = submit_run(spec, chosen, shape, api, store, opts, hf_token=hf_token, record=record)
    return out.model_copy(
        update={**where, "placements": report.placements, "notes": notes, "device_fit": fit}
    )


def pipelined_notes(
    spec: RunSpec, shape: SliceShape, backend: Backend, engine: str, acc: str | None = None
) -> list[str]:
    """A pipelined run (rollout.placement=split|process or max_staleness >= 1) on a
    cluster: refused before anything is applied where the pods' trainer would refuse it
    after the accelerators were paid for, else the plan's line on how it is placed.

    A split runs in one process: one host, or Pathways' single controller over every
    host. A generator process of its own (``placement=process``) runs in pods of its
    own, for a backend that renders them (``Backend.generator_group``: a JobSet's second
    replicated job, a RayJob's second worker group): one host of the run's accelerator,
    the learner on the others, which must be one process for now (docs/async.md).
    ``acc``: the accelerator's catalog name, for the lines."""
    r = spec.rollout
    if not r.pipelined:
        return []
    if r.placement == "process":
        return [_generator_pods_line(spec, shape, backend, acc or shape.accelerator)]
    if engine not in ("vanilla", "auto"):
        raise ConfigError(
            "rollout.placement=split and rollout.max_staleness run rlctl's own sampler "
            f"for now, and this run's pods would pick rollout.engine={engine}",
            hint="--set rollout.placement=process (vLLM in generator pods of their own), "
            "or --set rollout.engine=vanilla (docs/async.md)",
        )
    if r.placement != "split":
        return [f"rollout: colocated, at most {r.max_staleness} version(s) behind"]
    if shape.total_hosts > 1 and not backend.single_controller:
        raise ConfigError(
            f"rollout.placement=split runs in one process for now; {shape.total_hosts} "
            f"hosts are {shape.total_hosts} processes on the {backend.name} backend",
            hint="--set rollout.placement=colocated (max_staleness works there too), "
            "--set rollout.placement=process (generator pods of their own), "
            "one host (-a 'TYPE x1' of a single-host type), or --backend pathways",
        )
    from rlctl.core.trainer.api import rollout_share

    chips = shape.chips_per_host * shape.total_hosts
    learner, generator = rollout_share(chips, r.devices)
    return [
        f"rollout: split, the generator on {generator} of the {chips} devices and the "
        f"learner on {learner}, at most {r.max_staleness} version(s) behind"
    ]


def _generator_pods_line(spec: RunSpec, shape: SliceShape, backend: Backend, acc: str) -> str:
    """The plan's line for generator pods of their own, or the refusal of a backend or
    shape they cannot run on (learner_shape says which shapes split)."""
    from rlctl.core.k8s import backends

    if not backend.generator_group:
        having = [b.name for b in backends.registered() if b.generator_group]
        raise ConfigError(
            f"rollout.placement=process on a cluster needs generator pods of their own, "
            f"which the {backend.name} backend does not render yet",
            hint=f"--backend {' or '.join(having)}, or rollout.placement=colocated (docs/async.md)",
        )
    learner = learner_shape(spec, shape, acc)
    if learner.total_hosts > 1:
        raise ConfigError(
            "rollout.placement=process needs a learner of one process for now; "
            f"{acc} x{shape.count} leaves {learner.total_hosts} learner hosts",
            hint=f"-a '{acc} x2' (one learns, one generates), or "
            "rollout.placement=colocated (docs/async.md)",
        )
    return (
        f"rollout: process, the learner on one {acc} host and the generator "
        f"on another (the workload's generator pods), weights and trajectories through "
        f"the run store, at most {spec.rollout.max_staleness} version(s) behind"
    )


# --- an existing run ------------------------------------------------------------------
@dataclass
class OpenRun:
    store: RunStore
    run: RunDir
    status: dict[str, Any]
    target: ClusterTarget | None = None
    api: KubeApi | None = None

    @property
    def backend(self) -> Backend | None:
        """The backend status.json records, resolved (None: a local run, or one this
        rlctl has no backend for)."""
        return backends.resolve(self.status.get("backend"))


def is_cluster_run(status: dict[str, Any]) -> bool:
    """Whether the run was submitted to a cluster; a local run may keep its store on gs://."""
    return backends.is_backend(status.get("backend"))


def open_run(clients: GcpClients, ref: ClusterRef, name: str, connect: bool = True) -> OpenRun:
    """The run's store, status.json and (``connect``) its cluster's Kubernetes API."""
    recorded: dict[str, Any] = {}
    runs_dir = ref.runs_dir
    if not runs_dir:
        if not ref.cluster:
            raise ConfigError(
                "where is the run? no gs:// run store and no cluster given",
                hint="pass --runs-dir gs://BUCKET/runs or --cluster NAME",
            )
        project, _ = _location(ref, {})
        runs_dir = f"gs://{runs_bucket(clients, project, ref.cluster)}/{RUNS_PREFIX}"
    store = _store(clients, runs_dir)
    run = store.existing(name)
    recorded = read_status(run)
    opened = OpenRun(store, run, recorded)
    if not connect or not is_cluster_run(recorded):
        return opened
    cluster = ref.cluster or recorded.get("cluster")
    if not cluster:
        raise ConfigError(
            f"run {name!r} does not say which cluster it runs on", hint="pass --cluster NAME"
        )
    project, region = _location(ref, recorded)
    opened.target = find_cluster(clients, project, region, cluster)
    namespace = ref.namespace or recorded.get("namespace") or DEFAULT_NAMESPACE
    opened.api = kube_api(clients, opened.target, namespace)
    return opened


def _require_cluster(o: OpenRun, what: str) -> KubeApi:
    if o.api is None:
        raise ConfigError(
            f"run {o.run.name!r} ran on this machine (backend "
            f"{o.status.get('backend', 'local')!r}): {what} is for cluster runs",
            hint=f"use 'rlctl status {o.run.name}' with a local --runs-dir",
        )
    return o.api


def describe(
    clients: GcpClients, ref: ClusterRef, name: str, curve: bool = False
) -> RunInfo | ClusterRunInfo:
    """The run store's view merged with the workload's state (phase, reason, pods);
    a run trained on this machine (its store on gs://) gets the store's view only.
    ``curve`` adds the learning curve (metrics and evals, read from the store)."""
    from rlctl.core.runs.status import describe_run

    o = open_run(clients, ref, name)
    if o.api is None:
        return describe_run(o.run, curve=curve)
    info = describe_cluster_run(name, o.api, o.store, o.backend, curve=curve)
    backend = o.backend.name if o.backend is not None else None
    return info.model_copy(update={"cluster": o.status.get("cluster"), "backend": backend})


def list_store(clients: GcpClients, ref: ClusterRef) -> tuple[str, list[RunInfo]]:
    """(store URI, runs) of a gs:// run store (store view only, no cluster calls)."""
    from rlctl.core.runs.status import list_runs

    if not ref.runs_dir:
        if not ref.cluster:
            raise ConfigError(
                "no gs:// run store and no cluster given",
                hint="pass --runs-dir gs://BUCKET/runs or --cluster NAME",
            )
        project, _ = _location(ref, {})
        runs_dir = f"gs://{runs_bucket(clients, project, ref.cluster)}/{RUNS_PREFIX}"
    else:
        runs_dir = ref.runs_dir
    store = _store(clients, runs_dir)
    return store.uri, list_runs(store)


def logs(
    clients: GcpClients, ref: ClusterRef, name: str, tail: int = 100, log: str = LOG
) -> LogTail:
    """The last ``tail`` lines of the run's own log (train.log in its run store, which
    the pods' trainer appends to whatever the backend); before the trainer has written
    one, those of its leading pod (``trainer_logs``). ``log`` = generator.log: the
    generator pods' lines, which they keep in the run store too."""
    from rlctl.core.runs.run_log import read_log, tail_lines

    o = open_run(clients, ref, name)
    api = _require_cluster(o, "logs")
    text = read_log(o.run, log)
    if text is not None:
        return LogTail(run=name, log=f"{o.run.uri}/{log}", lines=tail_lines(text, tail))
    if log != LOG:
        raise NotFoundError(
            f"run {name!r} has no {log} in {o.run.uri}: only a run with "
            "rollout.placement=process has generator pods, and they write it once started",
            hint=f"'rlctl status {name}' says whether its pods run",
        )
    pod, text = trainer_logs(api, name, tail, o.backend)
    return LogTail(run=name, pod=pod, lines=text.splitlines())


def _new_lines(seen: list[str], lines: list[str]) -> list[str]:
    """The lines of a fresh tail after what was already shown (matched by the last
    few shown lines; when they scrolled out of the window, all of it)."""
    for k in range(min(len(seen), 5), 0, -1):
        tail = seen[-k:]
        for i in range(len(lines) - k, -1, -1):
            if lines[i : i + k] == tail:
                return lines[i + k :]
    return lines


def follow_logs(
    clients: GcpClients,
    ref: ClusterRef,
    name: str,
    tail: int = 100,
    interval: float = 2.0,
    sleep: Callable[[float], None] | None = None,
    window: int = 1000,
    log: str = LOG,
) -> Iterator[str]:
    """Yield log lines as they appear, polling every ``interval`` seconds, until the
    workload has finished (completed, failed, gone). The run store's train.log once the
    trainer has written one (its whole lines, by offset), the leading pod's log until
    then. The workload's phase is read before the log each round, so every line written
    before the end is shown. Ctrl-C is the caller's. ``log`` = generator.log: the
    generator pods' lines in the store (no pod fallback: they write it as they start)."""
    from rlctl.core.runs.run_log import read_log

    o = open_run(clients, ref, name)
    api = _require_cluster(o, "logs")
    seen: list[str] = []  # pod lines shown (the fallback)
    shown: int | None = None  # characters of train.log shown; None: not read yet
    first = True
    while True:
        ended = describe_workload(api, name, o.backend).phase.finished
        text = read_log(o.run, log)
        if text is None and log != LOG:
            text = ""  # not started yet: nothing to show, as an empty file
        if text is not None:
            if shown is None or len(text) < shown:  # first sight, or the file restarted
                lines = text[: text.rfind("\n") + 1].splitlines()
                new = lines[-tail:] if first and tail else lines
                shown = text.rfind("\n") + 1
            else:
                cut = len(text) if ended else text.rfind("\n", shown) + 1
                new = text[shown:cut].splitlines() if cut > shown else []
                shown = max(shown, cut)
            yield from new
        else:
            try:
                _, pod_text = trainer_logs(api, name, tail if first else window, o.backend)
            except NotFoundError:
                pod_text = ""  # no pod yet (pending) or already gone
            lines = pod_text.splitlines()
            new = lines if first else _new_lines(seen, lines)
            yield from new
            seen = (seen + new)[-window:]
        first = False
        if ended:
            return
        (sleep or time.sleep)(interval)  # looked up per call, so tests can stub it


# --- resume and delete ----------------------------------------------------------------
def resume(
    clients: GcpClients,
    ref: ClusterRef,
    name: str,
    hf_token: str | None = None,
    image: str | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> ResumeResult:
    """Re-submit a stopped cluster run from its latest complete checkpoint, with the
    backend, image and accelerator recorded at submit (``image`` overrides).

    The checks of a submit run again first, since the image, the accelerator (a
    cluster's pools change) or spec.yaml may have changed since: each pod has a node,
    the engine suits the image, and the run's programs fit the accelerator's memory
    (``device_fit``: ``on_progress`` hears each compile)."""
    o = open_run(clients, ref, name)
    api = _require_cluster(o, "this resume")
    assert o.target is not None and o.backend is not None
    acc, shape = o.target.shape(ref.accelerator or o.status.get("accelerator"))
    image = image or o.status.get("image")
    if not image:
        raise ConfigError(f"run {name!r} records no image", hint="pass --image")
    opts = ClusterOptions(
        image=image,
        namespace=api.namespace,
        service_account=o.status.get("service_account") or DEFAULT_KSA,
        dcn_networks=o.target.dcn_networks,
        cpu=o.status.get("cpu") or "",
        memory=o.status.get("memory") or "",
        min_slices=min(int(o.status.get("min_slices") or 1), shape.num_slices),
        queue=o.status.get("queue"),
        priority=o.status.get("priority"),
    )
    from rlctl.core.runs.local import load_run_spec

    spec = load_run_spec(o.run)
    engine = cluster_engine(spec.rollout.engine, shape.kind, image)
    pipelined_notes(spec, shape, o.backend, engine.name, acc)  # refuses what pods would
    objs = render_run(spec, o.backend, shape, o.store, opts, with_hf_secret=bool(hf_token))
    check_placement(objs, o.target.pools, o.target.unmodelled, o.target.name, o.target.region, acc)
    learner = learner_shape(spec, shape, acc)
    device_fit.refuse(
        device_fit.check(spec, acc, learner.count, engine.name, on_progress, clients.storage)
    )
    out = resume_run(name, o.backend, shape, api, o.store, opts, hf_token=hf_token)
    return out.model_copy(update={"cluster": o.target.name, "accelerator": acc})


def plan_delete(clients: GcpClients, ref: ClusterRef, name: str, purge: bool = False) -> Plan:
    """What ``delete`` removes, as deletes: the run's rlctl-labelled objects (and, with
    ``purge``, its folder in the run store). Refuses (NotFoundError) when there is none."""
    o = open_run(clients, ref, name)
    api = _require_cluster(o, "delete run")
    assert o.target is not None
    changes = plan_delete_run(name, api, o.store, purge)
    if not changes:
        raise NotFoundError(
            f"nothing to delete for run {name!r}: no rlctl-labelled objects",
            hint="pass --purge to also remove its files from the run store" if not purge else None,
        )
    notes = [
        f"run {name} on cluster {o.target.name}, namespace {api.namespace}: the shared "
        f"ServiceAccount and objects not labelled rlctl.dev/run={name} stay"
    ]
    if not purge:
        notes.append(f"the run's files in {o.run.uri} stay (--purge deletes them)")
    return Plan(
        operation="delete",
        target=name,
        project=o.target.project,
        location=o.target.region,
        changes=changes,
        notes=notes,
    )


def delete(
    clients: GcpClients,
    ref: ClusterRef,
    plan: Plan,
    on_event: Callable[[str, str, str], None] | None = None,
) -> ApplyResult:
    """Apply ``plan_delete``'s plan: the keys of what was removed."""
    o = open_run(clients, ref, plan.target)
    api = _require_cluster(o, "delete run")
    return ApplyResult.of(plan, apply_delete_run(plan.pending(), api, o.store, on_event))


def hf_token_from_env(env: Any = None) -> str | None:
    """The Hugging Face token for gated models: ``$HF_TOKEN`` only, never a flag."""
    env = os.environ if env is None else env
    return env.get(HF_TOKEN_ENV) or None
