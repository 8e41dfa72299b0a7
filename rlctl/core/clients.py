"""The one factory for Google Cloud clients (the only module importing google.cloud/auth).

``Clients(project, region, credentials=None, endpoints=None)`` does no I/O when
built; each SDK client is created on first use, with the same credentials, user
agent, endpoint override and REST transport. Tests and the benchmark pass
``endpoints={"compute": url, "container": url, ...}`` (or ``Clients.local(url)``)
and anonymous credentials, so the real client libraries talk to local fakes.
With no storage override, ``STORAGE_EMULATOR_HOST`` points Cloud Storage at an
emulator (fake-gcs-server) with anonymous credentials, as the pods' tests do.

From the environment, as gcloud's ``api_endpoint_overrides`` and
``auth/disable_credentials`` properties do (read when ``Clients`` is built,
still without I/O; explicit ``endpoints=``/``credentials=`` arguments win):

* ``RLCTL_API_ENDPOINT_OVERRIDES_<SERVICE>`` (SERVICE in COMPUTE, CONTAINER, TPU,
  SERVICEUSAGE, STORAGE, CLOUDBUILD, ARTIFACTREGISTRY, CLOUDRESOURCEMANAGER,
  CLOUDQUOTAS) sends that service's calls to
  another endpoint, for users behind Private Service Connect or regional endpoints,
  and for CI against a local fake. The value is ``https://HOST[:PORT]`` without a path:
  the client libraries add the API path themselves (gcloud's values include it).
* ``RLCTL_AUTH_DISABLE_CREDENTIALS=true`` uses ``AnonymousCredentials`` instead
  of Application Default Credentials. It is for emulators and local fakes only:
  Google's APIs reject anonymous calls.

``kubernetes(endpoint, ca)`` builds a Kubernetes API client for a GKE cluster
from its endpoint, CA certificate and an access token of the same credentials;
the token stays in memory (see ``core/k8s/kubeconfig.py``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from rlctl import __version__
from rlctl.core.errors import ConfigError, require_extra

if TYPE_CHECKING:  # pragma: no cover
    from google.api_core.retry import Retry
    from google.cloud.storage import Bucket as StorageBucket  # noqa: F401 (gcs.py hints)
    from google.cloud.storage import Client as StorageClient  # noqa: F401 (gcs.py hints)
    from kubernetes.client import ApiClient

SERVICES = (
    "compute",
    "container",
    "tpu",
    "serviceusage",
    "storage",
    "cloudbuild",
    "artifactregistry",
    "cloudresourcemanager",
    "cloudquotas",
)
USER_AGENT = f"rlctl/{__version__}"
ENDPOINT_ENV_PREFIX = "RLCTL_API_ENDPOINT_OVERRIDES_"
DISABLE_CREDENTIALS_ENV = "RLCTL_AUTH_DISABLE_CREDENTIALS"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def _require(module: str, extra: str) -> None:
    """``require_extra`` for a dotted name, parents first: with google-auth alone
    (a dependency of ``kubernetes``) there is no ``google.cloud`` package, and
    looking up ``google.cloud.container_v1`` would raise ModuleNotFoundError."""
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        require_extra(".".join(parts[:i]), extra)


def _endpoint(variable: str, value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise ConfigError(
            f"{variable}={value!r} is not an endpoint URL",
            hint="give a scheme and host, e.g. https://HOST or http://127.0.0.1:PORT",
        )
    if parts.path.strip("/"):
        raise ConfigError(
            f"{variable}={value!r}: give the endpoint without a path",
            hint="the client libraries add the API path (/compute/v1, /v1, ...) "
            "themselves; unlike gcloud's overrides, leave it out",
        )
    return f"{parts.scheme}://{parts.netloc}"


def endpoints_from_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """{service: URL} from ``RLCTL_API_ENDPOINT_OVERRIDES_<SERVICE>``; empty values are unset.

    A misspelt service name is an error rather than a silent call to the default
    endpoint (that is, to production).
    """
    env = os.environ if env is None else env
    out: dict[str, str] = {}
    for variable, value in env.items():
        if not variable.startswith(ENDPOINT_ENV_PREFIX) or not value.strip():
            continue
        service = variable[len(ENDPOINT_ENV_PREFIX) :].lower()
        if service not in SERVICES:
            raise ConfigError(
                f"{variable}: unknown service {service!r}",
                hint="use one of " + ", ".join(ENDPOINT_ENV_PREFIX + s.upper() for s in SERVICES),
            )
        out[service] = _endpoint(variable, value.strip())
    return out


def credentials_disabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``RLCTL_AUTH_DISABLE_CREDENTIALS`` asks for anonymous credentials."""
    env = os.environ if env is None else env
    raw = env.get(DISABLE_CREDENTIALS_ENV, "")
    value = raw.strip().lower()
    if value not in _TRUE + _FALSE:
        raise ConfigError(
            f"{DISABLE_CREDENTIALS_ENV}={raw!r} is not a boolean", hint="use true or false"
        )
    return value in _TRUE


class Clients:
    """Lazily built, cached Google Cloud clients plus the retry/poll policy they share.

    Args:
        project: default project id.
        region: default region.
        credentials: google.auth credentials; None means Application Default Credentials
            (anonymous ones with ``RLCTL_AUTH_DISABLE_CREDENTIALS=true``).
        endpoints: per-service endpoint override (keys in ``SERVICES``), e.g. a local fake;
            they win over ``RLCTL_API_ENDPOINT_OVERRIDES_<SERVICE>``.
        retry_initial: first backoff (s) for transient 429/5xx retries.
        retry_deadline: give up retrying after this many seconds.
        poll_interval: first delay (s) between long-running-operation polls (grows to 10x).
    """

    def __init__(
        self,
        project: str | None = None,
        region: str | None = None,
        credentials: Any = None,
        endpoints: dict[str, str] | None = None,
        *,
        retry_initial: float = 1.0,
        retry_deadline: float = 300.0,
        poll_interval: float = 2.0,
    ) -> None:
        self.project = project
        self.region = region
        self._credentials = credentials
        unknown = set(endpoints or {}) - set(SERVICES)
        if unknown:
            raise ValueError(f"unknown endpoint keys {sorted(unknown)}; use {SERVICES}")
        self.endpoints = {**endpoints_from_env(), **(endpoints or {})}
        self.anonymous = credentials is None and credentials_disabled()
        self.retry_initial = retry_initial
        self.retry_deadline = retry_deadline
        self.poll_interval = poll_interval
        self._lock = threading.RLock()

    @classmethod
    def local(cls, url: str, project: str = "p", region: str = "us-central1", **kw: Any) -> Clients:
        """All services at one local URL with anonymous credentials (tests, bench)."""
        from google.auth.credentials import AnonymousCredentials

        kw.setdefault("retry_initial", 0.01)
        kw.setdefault("poll_interval", 0.01)
        return cls(project, region, AnonymousCredentials(), {s: url for s in SERVICES}, **kw)

    # --- shared pieces ----------------------------------------------------
    @property
    def credentials(self) -> Any:
        with self._lock:
            if self._credentials is None and self.anonymous:
                _require("google.auth", "gcp")
                from google.auth.credentials import AnonymousCredentials

                self._credentials = AnonymousCredentials()
            if self._credentials is None:
                _require("google.auth", "gcp")
                import google.auth

                from rlctl.core.gcp.errors import translate

                try:
                    self._credentials, _ = google.auth.default(
                        scopes=["https://www.googleapis.com/auth/cloud-platform"]
                    )
                except Exception as e:  # DefaultCredentialsError
                    raise translate(e, "Application Default Credentials") from e
            return self._credentials

    def _client_info(self) -> Any:
        from google.api_core.gapic_v1.client_info import ClientInfo

        return ClientInfo(user_agent=USER_AGENT)

    def _options(self, service: str) -> dict[str, Any]:
        url = self.endpoints.get(service)
        return {"api_endpoint": url} if url else {}

    def _gapic(self, module: str, cls_name: str, service: str) -> Any:
        _require(module, "gcp")
        import importlib

        cls = getattr(importlib.import_module(module), cls_name)
        with self._lock:
            return cls(
                credentials=self.credentials,
                transport="rest",
                client_options=self._options(service),
                client_info=self._client_info(),
            )

    @cached_property
    def retry(self) -> Retry:
        """Retry transient 429/5xx with exponential backoff (google-api-core's Retry)."""
        from google.api_core.retry import Retry

        from rlctl.core.gcp.errors import is_transient

        return Retry(
            predicate=is_transient,
            initial=self.retry_initial,
            maximum=max(self.retry_initial * 32, self.retry_initial),
            multiplier=2.0,
            timeout=self.retry_deadline,
        )

    # --- Compute Engine ---------------------------------------------------
    @cached_property
    def networks(self) -> Any:
        return self._gapic("google.cloud.compute_v1", "NetworksClient", "compute")

    @cached_property
    def subnetworks(self) -> Any:
        return self._gapic("google.cloud.compute_v1", "SubnetworksClient", "compute")

    @cached_property
    def firewalls(self) -> Any:
        return self._gapic("google.cloud.compute_v1", "FirewallsClient", "compute")

    @cached_property
    def global_operations(self) -> Any:
        # Compute's ExtendedOperation.result() polls the default endpoint, so we wait
        # on operations with these clients, built here with the same endpoint.
        return self._gapic("google.cloud.compute_v1", "GlobalOperationsClient", "compute")

    @cached_property
    def region_operations(self) -> Any:
        return self._gapic("google.cloud.compute_v1", "RegionOperationsClient", "compute")

    @cached_property
    def projects(self) -> Any:
        return self._gapic("google.cloud.compute_v1", "ProjectsClient", "compute")

    @cached_property
    def machine_types(self) -> Any:
        return self._gapic("google.cloud.compute_v1", "MachineTypesClient", "compute")

    @cached_property
    def regions(self) -> Any:
        """Compute regions: their quotas (GPUs, TPU v5e) for the pre-flight checks."""
        return self._gapic("google.cloud.compute_v1", "RegionsClient", "compute")

    # --- Resource Manager: the project's IAM policy ------------------------
    @cached_property
    def resource_manager(self) -> Any:
        return self._gapic(
            "google.cloud.resourcemanager_v3", "ProjectsClient", "cloudresourcemanager"
        )

    # --- GKE, TPU, Service Usage -----------------------------------------
    @cached_property
    def container(self) -> Any:
        return self._gapic("google.cloud.container_v1", "ClusterManagerClient", "container")

    @cached_property
    def tpu(self) -> Any:
        return self._gapic("google.cloud.tpu_v2", "TpuClient", "tpu")

    @cached_property
    def service_usage(self) -> Any:
        return self._gapic("google.cloud.service_usage_v1", "ServiceUsageClient", "serviceusage")

    @cached_property
    def cloud_quotas(self) -> Any:
        return self._gapic("google.cloud.cloudquotas_v1", "CloudQuotasClient", "cloudquotas")

    # --- Cloud Build, Artifact Registry (rlctl image) ---------------------
    @cached_property
    def cloudbuild(self) -> Any:
        return self._gapic("google.cloud.devtools.cloudbuild_v1", "CloudBuildClient", "cloudbuild")

    @cached_property
    def artifactregistry(self) -> Any:
        return self._gapic(
            "google.cloud.artifactregistry_v1", "ArtifactRegistryClient", "artifactregistry"
        )

    @property
    def cloudbuild_types(self) -> Any:
        from google.cloud.devtools import cloudbuild_v1

        return cloudbuild_v1

    @property
    def artifactregistry_types(self) -> Any:
        from google.cloud import artifactregistry_v1

        return artifactregistry_v1

    # --- Cloud Storage ----------------------------------------------------
    @cached_property
    def storage(self) -> Any:
        _require("google.cloud.storage", "gcp")
        from google.cloud import storage

        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        with self._lock:
            if emulator and "storage" not in self.endpoints:
                from google.auth.credentials import AnonymousCredentials

                return storage.Client(
                    project=self.project or "test",
                    credentials=AnonymousCredentials(),
                    client_options={"api_endpoint": emulator},
                    client_info=self._client_info(),
                )
            return storage.Client(
                project=self.project,
                credentials=self.credentials,
                client_options=self._options("storage") or None,
                client_info=self._client_info(),
            )

    # --- Kubernetes (GKE control plane) -------------------------------------
    def access_token(self) -> str | None:
        """A fresh OAuth access token of these credentials (refreshed when expired).

        Never log or print it. Anonymous credentials (tests) have none: None.
        """
        creds = self.credentials
        with self._lock:
            if not creds.valid:
                import google.auth.transport.requests

                from rlctl.core.gcp.errors import translate

                try:
                    creds.refresh(google.auth.transport.requests.Request())
                except Exception as e:  # RefreshError, TransportError
                    raise translate(e, "refreshing the access token") from e
            return creds.token

    def kubernetes(self, endpoint: str, ca_cert_b64: str | None) -> ApiClient:
        """A ``kubernetes`` ApiClient for a cluster endpoint and its CA certificate.

        The bearer token is fetched from these credentials before each request
        (``refresh_api_key_hook``), so a long ``logs -f`` outlives a token's hour.
        """
        require_extra("kubernetes", "k8s")
        from rlctl.core.k8s.kubeconfig import api_client, build_configuration

        def token() -> str:
            return self.access_token() or ""

        return api_client(build_configuration(endpoint, ca_cert_b64, token))

    # --- types, re-exported so service modules need no google imports ------
    @property
    def compute_types(self) -> Any:
        from google.cloud import compute_v1

        return compute_v1

    @property
    def container_types(self) -> Any:
        from google.cloud import container_v1

        return container_v1


def adc_project() -> str | None:
    """The project of Application Default Credentials, or None (no network call)."""
    try:
        import google.auth

        _, project = google.auth.default()
        return project
    except Exception:
        return None


# --- no credentials: a dry run plans against an empty project ----------------------------
def credentials_available(env: Mapping[str, str] | None = None) -> bool:
    """Whether Application Default Credentials could be found, judged without I/O beyond
    local files: what ``google.auth.default()`` looks at before it asks the metadata
    server (``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's ADC file, a GCE machine), or
    anonymous mode. ``--dry-run`` without them plans against an empty project."""
    env = os.environ if env is None else env
    if credentials_disabled(env) or env.get("GOOGLE_APPLICATION_CREDENTIALS"):
        return True
    if env.get("GCE_METADATA_HOST") or env.get("GCE_METADATA_IP"):
        return True
    config = env.get("CLOUDSDK_CONFIG") or os.path.join(
        env.get("HOME") or os.path.expanduser("~"), ".config", "gcloud"
    )
    if os.path.isfile(os.path.join(config, "application_default_credentials.json")):
        return True
    try:  # google.auth's own test for a GCE machine: its DMI product name
        with open("/sys/class/dmi/id/product_name") as f:
            return f.read().strip().startswith("Google")
    except OSError:
        return False


class _Absent:
    """A Google Cloud client of an empty project, for planning only: every get is the
    API's 404 (google.api_core NotFound, which rlctl translates as the real one), every
    list is empty, every write is refused (a plan never writes)."""

    def __init__(self, what: str, answers: Mapping[str, Any] | None = None) -> None:
        self._what = what
        self._answers = dict(answers or {})

    def __getattr__(self, method: str) -> Any:
        if method in self._answers:
            answer = self._answers[method]
            return lambda *a, **kw: answer(*a, **kw) if callable(answer) else answer
        if method.startswith(("get", "lookup")):

            def missing(*_a: Any, **_kw: Any) -> Any:
                from google.api_core.exceptions import NotFound

                raise NotFound(f"{self._what}: not in the empty project of this dry run")

            return missing
        if method.startswith("list"):
            return lambda *_a, **_kw: []
        raise ConfigError(
            f"{self._what}.{method}: a dry run without credentials changes nothing",
            hint="run 'gcloud auth application-default login'",
        )


class EmptyProject(Clients):
    """Clients of a project with nothing in it, every API enabled and no quota known:
    what ``--dry-run`` plans against without credentials (as ``terraform plan`` with no
    state, or ``helm template``). ``clusters`` and ``buckets`` add what a dry run of
    ``train --cluster`` assumes ``cluster create`` made (a GKE Cluster message each;
    bucket name -> labels). No call leaves this process."""

    NUMBER = "PROJECT_NUMBER"  # the project number, unknown: shown in IAM members
    project: str  # always given (Clients' may be None: resolved from the environment)
    region: str

    def __init__(
        self,
        project: str,
        region: str,
        clusters: Mapping[str, Any] | None = None,
        buckets: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        super().__init__(project, region, endpoints={})
        self.clusters = dict(clusters or {})
        self.buckets = {k: dict(v) for k, v in (buckets or {}).items()}

    @property
    def credentials(self) -> Any:
        _require("google.auth", "gcp")
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()

    def _empty(self, what: str, **answers: Any) -> Any:
        return _Absent(what, answers)

    @cached_property
    def networks(self) -> Any:
        return self._empty("networks")

    @cached_property
    def subnetworks(self) -> Any:
        return self._empty("subnetworks")

    @cached_property
    def firewalls(self) -> Any:
        return self._empty("firewalls")

    @cached_property
    def projects(self) -> Any:
        from types import SimpleNamespace

        return self._empty("projects", get=SimpleNamespace(id=self.NUMBER, name=self.project))

    @cached_property
    def machine_types(self) -> Any:  # offered in every zone: not known, so not refused
        return self._empty("machineTypes", get=lambda **kw: kw)

    @cached_property
    def regions(self) -> Any:  # no quota known: nothing is refused for it
        from types import SimpleNamespace

        return self._empty("regions", get=SimpleNamespace(quotas=[]))

    @cached_property
    def resource_manager(self) -> Any:
        from types import SimpleNamespace

        return self._empty("projects", get_iam_policy=SimpleNamespace(bindings=[], etag=b""))

    @cached_property
    def service_usage(self) -> Any:
        from types import SimpleNamespace

        def enabled(request: Mapping[str, Any], **_kw: Any) -> Any:
            return SimpleNamespace(
                services=[
                    SimpleNamespace(name=n, state=SimpleNamespace(name="ENABLED"))
                    for n in request.get("names", [])
                ]
            )

        return self._empty("services", batch_get_services=enabled)

    @cached_property
    def tpu(self) -> Any:  # every type of the catalog offered: zones are not known
        from types import SimpleNamespace

        from rlctl.core.config.catalog import all_types

        types = [SimpleNamespace(type_=a.name, name=a.name) for a in all_types() if a.kind == "tpu"]
        return self._empty("acceleratorTypes", list_accelerator_types=types)

    @cached_property
    def container(self) -> Any:
        from types import SimpleNamespace

        def cluster(name: str, **_kw: Any) -> Any:
            short = name.rsplit("/", 1)[-1]
            if short not in self.clusters:
                from google.api_core.exceptions import NotFound

                raise NotFound(f"cluster {short}: not in the empty project of this dry run")
            return self.clusters[short]

        config = SimpleNamespace(valid_master_versions=[], channels=[], default_cluster_version="")
        return self._empty(
            "clusters",
            get_cluster=cluster,
            get_server_config=config,
            list_clusters=SimpleNamespace(clusters=list(self.clusters.values())),
        )

    @cached_property
    def cloud_quotas(self) -> Any:
        return self._empty("quotaInfos")

    @cached_property
    def cloudbuild(self) -> Any:
        return self._empty("builds")

    @cached_property
    def artifactregistry(self) -> Any:
        return self._empty("repositories")

    @cached_property
    def storage(self) -> Any:
        _require("google.cloud.storage", "gcp")
        from types import SimpleNamespace

        from google.cloud import storage

        real = storage.Client(project=self.project, credentials=self.credentials)
        listed = [SimpleNamespace(name=n, labels=labels) for n, labels in self.buckets.items()]

        def lookup(name: str, *_a: Any, **_kw: Any) -> Any:  # an assumed bucket is empty
            return (
                _Absent(f"bucket {name}", {"get_blob": None, "list_blobs": []})
                if name in self.buckets
                else None
            )

        return self._empty("buckets", lookup_bucket=lookup, list_buckets=listed, bucket=real.bucket)

    def access_token(self) -> str | None:
        return None

    def kubernetes(self, endpoint: str, ca_cert_b64: str | None) -> ApiClient:
        raise ConfigError(
            "a dry run without credentials reaches no cluster",
            hint="run 'gcloud auth application-default login'",
        )
