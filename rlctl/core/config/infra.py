"""``InfraSpec``: the Google Cloud side of rlctl (network, GKE cluster, node pools, bucket).

Built from YAML + flags. Project, region and zone fall back, in order, to flags,
the config file, environment variables, the local gcloud configuration, and
finally the project of Application Default Credentials (looked up lazily by the
caller, so this module stays free of Google imports).
"""

from __future__ import annotations

import configparser
import ipaddress
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rlctl.core.config.load import build, read_yaml
from rlctl.core.config.pools import PoolRequest
from rlctl.core.errors import ConfigError
from rlctl.core.names import validate_name

DEFAULT_MTU = 8896
DEFAULT_DCN_CIDRS = ("10.50.0.0/16", "10.60.0.0/16", "10.70.0.0/16", "10.80.0.0/16")
MANAGED_BY = "managed-by"
RLCTL = "rlctl"
CLUSTER_LABEL = "rlctl-cluster"
# On the GKE cluster only: where its runs go, so 'train --cluster' finds the
# namespace and service account that the bucket's Workload Identity binding names.
NAMESPACE_LABEL = "rlctl-namespace"
KSA_LABEL = "rlctl-ksa"
DEFAULT_NAMESPACE = "default"
DEFAULT_KSA = "rlctl"
DRANET_LABEL = "cloud.google.com/gke-networking-dra-driver"


class Spec(BaseModel):
    # allow_inf_nan=False: ``--lr nan`` is "not a finite number", not "should be <= 1"
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class SliceSpec(Spec):
    type: Annotated[
        str,
        Field(
            description="accelerator type: v6e-16, v5p-128, v5litepod-16, tpu7x-128, "
            "or a GPU machine type such as a3-highgpu-8g"
        ),
    ]
    count: Annotated[
        int,
        Field(
            ge=1,
            le=64,
            description="TPU: number of slices (one node pool each); GPU: number of machines",
        ),
    ] = 1

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, v: Any) -> Any:
        if isinstance(v, str):
            from rlctl.core.config.catalog import parse_slices

            name, n = parse_slices(v)
            return {"type": name, "count": n}
        return v

    @field_validator("type")
    @classmethod
    def _known(cls, v: str) -> str:
        from rlctl.core.config.catalog import lookup

        try:
            return lookup(v).name
        except ConfigError as e:
            raise ValueError(f"{e.message}; {e.hint}") from None

    @model_validator(mode="after")
    def _joinable(self) -> SliceSpec:
        from rlctl.core.config.catalog import lookup, multislice_refusal

        if why := multislice_refusal(lookup(self.type), self.count):
            raise ValueError(why)
        return self


class CapacitySpec(Spec):
    kind: Annotated[
        Literal["on-demand", "spot", "reservation"],
        Field(description="how accelerator nodes are obtained"),
    ] = "on-demand"
    reservation: Annotated[str | None, Field(description="reservation name (kind=reservation)")] = (
        None
    )

    @model_validator(mode="after")
    def _reservation(self) -> CapacitySpec:
        if self.kind == "reservation" and not self.reservation:
            raise ValueError("capacity.kind=reservation needs capacity.reservation (a name)")
        if self.kind != "reservation" and self.reservation:
            raise ValueError("capacity.reservation is only used with capacity.kind=reservation")
        return self


class DcnSpec(Spec):
    count: Annotated[
        int, Field(ge=0, le=4, description="extra VPC networks for multi-slice DCN traffic")
    ] = 0
    mtu: Annotated[int, Field(ge=1300, le=8896, description="MTU of the DCN networks")] = (
        DEFAULT_MTU
    )
    cidrs: Annotated[
        list[str], Field(description="one subnet range per network; default 10.50.0.0/16, ...")
    ] = []

    @field_validator("cidrs")
    @classmethod
    def _cidrs(cls, v: list[str]) -> list[str]:
        for c in v:
            try:
                ipaddress.ip_network(c)
            except ValueError:
                raise ValueError(f"{c!r} is not a CIDR range such as 10.50.0.0/16") from None
        return v

    @model_validator(mode="after")
    def _enough(self) -> DcnSpec:
        if self.cidrs and len(self.cidrs) != self.count:
            raise ValueError(f"dcn.cidrs has {len(self.cidrs)} ranges for {self.count} networks")
        return self

    def ranges(self) -> list[str]:
        return list(self.cidrs) or list(DEFAULT_DCN_CIDRS[: self.count])


class BucketSpec(Spec):
    name: Annotated[str | None, Field(description="GCS bucket for runs and checkpoints")] = None
    location: Annotated[
        str | None, Field(description="bucket location; default and required: the region")
    ] = None


class InfraSpec(Spec):
    project: Annotated[str, Field(description="Google Cloud project id")]
    region: Annotated[str, Field(description="region of the cluster, subnets and bucket")]
    zone: Annotated[
        str | None, Field(description="zone of the accelerator node pools (default REGION-b)")
    ] = None
    cluster: Annotated[str, Field(description="GKE cluster name")]
    mode: Annotated[Literal["standard", "autopilot"], Field(description="GKE mode")] = "standard"
    release_channel: Annotated[
        Literal["rapid", "regular", "stable", "none"], Field(description="GKE release channel")
    ] = "rapid"
    version: Annotated[
        str | None, Field(description="GKE version; default: the channel's default")
    ] = None
    accelerators: Annotated[
        list[SliceSpec], Field(description="slices, e.g. ['v6e-16 x2'] or [{type, count}]")
    ] = []
    capacity: CapacitySpec = CapacitySpec()
    dcn: DcnSpec = DcnSpec()
    bucket: BucketSpec = BucketSpec()
    namespace: Annotated[str, Field(description="Kubernetes namespace of the workloads")] = (
        DEFAULT_NAMESPACE
    )
    service_account: Annotated[
        str, Field(description="Kubernetes service account bound to the bucket")
    ] = DEFAULT_KSA
    cpu_machine_type: Annotated[str, Field(description="machine type of the CPU pool")] = (
        "e2-standard-8"
    )
    cpu_nodes: Annotated[int, Field(ge=1, le=100, description="nodes in the CPU pool")] = 1
    pools: Annotated[
        dict[str, bool],
        Field(
            description="the CPU pools workload backends bring, by name (cluster create "
            "--dry-run lists them; each autoscaled from 0 nodes): false leaves one out"
        ),
    ] = {}

    @model_validator(mode="before")
    @classmethod
    def _pool_flags(cls, data: Any) -> Any:
        """``NAME_pool: false`` (the older spelling: ``pathways_pool: false``) is
        ``pools: {NAME: false}``."""
        if not isinstance(data, dict):
            return data
        flags = {
            k: v
            for k, v in data.items()
            if isinstance(k, str) and k.endswith("_pool") and isinstance(v, bool)
        }
        if not flags:
            return data
        rest = {k: v for k, v in data.items() if k not in flags}
        pools = {**(rest.get("pools") or {}), **{k[: -len("_pool")]: v for k, v in flags.items()}}
        return {**rest, "pools": pools}

    def wants_pool(self, pool: PoolRequest) -> bool:
        """A Standard cluster gets a backend's pool unless ``pools: {NAME: false}`` leaves
        it out; a pool for TPU backends only comes with TPU slices."""
        from rlctl.core.config.catalog import lookup

        return (
            self.mode == "standard"
            and self.pools.get(pool.name, True)
            and (not pool.tpu_only or any(lookup(s.type).kind == "tpu" for s in self.accelerators))
        )

    @model_validator(mode="after")
    def _zone(self) -> InfraSpec:
        if self.zone is None:
            object.__setattr__(self, "zone", f"{self.region}-b")
        return self

    # --- derived names (one place, so create and delete agree) -------------
    @property
    def location(self) -> str:
        """The cluster is regional; accelerator pools are pinned to ``zone``."""
        return self.region

    @property
    def labels(self) -> dict[str, str]:
        return {MANAGED_BY: RLCTL, CLUSTER_LABEL: self.cluster}

    @property
    def cluster_labels(self) -> dict[str, str]:
        return {**self.labels, NAMESPACE_LABEL: self.namespace, KSA_LABEL: self.service_account}

    @property
    def marker(self) -> str:
        """Compute networks, subnets and firewalls have no labels: we mark the description."""
        return marker(self.cluster)

    def network_name(self, i: int) -> str:
        return f"{self.cluster}-dcn-{i}"

    def subnet_name(self, i: int) -> str:
        return f"{self.cluster}-dcn-{i}-sub"

    def firewall_name(self, i: int) -> str:
        return f"{self.cluster}-dcn-{i}-internal"

    @property
    def workload_pool(self) -> str:
        return f"{self.project}.svc.id.goog"

    def principal(self, project_number: str | int) -> str:
        return (
            f"principal://iam.googleapis.com/projects/{project_number}/locations/global/"
            f"workloadIdentityPools/{self.workload_pool}/subject/ns/{self.namespace}/"
            f"sa/{self.service_account}"
        )


def marker(cluster: str) -> str:
    return f"{MANAGED_BY}={RLCTL} {CLUSTER_LABEL}={cluster}"


def is_ours(description: str | None, cluster: str | None = None) -> bool:
    d = description or ""
    if f"{MANAGED_BY}={RLCTL}" not in d:
        return False
    if cluster is None:  # any rlctl cluster's (re.escape(None) raised a TypeError here)
        return True
    return re.search(rf"\b{CLUSTER_LABEL}={re.escape(cluster)}(\s|$)", d) is not None


# --- defaults: flags > file > env > gcloud config > ADC ---------------------

_ENV = {
    "project": ("RLCTL_PROJECT", "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT"),
    "region": ("RLCTL_REGION", "CLOUDSDK_COMPUTE_REGION"),
    "zone": ("RLCTL_ZONE", "CLOUDSDK_COMPUTE_ZONE"),
}


def gcloud_defaults(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """project/region/zone from the active gcloud configuration file, if any (no subprocess)."""
    env = os.environ if env is None else env
    root = Path(env.get("CLOUDSDK_CONFIG") or Path.home() / ".config" / "gcloud")
    name = env.get("CLOUDSDK_ACTIVE_CONFIG_NAME")
    if not name:
        active = root / "active_config"
        name = active.read_text().strip() if active.is_file() else "default"
    path = root / "configurations" / f"config_{name}"
    if not path.is_file():
        return {}
    cp = configparser.ConfigParser()
    try:
        cp.read(path)
    except configparser.Error:
        return {}
    out = {}
    for key, (section, opt) in {
        "project": ("core", "project"),
        "region": ("compute", "region"),
        "zone": ("compute", "zone"),
    }.items():
        if cp.has_option(section, opt):
            out[key] = cp.get(section, opt)
    return out


# Google Cloud's regions (https://cloud.google.com/compute/docs/regions-zones), for a
# typo's suggestion; a region of the published form that is not here (Google adds them)
# is taken as given, and the API says whether it exists
KNOWN_REGIONS = (
    "africa-south1",
    "asia-east1",
    "asia-east2",
    "asia-northeast1",
    "asia-northeast2",
    "asia-northeast3",
    "asia-south1",
    "asia-south2",
    "asia-southeast1",
    "asia-southeast2",
    "australia-southeast1",
    "australia-southeast2",
    "europe-central2",
    "europe-north1",
    "europe-north2",
    "europe-southwest1",
    "europe-west1",
    "europe-west2",
    "europe-west3",
    "europe-west4",
    "europe-west6",
    "europe-west8",
    "europe-west9",
    "europe-west10",
    "europe-west12",
    "me-central1",
    "me-central2",
    "me-west1",
    "northamerica-northeast1",
    "northamerica-northeast2",
    "northamerica-south1",
    "southamerica-east1",
    "southamerica-west1",
    "us-central1",
    "us-east1",
    "us-east4",
    "us-east5",
    "us-south1",
    "us-west1",
    "us-west2",
    "us-west3",
    "us-west4",
)
_REGION = re.compile(r"[a-z]+-[a-z]+[0-9]+")
_ZONE = re.compile(r"([a-z]+-[a-z]+[0-9]+)-[a-z]")
# a project id: 6-30 characters, lowercase letters, digits and hyphens, a letter first,
# no hyphen last; an old domain-scoped one has its domain and a colon before it
_PROJECT = re.compile(r"(?:[a-z0-9.-]+\.[a-z]{2,}:)?[a-z][a-z0-9-]{4,28}[a-z0-9]")


def check_location(
    project: str, region: str, zone: str | None = None, known_only: bool = False
) -> None:
    """``project``, ``region`` and ``zone`` in their published forms, checked offline,
    for a plan that no API reads: a dry run without credentials planned and priced
    'mars-1' and 'BAD PROJECT' (#53). With credentials the APIs answer for them (and a
    local fake's project may be 'p'). ``known_only``: the region must be one of
    ``KNOWN_REGIONS`` too (a well-formed typo such as 'us-est5' would be priced)."""
    import difflib

    if not _PROJECT.fullmatch(project):
        raise ConfigError(
            f"{project!r} is not a Google Cloud project id",
            hint="a project id is 6-30 lowercase letters, digits and hyphens, starting "
            "with a letter and not ending with a hyphen (the ID, not the project's "
            "name: 'gcloud projects list' shows both)",
        )
    if not _REGION.fullmatch(region):
        near = difflib.get_close_matches(region.lower(), KNOWN_REGIONS, n=1, cutoff=0.6)
        raise ConfigError(
            f"{region!r} is not a Google Cloud region",
            hint=(f"did you mean {near[0]}? " if near else "")
            + "a region is like us-east5 or europe-west4 (a zone adds -a, -b, ...); "
            "'gcloud compute regions list' lists them",
        )
    if known_only and region not in KNOWN_REGIONS:
        near = difflib.get_close_matches(region, KNOWN_REGIONS, n=1, cutoff=0.6)
        raise ConfigError(
            f"{region!r} is not a Google Cloud region rlctl knows, and without credentials "
            "nothing can check it",
            hint=(f"did you mean {near[0]}? " if near else "")
            + "a region new to Google Cloud is planned with credentials "
            "('gcloud auth application-default login'), which read the real one",
        )
    if zone is not None:
        m = _ZONE.fullmatch(zone)
        if not m or m.group(1) != region:
            raise ConfigError(
                f"{zone!r} is not a zone of region {region}",
                hint=f"a zone of {region} is {region}-a, {region}-b, ...; "
                f"'gcloud compute zones list --filter=region:{region}' lists them",
            )


def fill_defaults(
    data: dict[str, Any],
    env: Mapping[str, str] | None = None,
    adc_project: Callable[[], str | None] | None = None,
) -> dict[str, Any]:
    """Fill project/region/zone missing in ``data`` from env, gcloud config, then ADC."""
    env = os.environ if env is None else env
    gcloud: dict[str, str] | None = None
    for key, names in _ENV.items():
        if data.get(key):
            continue
        found = next((env[n] for n in names if env.get(n)), None)
        if found is None:
            if gcloud is None:
                gcloud = gcloud_defaults(env)
            found = gcloud.get(key)
        if found is None and key == "project" and adc_project is not None:
            found = adc_project()
        if found:
            data[key] = found
    if not data.get("project") or not data.get("region"):
        missing = [k for k in ("project", "region") if not data.get(k)]
        raise ConfigError(
            f"no {' or '.join(missing)} given",
            hint="pass --project/--region, set them in the config file, or run "
            "'gcloud config set project P' and 'gcloud config set compute/region R'",
        )
    return data


def resolve_cluster_name(name: str | None, config: str | Path | None) -> str:
    """The NAME argument, else ``cluster`` in the --config file; validated."""
    name = name or (read_yaml(config).get("cluster") if config else None)
    if not name:
        raise ConfigError("no cluster name given", hint="pass NAME or set 'cluster' in --config")
    return validate_name(name, "cluster")


def resolve_location(
    config: str | Path | None,
    project: str | None,
    region: str | None,
    env: Mapping[str, str] | None = None,
    adc_project: Callable[[], str | None] | None = None,
) -> tuple[str, str]:
    """(project, region) by the same precedence as ``build_infra_spec``."""
    data: dict[str, Any] = read_yaml(config) if config else {}
    data = {k: v for k, v in data.items() if k in ("project", "region", "zone")}
    if project:
        data["project"] = project
    if region:
        data["region"] = region
    fill_defaults(data, env, adc_project)
    return data["project"], data["region"]


def build_infra_spec(
    config: str | Path | None = None,
    flags: Mapping[str, Any] | None = None,
    overrides: list[str] | None = None,
    env: Mapping[str, str] | None = None,
    adc_project: Callable[[], str | None] | None = None,
) -> InfraSpec:
    """Merge the sources into a validated spec. ``flags`` holds only flags the user gave."""
    env = os.environ if env is None else env
    data: dict[str, Any] = read_yaml(config) if config else {}
    for key, value in (flags or {}).items():
        if value is None:
            continue
        if isinstance(value, dict):
            given = {k: v for k, v in value.items() if v is not None}
            data[key] = {**(data.get(key) or {}), **given}
        else:
            data[key] = value
    # the name first: a typo is reported before credentials or the gcloud config
    # are looked up (which can fail, or take seconds, for reasons of their own)
    if not data.get("cluster"):
        raise ConfigError(
            "no cluster name given",
            hint="pass NAME (e.g. 'rlctl network create rl') or set 'cluster' in --config",
        )
    validate_name(str(data["cluster"]), "cluster")
    fill_defaults(data, env, adc_project)
    return build(InfraSpec, data, overrides)
