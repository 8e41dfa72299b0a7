"""Read-only checks run before any mutation; each failure is one line naming the fix."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from rlctl.core.config.catalog import lookup
from rlctl.core.config.infra import InfraSpec
from rlctl.core.config.pools import PoolRequest
from rlctl.core.errors import ConfigError, NotFoundError, PreflightError, RlctlError
from rlctl.core.gcp.api import GcpClients
from rlctl.core.gcp.operations import call
from rlctl.core.gcp.pools import wanted_backend_pools
from rlctl.core.gcp.storage import bucket_location
from rlctl.core.names import validate_name

# GKE managed DRANET (the node label on accelerator pools) needs at least these versions.
DRANET_MIN = {"standard": "1.34.1-gke.1829001", "autopilot": "1.35.2-gke.1842000"}

_DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")


def parse_gke_version(v: str) -> tuple[int, ...]:
    """``1.34.1-gke.1829001`` -> (1, 34, 1, 1829001); compares numerically, not as strings."""
    nums = [int(x) for x in re.findall(r"\d+", v)]
    return tuple(nums + [0] * (4 - len(nums)))


def required_apis(spec: InfraSpec) -> list[str]:
    apis = ["compute.googleapis.com", "container.googleapis.com"]
    for s in spec.accelerators:
        api = lookup(s.type).strategy.api
        if api and api not in apis:
            apis.append(api)
    if spec.bucket.name:
        apis.append("storage.googleapis.com")
    return apis


def check_names(spec: InfraSpec) -> list[str]:
    out: list[str] = []
    try:
        validate_name(spec.cluster, "cluster")
    except ConfigError as e:
        out.append(f"{e.message}: {e.hint}")
    for what, v in (("namespace", spec.namespace), ("service account", spec.service_account)):
        if not (_DNS_1123.match(v) and len(v) <= 63):
            out.append(f"{what} {v!r} is not a DNS-1123 label: use lowercase letters, digits, '-'")
    b = spec.bucket.name
    if b and (not _BUCKET.match(b) or b.startswith("goog") or ".." in b):
        out.append(
            f"bucket name {b!r} is invalid: use 3-63 lowercase letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit, not starting with 'goog'"
        )
    if spec.zone and not spec.zone.startswith(spec.region + "-"):
        out.append(
            f"zone {spec.zone!r} is not in region {spec.region!r}: pass --zone {spec.region}-X"
        )
    if spec.bucket.name and bucket_location(spec) != spec.region.upper():
        out.append(
            f"bucket location {spec.bucket.location!r} differs from the cluster region "
            f"{spec.region!r}: set --bucket-location {spec.region} (or omit it)"
        )
    return out


def check_apis(clients: GcpClients, spec: InfraSpec) -> tuple[list[str], set[str]]:
    """Failures, and the set of enabled APIs (so later checks skip disabled ones)."""
    return apis_enabled(clients, spec.project, required_apis(spec))


# What the other commands call, besides those of cluster create (required_apis):
# rlctl image build uploads its context to the bucket, builds with Cloud Build and
# pushes to Artifact Registry; train --cluster reads the cluster, the run store and
# (for the pre-submit check) the image.
IMAGE_BUILD_APIS = (
    "cloudbuild.googleapis.com",
    "artifactregistry.googleapis.com",
    "storage.googleapis.com",
)
TRAIN_APIS = ("container.googleapis.com", "storage.googleapis.com")
REGISTRY_API = "artifactregistry.googleapis.com"  # train --cluster with an AR image


def apis_enabled(
    clients: GcpClients, project: str, apis: Sequence[str]
) -> tuple[list[str], set[str]]:
    """(a line per API of ``apis`` not enabled in ``project``, the enabled ones)."""
    names = [f"projects/{project}/services/{a}" for a in apis]
    resp = call(
        clients,
        "checking enabled APIs",
        clients.service_usage.batch_get_services,
        request={"parent": f"projects/{project}", "names": names},
    )
    enabled = {s.name.rsplit("/", 1)[-1] for s in resp.services if s.state.name == "ENABLED"}
    out = [
        f"API {a} is not enabled in project {project}: run "
        f"'gcloud services enable {a} --project {project}'"
        for a in apis
        if a not in enabled
    ]
    return out, enabled


def require_apis(clients: GcpClients, project: str, apis: Sequence[str]) -> None:
    """``apis_enabled`` as a pre-flight: raises ``PreflightError`` naming each fix."""
    lines, _ = apis_enabled(clients, project, apis)
    if lines:
        raise PreflightError(lines)


# Compute Engine regional quota metrics (regions.get -> quotas[], with usage) of what the
# node pools draw on: GPUs by type, TPU v5e ("TPU_LITE_PODSLICE_V5"), and the vCPUs of
# the backends' CPU pools (the Pathways head's n2-standard-64, made when such a run asks);
# spot capacity has its PREEMPTIBLE_ twin for accelerators. A reservation needs no quota.
GPU_QUOTA = {
    "nvidia-tesla-a100": "NVIDIA_A100_GPUS",
    "nvidia-a100-80gb": "NVIDIA_A100_80GB_GPUS",
    "nvidia-h100-80gb": "NVIDIA_H100_GPUS",
    "nvidia-h100-mega-80gb": "NVIDIA_H100_MEGA_GPUS",
    "nvidia-h200-141gb": "NVIDIA_H200_GPUS",
    "nvidia-b200": "NVIDIA_B200_GPUS",
    "nvidia-l4": "NVIDIA_L4_GPUS",
}
TPU_QUOTA = {"v5e": "TPU_LITE_PODSLICE_V5"}
CPU_QUOTA = {"n2": "N2_CPUS"}  # by machine family
# each kind's Compute Engine quota metrics, by its strategy's quota_key (GPU type, TPU family)
KIND_QUOTA = {"gpu": GPU_QUOTA, "tpu": TPU_QUOTA}


def _cpu_metric(pool: PoolRequest) -> str | None:
    """The regional vCPU quota a backend pool's machine family draws on (N2_CPUS)."""
    return CPU_QUOTA.get(pool.machine_type.split("-")[0])


def _pool_vcpus(spec: InfraSpec, pools: Sequence[PoolRequest]) -> dict[str, float]:
    """{quota metric: vCPUs} of the backends' pools at their largest size (their nodes are
    made on demand, so nothing is drawn until such a run asks; then all of it at once)."""
    from rlctl.core.config.catalog import machine

    needs: dict[str, float] = {}
    for pool in wanted_backend_pools(spec, pools):
        m = machine(pool.machine_type)
        metric = _cpu_metric(pool)
        if m is not None and metric is not None:
            needs[metric] = needs.get(metric, 0.0) + float(m.vcpus * pool.max_nodes)
    return needs


def _quota_needs(spec: InfraSpec, pools: Sequence[PoolRequest]) -> dict[str, float]:
    if spec.capacity.kind == "reservation":
        return _pool_vcpus(spec, pools)
    spot = "PREEMPTIBLE_" if spec.capacity.kind == "spot" else ""
    needs: dict[str, float] = {}
    for s in spec.accelerators:
        acc = lookup(s.type)
        metric = KIND_QUOTA[acc.kind].get(acc.strategy.quota_key(acc))
        if metric:
            needs[spot + metric] = needs.get(spot + metric, 0) + acc.chips * s.count
    return {**needs, **_pool_vcpus(spec, pools)}


def check_quota(
    clients: GcpClients, spec: InfraSpec, enabled: set[str], pools: Sequence[PoolRequest] = ()
) -> tuple[list[str], list[str]]:
    """(failures, notes): the region's quota against what the pools need: Compute
    Engine's regional metrics (limit and usage), then the TPU generations Compute Engine
    meters in Cloud Quotas only (``check_tpu_quota``)."""
    if "compute.googleapis.com" not in enabled or not spec.accelerators:
        return [], []
    out, notes = check_tpu_quota(clients, spec)
    needs = _quota_needs(spec, pools)
    if not needs:
        return out, notes
    region = call(
        clients,
        f"reading region {spec.region}",
        clients.regions.get,
        project=spec.project,
        region=spec.region,
    )
    quotas = {q.metric: q for q in region.quotas}
    for metric, need in needs.items():
        q = quotas.get(metric)
        if q is None:
            continue
        free = q.limit - q.usage
        if free < need:
            mine = [p for p in wanted_backend_pools(spec, pools) if _cpu_metric(p) == metric]
            what = (
                f"the node pool{'s' * (len(mine) > 1)} for "
                f"{' and '.join(p.purpose for p in mine)} need{'s' * (len(mine) == 1)}"
                if mine
                else "the node pools need"
            )
            alt = "".join(f" (or, if no run needs it, '--set pools.{p.name}=false')" for p in mine)
            out.append(
                f"quota {metric} in {spec.region} has {free:g} free (limit {q.limit:g}, "
                f"{q.usage:g} in use); {what} {need:g}: ask for more with "
                f"'gcloud alpha quotas preferences create --service=compute.googleapis.com "
                f"--quota-id={metric} --preferred-value={q.usage + need:g} "
                f"--project={spec.project}' or the console's Quotas page{alt}"
            )
    return out, notes


# The TPU generations whose Compute Engine (and so GKE) quota is kept in Cloud Quotas
# only, by the names and dimensions GKE documents for on-demand TPU slice node pools
# (GKE docs, "Troubleshoot TPUs in GKE", Insufficient quota: v4 "TPU v4 PodSlice chips",
# v5p "TPU v5p chips", v6e and tpu7x "TPUs per TPU family" with tpu_family CT6E /
# tpu7x). The quota's id is discovered from its display name, never assumed. Cloud
# Quotas gives limits, not usage: a limit below the need fails; room within a limit is
# not proven (other pools may use it), which the note says.
TPU_FAMILY_QUOTA: dict[str, tuple[str, dict[str, str]]] = {
    "v4": ("TPU v4 PodSlice chips", {}),
    "v5p": ("TPU v5p chips", {}),
    "v6e": ("TPUs per TPU family", {"tpu_family": "CT6E"}),
    "tpu7x": ("TPUs per TPU family", {"tpu_family": "tpu7x"}),
}
COMPUTE = "compute.googleapis.com"


def _limit(info: Any, region: str, dims: dict[str, str]) -> int | None:
    """The value of ``info`` that applies to ``region`` (and ``dims``): the most specific
    dimensions entry naming the region; None when no entry names it."""
    best: tuple[int, int] | None = None
    for d in info.dimensions_infos:
        have = dict(d.dimensions)
        if have.get("region") != region:
            continue
        if any(have.get(k, v).lower() != v.lower() for k, v in dims.items()):
            continue
        score = len(have)
        if best is None or score > best[0]:
            best = (score, int(d.details.value))
    return None if best is None else best[1]


def check_tpu_quota(clients: GcpClients, spec: InfraSpec) -> tuple[list[str], list[str]]:
    """(failures, notes) of the on-demand TPU quota Cloud Quotas keeps (TPU_FAMILY_QUOTA),
    read with its API (``projects.locations.services.quotaInfos.list``)."""
    needs: dict[str, int] = {}
    for s in spec.accelerators:
        acc = lookup(s.type)
        if acc.kind == "tpu" and acc.family in TPU_FAMILY_QUOTA:
            needs[acc.family] = needs.get(acc.family, 0) + acc.chips * s.count
    if not needs:
        return [], []
    if spec.capacity.kind != "on-demand":
        return [], [
            f"TPU {', '.join(sorted(needs))} {spec.capacity.kind} capacity: its "
            "quota is not checked"
        ]
    try:
        infos = call(
            clients,
            "listing Compute Engine quotas (Cloud Quotas)",
            lambda **kw: list(clients.cloud_quotas.list_quota_infos(**kw)),
            parent=f"projects/{spec.project}/locations/global/services/{COMPUTE}",
        )
    except RlctlError as e:  # an API not enabled or no permission: say so, do not block
        return [], [
            f"TPU {', '.join(sorted(needs))} quota is not checked ({e.message}): "
            f"see 'gcloud alpha quotas info list --service={COMPUTE} "
            f"--project={spec.project}'"
        ]
    out, notes = [], []
    for family, need in sorted(needs.items()):
        name, dims = TPU_FAMILY_QUOTA[family]
        found = [
            i
            for i in infos
            if (i.quota_display_name or "").lower() == name.lower()
            and all(k in list(i.dimensions) for k in dims)
        ]
        limits = [v for i in found if (v := _limit(i, spec.region, dims)) is not None]
        if not limits:
            notes.append(
                f"TPU {family} quota ('{name}'{_dims(dims)}) has no value for "
                f"{spec.region} in Cloud Quotas, so it is not checked: see 'gcloud "
                f"alpha quotas info list --service={COMPUTE} --project={spec.project}'"
            )
            continue
        limit = min(limits)
        if 0 <= limit < need:
            quota_id = found[0].quota_id
            dim_flag = ",".join(f"{k}={v}" for k, v in {"region": spec.region, **dims}.items())
            out.append(
                f"quota '{name}'{_dims(dims)} in {spec.region} is {limit} TPU chips; the node "
                f"pools need {need}: ask for more with 'gcloud alpha quotas preferences "
                f"create --service={COMPUTE} --quota-id={quota_id} --preferred-value={need} "
                f"--dimensions={dim_flag} --project={spec.project}' or the console's Quotas "
                f"page"
            )
        else:
            notes.append(
                f"TPU {family} quota in {spec.region}: limit "
                f"{'unlimited' if limit < 0 else limit} chips, {need} asked "
                "(Cloud Quotas gives no usage: chips other pools hold are not "
                "counted)"
            )
    return out, notes


def _dims(dims: dict[str, str]) -> str:
    return "".join(f", {k}={v}" for k, v in dims.items())


def check_accelerators(clients: GcpClients, spec: InfraSpec, enabled: set[str]) -> list[str]:
    out: list[str] = []
    tpus = [lookup(s.type) for s in spec.accelerators if lookup(s.type).kind == "tpu"]
    gpus = [lookup(s.type) for s in spec.accelerators if lookup(s.type).kind == "gpu"]
    if tpus and "tpu.googleapis.com" in enabled:
        offered = {
            (t.type_ or t.name.rsplit("/", 1)[-1])
            for t in call(
                clients,
                f"listing TPU types in {spec.zone}",
                clients.tpu.list_accelerator_types,
                parent=f"projects/{spec.project}/locations/{spec.zone}",
            )
        }
        for acc in dict.fromkeys(tpus):
            if acc.name not in offered:
                near = sorted(z for z in offered if z.split("-")[0] == acc.name.split("-")[0])
                alt = f" (offered there: {', '.join(near[:6])})" if near else ""
                out.append(
                    f"TPU type {acc.name} is not offered in zone {spec.zone}{alt}: pick another "
                    f"--zone (see 'gcloud compute tpus accelerator-types list --zone ZONE')"
                )
    if gpus and "compute.googleapis.com" in enabled:
        for acc in dict.fromkeys(gpus):
            try:
                call(
                    clients,
                    f"reading machine type {acc.machine_type}",
                    clients.machine_types.get,
                    project=spec.project,
                    zone=spec.zone,
                    machine_type=acc.machine_type,
                )
            except NotFoundError:
                out.append(
                    f"machine type {acc.machine_type} is not offered in zone {spec.zone}: pick "
                    f"another --zone (see 'gcloud compute machine-types list --filter "
                    f"name={acc.machine_type}')"
                )
    return out


def check_version(clients: GcpClients, spec: InfraSpec, enabled: set[str]) -> list[str]:
    if "container.googleapis.com" not in enabled:
        return []
    cfg = call(
        clients,
        "reading GKE server config",
        clients.container.get_server_config,
        name=f"projects/{spec.project}/locations/{spec.location}",
    )
    out: list[str] = []
    version = spec.version
    if version and version not in set(cfg.valid_master_versions):
        out.append(
            f"GKE version {version} is not offered in {spec.location}: pick one from "
            "'gcloud container get-server-config' or use --release-channel"
        )
        return out
    if not version:
        for ch in cfg.channels:
            if ch.channel.name.lower() == spec.release_channel:
                version = ch.default_version
        version = version or cfg.default_cluster_version
    if spec.dcn.count and version:
        need = DRANET_MIN[spec.mode]
        if parse_gke_version(version) < parse_gke_version(need):
            out.append(
                f"GKE {version} is too old for managed DRANET (needs {need} or newer): pass "
                f"--version {need} or newer, or --release-channel rapid"
            )
    return out


def check_bucket(clients: GcpClients, spec: InfraSpec, enabled: set[str]) -> list[str]:
    if not spec.bucket.name or "storage.googleapis.com" not in enabled:
        return []
    b = call(
        clients,
        f"reading bucket {spec.bucket.name}",
        clients.storage.lookup_bucket,
        spec.bucket.name,
    )
    if b is not None and (b.location or "").upper() != spec.region.upper():
        return [
            f"bucket {spec.bucket.name} is in {b.location}, not in the cluster region "
            f"{spec.region}: use another --bucket name (or create the cluster in {b.location})"
        ]
    return []


def run(clients: GcpClients, spec: InfraSpec, pools: Sequence[PoolRequest] = ()) -> list[str]:
    """All checks; raises ``PreflightError`` listing every failure. Reads only.
    Returns notes: what could not be checked. ``pools``: the backends' CPU pools."""
    lines = check_names(spec)
    notes: list[str] = []
    try:
        api_lines, enabled = check_apis(clients, spec)
        lines += api_lines
        lines += check_accelerators(clients, spec, enabled)
        lines += check_version(clients, spec, enabled)
        lines += check_bucket(clients, spec, enabled)
        quota_lines, notes = check_quota(clients, spec, enabled, pools)
        lines += quota_lines
    except RlctlError:
        # no credentials, no access, no network: the pure checks' findings are what
        # the user can fix first, so they win over "no credentials"
        if lines:
            raise PreflightError(lines) from None
        raise
    if lines:
        raise PreflightError(lines)
    return notes
