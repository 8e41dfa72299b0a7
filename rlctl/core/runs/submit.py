"""Runs on a cluster: submit, resume (re-submit), describe and delete.

Called by ``core/runs/cluster.py`` (itself called by ``cli/train.py`` and
``cli/runs.py``), which resolves the cluster (endpoint, CA, token -> ``KubeApi``),
the accelerator shape (``gcp.cluster.slices_from_pools`` -> ``SliceShape``) and the
run store (``open_store(gs://...)``); these functions only write the run store and
talk to the Kubernetes API they are given.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from rlctl.core.config.infra import DEFAULT_KSA, DEFAULT_NAMESPACE
from rlctl.core.config.models import RunSpec
from rlctl.core.errors import ConfigError, ConflictError, NotFoundError
from rlctl.core.image.context import image_vllm
from rlctl.core.k8s.apply import (
    KubeApi,
    apply_objects,
    delete_objects,
    describe_workload,
    find_workload,
    hf_token_secret,
    list_run_objects,
)
from rlctl.core.k8s.backends.base import Backend
from rlctl.core.k8s.render import WorkloadView, make_view, render_workload
from rlctl.core.k8s.shapes import SliceShape
from rlctl.core.k8s.validate import validate_manifests
from rlctl.core.names import generate_run_name
from rlctl.core.phases import Phase
from rlctl.core.plan import Change
from rlctl.core.runs.results import ClusterRunInfo, ResumeResult, SubmitResult
from rlctl.core.runs.spec import write_new_run
from rlctl.core.store.base import STATUS, RunDir, RunStore, latest_checkpoint_step
from rlctl.core.store.records import status_text
from rlctl.core.trainer.api import Engine
from rlctl.core.trainer.api import pick_engine as pick

RUN_FILES = "files"  # Change.kind of a run's folder in the run store


class ClusterOptions(BaseModel):
    """Submission settings that are not part of the RunSpec."""

    image: str
    namespace: str = DEFAULT_NAMESPACE
    service_account: str = DEFAULT_KSA
    max_restarts: int = 3
    min_slices: int = 1
    queue: str | None = None  # Kueue LocalQueue
    priority: str | None = None  # Kueue WorkloadPriorityClass
    dcn_networks: list[str] = []
    cpu: str = ""  # '' = from the catalog (the machine type's allocatable)
    memory: str = ""


def hf_secret_name(run: str) -> str:
    return f"{run}-hf-token"


def rlctl_image(image: str, kind: str) -> str | None:
    """Which of the images ``rlctl image build`` makes for ``kind`` ``image`` is (its
    name is ``rlctl-<kind>[-<flavour>]``, gcp/image.py ``image_uri``): ``gpu``,
    ``gpu-vllm``, whose lock says what it installs; None for another image."""
    from rlctl.core.image.context import image_names

    found = re.search(rf"/rlctl-({re.escape(kind)}(-[a-z0-9]+)?)(:[^/]*)?(@[^/]*)?$", image)
    return found.group(1) if found and found.group(1) in image_names() else None


def image_for(kind: str, engine: str) -> str:
    """The rlctl image a run with ``rollout.engine=engine`` on ``kind`` runs by default:
    the vLLM flavour when one asks for vLLM and rlctl makes it (gpu-vllm), else the
    kind's."""
    from rlctl.core.image.context import image_names

    flavoured = f"{kind}-vllm"
    return flavoured if engine == "vllm" and flavoured in image_names() else kind


def cluster_engine(requested: str, kind: str, image: str) -> Engine:
    """The rollout engine the pods' trainer picks, decided before anything is applied:
    ``engines.pick`` on the accelerator, with the vLLM rlctl's image for it installs
    (its lock). A run asking for vLLM where the image has none fails here, not after
    the slice has been provisioned. Another ``--image`` is the user's: what it carries is
    not known here, and the pods decide (the run's first lines say what they picked)."""
    name = rlctl_image(image, kind)
    if name is None:
        return Engine(
            requested,
            f"rollout.engine={requested}: decided in the pods ({image} is not an rlctl image)",
        )
    try:
        return pick(requested, kind, image_vllm(name), image=image)
    except ConfigError as e:
        flavoured = image_for(kind, requested)
        if flavoured == name:
            raise
        raise ConfigError(
            e.message,
            hint=f"build rlctl-{flavoured} ('rlctl image build -a {kind} --with vllm') and "
            "leave --image out (train picks it), or --set rollout.engine=auto",
        ) from None


def learner_shape(spec: RunSpec, shape: SliceShape, name: str | None = None) -> SliceShape:
    """The learner's part of ``shape``: all of it, but for a run whose generator has pods
    of its own (``rollout.placement=process``), where one host of the accelerator
    generates and the rest learn (``cluster.pipelined_notes`` refuses the shapes this
    cannot split before anything renders). ``name``: the accelerator's catalog name, for
    the hints."""
    if spec.rollout.placement != "process":
        return shape
    kind = shape.strategy
    if kind.multislice_needs_multi_host:
        # its groups are slices: a single-host slice cannot be one of several pools
        # (catalog.multislice_refusal), a multi-host one is more than the one host a
        # generator process runs on
        raise ConfigError(
            f"rollout.placement=process on a cluster needs a {name or shape.accelerator} "
            f"{kind.count_word} of one host of its own beside the learner's, which a "
            f"{kind.name.upper()} cluster cannot have (GKE's Multislice joins "
            "multi-host slices only)",
            hint="rollout.placement=split (one host, one process) or colocated, or a GPU "
            "cluster (docs/async.md)",
        )
    if shape.count < 2:
        raise ConfigError(
            f"rollout.placement=process on a cluster needs a {kind.count_word} for the "
            f"generator beside the learner's; this run has one",
            hint=f"a cluster of {name or 'TYPE'} x2 (one learns, one generates), or "
            "rollout.placement=colocated (docs/async.md)",
        )
    return shape.with_count(shape.count - 1)


def build_view(
    spec: RunSpec,
    backend: Backend,
    shape: SliceShape,
    run_uri: str,
    opts: ClusterOptions,
    with_hf_secret: bool,
) -> WorkloadView:
    assert spec.name is not None
    return make_view(
        rollout_engine=cluster_engine(spec.rollout.engine, shape.kind, opts.image).name,
        run=spec.name,
        namespace=opts.namespace,
        backend=backend,
        image=opts.image,
        run_uri=run_uri,
        shape=learner_shape(spec, shape),
        generator=spec.rollout.placement == "process",
        service_account=opts.service_account,
        hf_secret=hf_secret_name(spec.name) if with_hf_secret else None,
        max_restarts=opts.max_restarts,
        min_slices=opts.min_slices,
        queue=opts.queue,
        priority=opts.priority,
        dcn_networks=opts.dcn_networks,
        cpu=opts.cpu,
        memory=opts.memory,
        gcs_buckets=mounted_buckets(spec),
    )


def render_run(
    spec: RunSpec,
    backend: Backend,
    shape: SliceShape,
    store: RunStore,
    opts: ClusterOptions,
    with_hf_secret: bool = False,
) -> list[dict[str, Any]]:
    """The validated manifests of a run (what ``--dry-run`` prints). No Secret value."""
    if not store.uri.startswith("gs://"):
        raise ConfigError(
            f"a cluster run needs a gs:// run store, not {store.uri!r}",
            hint="pass --runs-dir gs://BUCKET/runs",
        )
    spec = _named(spec, store)
    assert spec.name is not None
    view = build_view(spec, backend, shape, store.run(spec.name).uri, opts, with_hf_secret)
    objs = render_workload(view)
    validate_manifests(objs)
    return objs


def _named(spec: RunSpec, store: RunStore | None = None) -> RunSpec:
    """The spec as the pods will run it: named, with output.root = the run store, and
    gs:// inputs read through the pods' GCS FUSE mounts (``pod_inputs``)."""
    if not spec.name:
        spec = spec.model_copy(update={"name": generate_run_name(spec.algorithm)})
    if store is not None and spec.output.root != store.uri:
        spec = spec.model_copy(
            update={"output": spec.output.model_copy(update={"root": store.uri})}
        )
    return pod_inputs(spec)


# --- inputs on gs:// ------------------------------------------------------------------
# GKE's GCS FUSE CSI driver (enabled by 'cluster create') mounts each bucket an input
# lives in at /gcs/BUCKET in every trainer container, so the trainer reads a gs:// model
# folder or data file as the local path it already knows how to read.
GCS_MOUNT = "/gcs"


def _gs_to_mount(uri: str) -> str:
    return f"{GCS_MOUNT}/{uri[len('gs://') :]}"


def pod_inputs(spec: RunSpec) -> RunSpec:
    """The spec with ``gs://`` model/data paths as their mount paths in the pods.

    A file or folder on this machine cannot be read by the pods: it is refused with the
    command that copies it to a bucket (never silently ignored).
    """
    from pathlib import Path

    from rlctl.core.config.models import DEFAULT_MODEL

    fields = {
        "model.source": spec.model.source,
        "data.path": spec.data.path,
        "data.eval_path": spec.data.eval_path,
    }
    new: dict[str, str] = {}
    for key, value in fields.items():
        if not value or value.startswith(f"{GCS_MOUNT}/"):
            continue
        if value.startswith("gs://"):
            if len(value) <= len("gs://") or value[len("gs://") :].startswith("/"):
                raise ConfigError(f"{key}={value!r} names no bucket", hint="use gs://BUCKET/PATH")
            new[key] = _gs_to_mount(value)
            continue
        local = key != "model.source" or (
            value != DEFAULT_MODEL and Path(value).expanduser().exists()
        )
        if local:
            flag = {
                "model.source": "--model",
                "data.path": "--data-path",
                "data.eval_path": "--set data.eval_path=",
            }[key]
            raise ConfigError(
                f"{key}={value!r} is a path on this machine; the cluster's pods cannot read it",
                hint=f"copy it to a bucket the run's service account can read (e.g. "
                f"'gcloud storage cp -r {value} gs://BUCKET/inputs/') and pass {flag} "
                "gs://BUCKET/inputs/...",
            )
    if not new:
        return spec
    model = spec.model.model_copy(update={"source": new.get("model.source", spec.model.source)})
    data = spec.data.model_copy(
        update={
            "path": new.get("data.path", spec.data.path),
            "eval_path": new.get("data.eval_path", spec.data.eval_path),
        }
    )
    return spec.model_copy(update={"model": model, "data": data})


def mounted_buckets(spec: RunSpec) -> list[str]:
    """The buckets the pods mount: those of the spec's /gcs/BUCKET/... inputs."""
    out: list[str] = []
    for value in (spec.model.source, spec.data.path, spec.data.eval_path):
        if value and value.startswith(f"{GCS_MOUNT}/"):
            bucket = value[len(GCS_MOUNT) + 1 :].split("/", 1)[0]
            if bucket and bucket not in out:
                out.append(bucket)
    return out


def _apply(api: KubeApi, run: str, objs: list[dict[str, Any]], hf_token: str | None) -> list[str]:
    if hf_token:
        # the Secret goes first, so the pods never start without it
        objs = [objs[0], hf_token_secret(run, hf_token, hf_secret_name(run)), *objs[1:]]
    return apply_objects(api, objs)


def submit_run(
    spec: RunSpec,
    backend: Backend,
    shape: SliceShape,
    k8s_api: KubeApi,
    store: RunStore,
    opts: ClusterOptions,
    hf_token: str | None = None,
    record: dict[str, Any] | None = None,
) -> SubmitResult:
    """Write the spec to the run store, then create/apply the run's objects.

    ``record`` adds fields to status.json (the CLI records the cluster, project,
    region, image and accelerator, so status/logs/resume/delete find it again).
    Returns the run's name, folder, backend and what was applied ('Kind/name (action)').
    Raises AlreadyExistsError when the run name is taken in the store.
    """
    spec = _named(spec, store)
    assert spec.name is not None
    name = spec.name
    objs = render_run(spec, backend, shape, store, opts, with_hf_secret=bool(hf_token))
    run = write_new_run(store, spec)
    run.write_text(
        STATUS,
        status_text(
            {
                "name": name,
                "phase": Phase.PENDING,
                "algorithm": spec.algorithm,
                "total_steps": spec.training.steps,
                "step": 0,
                "latest_checkpoint": None,
                "backend": backend.name,
                "namespace": opts.namespace,
                "service_account": opts.service_account,
                **(record or {}),
            }
        ),
    )
    applied = _apply(k8s_api, name, objs, hf_token)
    return SubmitResult(name=name, path=run.uri, backend=backend.name, applied=applied)


def resume_run(
    name: str,
    backend: Backend,
    shape: SliceShape,
    k8s_api: KubeApi,
    store: RunStore,
    opts: ClusterOptions,
    hf_token: str | None = None,
) -> ResumeResult:
    """Re-submit a run that stopped: from its latest complete checkpoint in the store.

    Refuses (ConflictError) while its workload is pending or running, and when
    the run has no complete checkpoint. A finished or failed workload object is
    deleted first (a JobSet/RayJob does not start again when re-applied).
    """
    from rlctl.core.runs.local import load_run_spec

    run = store.existing(name)
    spec = load_run_spec(run)
    step = latest_checkpoint_step(run)
    if step is None:
        raise ConflictError(
            f"run {name!r} has no complete checkpoint in {run.uri}",
            hint=f"start it again with 'rlctl delete run {name} --purge' and 'rlctl train'",
        )
    state = describe_workload(k8s_api, name, backend)
    if state.phase.active:
        raise ConflictError(
            f"run {name!r} is still {state.phase} on the cluster",
            hint=f"wait for it, or 'rlctl delete run {name}' first",
        )
    old = find_workload(k8s_api, name)
    if old is not None:
        k8s_api.delete(old["apiVersion"], old["kind"], old["metadata"]["name"])
    objs = render_run(spec, backend, shape, store, opts, with_hf_secret=bool(hf_token))
    applied = _apply(k8s_api, name, objs, hf_token)
    return ResumeResult(
        name=name, path=run.uri, backend=backend.name, checkpoint=step, applied=applied
    )


def describe_cluster_run(
    name: str,
    k8s_api: KubeApi,
    store: RunStore,
    backend: Backend | None = None,
    curve: bool = False,
) -> ClusterRunInfo:
    """The run store's view of a run merged with its workload's state on the cluster
    (``curve``: with its learning curve, read from the store)."""
    from rlctl.core.runs.status import describe_run

    info = describe_run(store.existing(name), curve=curve)
    state = describe_workload(k8s_api, name, backend)
    phase = info.phase
    workload = state.phase
    if workload in (Phase.PENDING, Phase.FAILED) or (
        workload == Phase.RUNNING and phase in (Phase.PENDING, Phase.UNKNOWN)
    ):
        phase = workload
    reason = state.reason or None
    if phase.finished and workload == Phase.RUNNING and backend and not backend.finishes:
        reason = (  # an LWS's pods idle once the run is over: they still hold the nodes
            f"the run is over; its {backend.kind} keeps its pods and their nodes until "
            f"'rlctl delete run {name}'"
        )
    return ClusterRunInfo(**{**dict(info), "phase": phase}, workload=state, reason=reason)


def plan_delete_run(
    name: str, k8s_api: KubeApi, store: RunStore | None = None, purge: bool = False
) -> list[Change]:
    """What ``delete_run`` removes: the run's rlctl-labelled objects, then (``purge``)
    its folder in the run store, which waits for them (a live pod would write again)."""
    changes = [
        Change(kind=kind, name=n, action="delete", body={"apiVersion": api_version})
        for api_version, kind, n in list_run_objects(k8s_api, name)
    ]
    if purge and store is not None:
        run: RunDir = store.run(name)
        if run.exists():
            changes.append(
                Change(
                    kind=RUN_FILES,
                    name=run.uri,
                    action="delete",
                    depends_on=[c.key for c in changes],
                    body={"run": name},
                )
            )
    return changes


def apply_delete_run(
    changes: list[Change],
    k8s_api: KubeApi,
    store: RunStore | None = None,
    on_event: Callable[[str, str, str], None] | None = None,
) -> list[str]:
    """Delete what ``plan_delete_run`` planned, in order; the keys of what was removed
    (an object already gone is not). ``on_event(key, 'start'|'done', info)``."""
    notify = on_event or (lambda *a: None)
    removed = []
    for c in changes:
        notify(c.key, "start", c.action)
        body = c.body or {}
        if c.kind == RUN_FILES:
            run = store.run(body["run"]) if store is not None else None
            deleted = run is not None and run.exists()
            if run is not None and deleted:
                run.delete("")
        else:
            deleted = bool(delete_objects(k8s_api, [(body["apiVersion"], c.kind, c.name)]))
        if deleted:
            removed.append(c.key)
        notify(c.key, "done", "")
    return removed


def delete_run(
    name: str, k8s_api: KubeApi, store: RunStore | None = None, purge: bool = False
) -> list[str]:
    """Delete the run's rlctl-labelled objects (workload, ConfigMap, Secret, DRANET claim)
    and, only with ``purge``, its run store files. Returns the keys of what was removed.

    The shared ServiceAccount and anything without ``rlctl.dev/run=NAME`` stay.
    """
    removed = apply_delete_run(plan_delete_run(name, k8s_api, store, purge), k8s_api, store)
    if not removed:
        raise NotFoundError(f"nothing to delete for run {name!r}")
    return removed
