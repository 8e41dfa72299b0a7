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

SERVICES = ("compute", "container", "tpu", "serviceusage", "storage", "cloudbuild",
            "artifactregistry", "cloudresourcemanager", "cloudquotas")
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
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query \
            or parts.fragment:
        raise ConfigError(f"{variable}={value!r} is not an endpoint URL",
                          hint="give a scheme and host, e.g. https://HOST or "
                          "http://127.0.0.1:PORT")
    if parts.path.strip("/"):
        raise ConfigError(f"{variable}={value!r}: give the endpoint without a path",
                          hint="the client libraries add the API path (/compute/v1, /v1, ...) "
                          "themselves; unlike gcloud's overrides, leave it out")
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
        service = variable[len(ENDPOINT_ENV_PREFIX):].lower()
        if service not in SERVICES:
            raise ConfigError(f"{variable}: unknown service {service!r}",
                              hint="use one of " + ", ".join(
                                  ENDPOINT_ENV_PREFIX + s.upper() for s in SERVICES))
        out[service] = _endpoint(variable, value.strip())
    return out


def credentials_disabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``RLCTL_AUTH_DISABLE_CREDENTIALS`` asks for anonymous credentials."""
    env = os.environ if env is None else env
    raw = env.get(DISABLE_CREDENTIALS_ENV, "")
    value = raw.strip().lower()
    if value not in _TRUE + _FALSE:
        raise ConfigError(f"{DISABLE_CREDENTIALS_ENV}={raw!r} is not a boolean",
                          hint="use true or false")
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
        return self._gapic("google.cloud.resourcemanager_v3", "ProjectsClient",
                           "cloudresourcemanager")

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
        return self._gapic("google.cloud.devtools.cloudbuild_v1", "CloudBuildClient",
                           "cloudbuild")

    @cached_property
    def artifactregistry(self) -> Any:
        return self._gapic("google.cloud.artifactregistry_v1", "ArtifactRegistryClient",
                           "artifactregistry")

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
                    project=self.project or "test", credentials=AnonymousCredentials(),
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
