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

from rlctl.core.config.infra import (
    CLUSTER_LABEL,
    DEFAULT_KSA,
    DEFAULT_NAMESPACE,
    KSA_LABEL,
    MANAGED_BY,
    NAMESPACE_LABEL,
    RLCTL,
)
from rlctl.core.config.models import RunSpec
from rlctl.core.errors import ConfigError, ConflictError, NotFoundError
from rlctl.core.gcp.catalog import Accelerator, all_types, lookup
from rlctl.core.k8s.apply import KubeApi, describe_workload, trainer_logs
from rlctl.core.k8s.shapes import SliceShape
from rlctl.core.runs.status import read_status
from rlctl.core.runs.store import RunDir, RunStore, open_store
from rlctl.core.runs.submit import (
    ClusterOptions,
    delete_run,
    describe_cluster_run,
    plan_delete_run,
    render_run,
    resume_run,
    submit_run,
)

BACKENDS = ("jobset", "pathways", "ray")
RUNS_PREFIX = "runs"
HF_TOKEN_ENV = "HF_TOKEN"
FINISHED = {"completed", "failed", "absent", "suspended"}


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
    namespace: str | None = None  # as 'cluster create' recorded them (None: older clusters)
    service_account: str | None = None

    def shape(self, accelerator: str | None = None) -> tuple[str, SliceShape]:
        """(catalog name, shape) of the accelerator pools to run on."""
        if not self.shapes:
            raise ConfigError(f"cluster {self.name!r} has no TPU or GPU node pool",
                              hint=f"add one with 'rlctl cluster create {self.name} -a v6e-16'")
        if accelerator:
            key = lookup(accelerator).name
            if key not in self.shapes:
                raise ConfigError(f"cluster {self.name!r} has no {key} node pool",
                                  hint=f"it has: {', '.join(sorted(self.shapes))}")
            return key, self.shapes[key]
        if len(self.shapes) > 1:
            raise ConfigError(f"cluster {self.name!r} has several accelerator types: "
                              f"{', '.join(sorted(self.shapes))}",
                              hint="choose one with --accelerator")
        return next(iter(self.shapes.items()))


# --- the cluster, from the GKE API ---------------------------------------------------
def _pool_accelerator(pool: Any) -> Accelerator | None:
    """The catalog entry of a node pool (None for CPU pools).

    rlctl names its pools ``<type>-<i>``; other pools are matched by machine
    type and TPU topology (a single-host TPU pool may have no placement policy).
    """
    machine = pool.config.machine_type
    topology = pool.placement_policy.tpu_topology or None
    base = re.sub(r"-\d+$", "", pool.name)
    try:
        acc = lookup(base)
        if acc.machine_type == machine and (topology is None or acc.topology == topology):
            return acc
    except ConfigError:
        pass
    found = [a for a in all_types() if a.machine_type == machine
             and (a.kind == "gpu" or (a.topology == topology if topology else a.hosts == 1))]
    return found[0] if len(found) == 1 else None


def shapes_from_pools(pools: list[Any]) -> tuple[dict[str, SliceShape], list[str]]:
    """({catalog name: SliceShape}, DCN network names) from GKE node pools.

    TPU: one pool per slice, so identical pools add slices. GPU: the nodes of
    all pools of one machine type form one group.
    """
    groups: dict[str, tuple[Accelerator, int, int]] = {}  # name -> (acc, pools, nodes)
    networks: list[str] = []
    for p in pools:
        acc = _pool_accelerator(p)
        if acc is None:
            continue
        _, n_pools, nodes = groups.get(acc.name, (acc, 0, 0))
        groups[acc.name] = (acc, n_pools + 1, nodes + int(p.initial_node_count or 0))
        for net in p.network_config.additional_node_network_configs:
            if net.network and net.network.rsplit("/", 1)[-1] not in networks:
                networks.append(net.network.rsplit("/", 1)[-1])
    shapes = {}
    for name, (acc, n_pools, nodes) in groups.items():
        if acc.kind == "tpu":
            shapes[name] = SliceShape(
                kind="tpu", accelerator=acc.gke_accelerator or "", machine_type=acc.machine_type,
                topology=acc.topology, hosts_per_slice=acc.hosts,
                chips_per_host=acc.chips_per_host, num_slices=n_pools)
        else:
            shapes[name] = SliceShape(
                kind="gpu", accelerator=acc.gpu_type or "", machine_type=acc.machine_type,
                hosts_per_slice=max(nodes, 1), chips_per_host=acc.gpus)
    return shapes, networks


def find_cluster(clients: Any, project: str, region: str, name: str) -> ClusterTarget:
    from rlctl.core.gcp.cluster import get_cluster

    cur = get_cluster(clients, project, region, name)
    if cur is None:
        raise NotFoundError(f"cluster {name!r} not found in {project}/{region}",
                            hint="list clusters with 'rlctl cluster list', or pass "
                            "--project/--region")
    if cur.status.name != "RUNNING":
        raise ConflictError(f"cluster {name!r} is {cur.status.name}, not RUNNING",
                            hint=f"wait for it: 'rlctl cluster describe {name}'")
    shapes, networks = shapes_from_pools(list(cur.node_pools))
    labels = dict(cur.resource_labels or {})
    return ClusterTarget(name=name, project=project, region=region, endpoint=cur.endpoint,
                         ca_cert=cur.master_auth.cluster_ca_certificate or None,
                         shapes=shapes, dcn_networks=networks,
                         namespace=labels.get(NAMESPACE_LABEL),
                         service_account=labels.get(KSA_LABEL))


def runs_bucket(clients: Any, project: str, cluster: str) -> str:
    """The bucket ``rlctl cluster create --bucket`` made for the cluster (by label)."""
    from rlctl.core.gcp.operations import call

    found = [b.name for b in call(clients, "listing buckets", clients.storage.list_buckets,
                                  project=project)
             if (b.labels or {}).get(MANAGED_BY) == RLCTL
             and (b.labels or {}).get(CLUSTER_LABEL) == cluster]
    if not found:
        raise ConfigError(f"cluster {cluster!r} has no run bucket made by rlctl",
                          hint="pass --runs-dir gs://BUCKET/runs, or create one with "
                          f"'rlctl cluster create {cluster} --bucket NAME'")
    return sorted(found)[0]


def kube_api(clients: Any, target: ClusterTarget, namespace: str) -> KubeApi:
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


def _store(clients: Any, uri: str) -> RunStore:
    if not uri.startswith("gs://"):
        raise ConfigError(f"a cluster run needs a gs:// run store, not {uri!r}",
                          hint="pass --runs-dir gs://BUCKET/runs")
    return open_store(uri, client=clients.storage)


# --- submit ------------------------------------------------------------------------
def submit(clients: Any, ref: ClusterRef, spec: RunSpec, backend: str, image: str | None,
           hf_token: str | None = None, dry_run: bool = False) -> dict[str, Any]:
    """Render (``dry_run``) or submit a run to ``ref.cluster``.

    Returns {"manifests": [...]} for a dry run (no Secret value, nothing written),
    else ``submit_run``'s result plus the cluster and accelerator.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"--backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    if not image:
        raise ConfigError("a cluster run needs a container image",
                          hint="pass --image REGISTRY/rlctl:TAG (or set RLCTL_IMAGE); "
                          "build one with the Dockerfile in the repository")
    if not ref.cluster:
        raise ConfigError("no cluster given", hint="pass --cluster NAME")
    project, region = _location(ref, {})
    target = find_cluster(clients, project, region, ref.cluster)
    acc, shape = target.shape(ref.accelerator)
    runs_dir = ref.runs_dir or f"gs://{runs_bucket(clients, project, target.name)}/{RUNS_PREFIX}"
    store = _store(clients, runs_dir)
    opts = ClusterOptions(image=image,
                          namespace=ref.namespace or target.namespace or DEFAULT_NAMESPACE,
                          service_account=target.service_account or DEFAULT_KSA,
                          dcn_networks=target.dcn_networks)
    where = {"cluster": target.name, "project": project, "region": region,
             "accelerator": acc, "image": image}
    if dry_run:
        objs = render_run(spec, backend, shape, store, opts, with_hf_secret=bool(hf_token))
        return {"dry_run": True, **where, "runs_dir": store.uri, "manifests": objs}
    api = kube_api(clients, target, opts.namespace)
    out = submit_run(spec, backend, shape, api, store, opts, hf_token=hf_token, record=where)
    return {**out, **where}


# --- an existing run ------------------------------------------------------------------
@dataclass
class OpenRun:
    store: RunStore
    run: RunDir
    status: dict[str, Any]
    target: ClusterTarget | None = None
    api: KubeApi | None = None

    @property
    def backend(self) -> str | None:
        b = self.status.get("backend")
        return b if b in BACKENDS else None


def is_cluster_run(status: dict[str, Any]) -> bool:
    return status.get("backend") in BACKENDS


def runs_on_cluster(clients: Any, ref: ClusterRef, name: str) -> bool:
    """Whether the run was submitted to a cluster; a local run may keep its store on gs://."""
    return is_cluster_run(open_run(clients, ref, name, connect=False).status)


def open_run(clients: Any, ref: ClusterRef, name: str, connect: bool = True) -> OpenRun:
    """The run's store, status.json and (``connect``) its cluster's Kubernetes API."""
    recorded: dict[str, Any] = {}
    runs_dir = ref.runs_dir
    if not runs_dir:
        if not ref.cluster:
            raise ConfigError("where is the run? no gs:// run store and no cluster given",
                              hint="pass --runs-dir gs://BUCKET/runs or --cluster NAME")
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
        raise ConfigError(f"run {name!r} does not say which cluster it runs on",
                          hint="pass --cluster NAME")
    project, region = _location(ref, recorded)
    opened.target = find_cluster(clients, project, region, cluster)
    namespace = ref.namespace or recorded.get("namespace") or DEFAULT_NAMESPACE
    opened.api = kube_api(clients, opened.target, namespace)
    return opened


def _require_cluster(o: OpenRun, what: str) -> KubeApi:
    if o.api is None:
        raise ConfigError(f"run {o.run.name!r} ran on this machine (backend "
                          f"{o.status.get('backend', 'local')!r}): {what} is for cluster runs",
                          hint=f"use 'rlctl status {o.run.name}' with a local --runs-dir")
    return o.api


def describe(clients: Any, ref: ClusterRef, name: str) -> dict[str, Any]:
    """The run store's view merged with the workload's state (phase, reason, pods)."""
    from rlctl.core.runs.status import describe_run

    o = open_run(clients, ref, name)
    if o.api is None:
        return describe_run(o.run)
    info = describe_cluster_run(name, o.api, o.store, o.backend)
    info.update(cluster=o.status.get("cluster"), backend=o.backend)
    return info


def list_store(clients: Any, ref: ClusterRef) -> tuple[str, list[dict[str, Any]]]:
    """(store URI, runs) of a gs:// run store (store view only, no cluster calls)."""
    from rlctl.core.runs.status import list_runs

    if not ref.runs_dir:
        if not ref.cluster:
            raise ConfigError("no gs:// run store and no cluster given",
                              hint="pass --runs-dir gs://BUCKET/runs or --cluster NAME")
        project, _ = _location(ref, {})
        runs_dir = f"gs://{runs_bucket(clients, project, ref.cluster)}/{RUNS_PREFIX}"
    else:
        runs_dir = ref.runs_dir
    store = _store(clients, runs_dir)
    return store.uri, list_runs(store)  # type: ignore[arg-type]


def logs(clients: Any, ref: ClusterRef, name: str, tail: int = 100) -> tuple[str, str]:
    """(pod, text): the last ``tail`` lines of the run's leading trainer container."""
    o = open_run(clients, ref, name)
    return trainer_logs(_require_cluster(o, "logs"), name, tail)


def _new_lines(seen: list[str], lines: list[str]) -> list[str]:
    """The lines of a fresh tail after what was already shown (matched by the last
    few shown lines; when they scrolled out of the window, all of it)."""
    for k in range(min(len(seen), 5), 0, -1):
        tail = seen[-k:]
        for i in range(len(lines) - k, -1, -1):
            if lines[i:i + k] == tail:
                return lines[i + k:]
    return lines


def follow_logs(clients: Any, ref: ClusterRef, name: str, tail: int = 100,
                interval: float = 2.0, sleep: Callable[[float], None] | None = None,
                window: int = 1000) -> Iterator[str]:
    """Yield log lines as they appear, polling every ``interval`` seconds, until the
    workload has finished (completed, failed, gone). Ctrl-C is the caller's."""
    o = open_run(clients, ref, name)
    api = _require_cluster(o, "logs")
    seen: list[str] = []
    first = True
    while True:
        try:
            _, text = trainer_logs(api, name, tail if first else window)
        except NotFoundError:
            text = ""  # no pod yet (pending) or already gone
        lines = text.splitlines()
        new = lines if first else _new_lines(seen, lines)
        first = False
        yield from new
        seen = (seen + new)[-window:]
        if describe_workload(api, name, o.backend).phase in FINISHED:
            return
        (sleep or time.sleep)(interval)  # looked up per call, so tests can stub it


# --- resume and delete ----------------------------------------------------------------
def resume(clients: Any, ref: ClusterRef, name: str, hf_token: str | None = None,
           image: str | None = None) -> dict[str, Any]:
    """Re-submit a stopped cluster run from its latest complete checkpoint, with the
    backend, image and accelerator recorded at submit (``image`` overrides)."""
    o = open_run(clients, ref, name)
    api = _require_cluster(o, "this resume")
    assert o.target is not None and o.backend is not None
    acc, shape = o.target.shape(ref.accelerator or o.status.get("accelerator"))
    image = image or o.status.get("image")
    if not image:
        raise ConfigError(f"run {name!r} records no image", hint="pass --image")
    opts = ClusterOptions(image=image, namespace=api.namespace,
                          service_account=o.status.get("service_account") or DEFAULT_KSA,
                          dcn_networks=o.target.dcn_networks)
    out = resume_run(name, o.backend, shape, api, o.store, opts, hf_token=hf_token)
    return {**out, "cluster": o.target.name, "accelerator": acc}


def plan_delete(clients: Any, ref: ClusterRef, name: str, purge: bool = False
                ) -> dict[str, Any]:
    """What ``delete`` removes: the run's rlctl-labelled objects (and store files)."""
    o = open_run(clients, ref, name)
    api = _require_cluster(o, "delete run")
    items = plan_delete_run(name, api, o.store, purge)
    if not items:
        raise NotFoundError(f"nothing to delete for run {name!r}: no rlctl-labelled objects",
                            hint="pass --purge to also remove its files from the run store"
                            if not purge else None)
    return {"run": name, "cluster": o.status.get("cluster"), "purge": purge,
            "remove": items}


def delete(clients: Any, ref: ClusterRef, name: str, purge: bool = False) -> dict[str, Any]:
    o = open_run(clients, ref, name)
    api = _require_cluster(o, "delete run")
    return {"run": name, "removed": delete_run(name, api, o.store, purge)}


def hf_token_from_env(env: Any = None) -> str | None:
    """The Hugging Face token for gated models: ``$HF_TOKEN`` only, never a flag."""
    env = os.environ if env is None else env
    return env.get(HF_TOKEN_ENV) or None
