"""What the gcp modules need of the client factory, as a Protocol.

``rlctl.core.clients.Clients`` is the one implementation (it builds the real
google-cloud clients, lazily); tests pass the same class pointed at local fakes.
The Protocol lives here, below ``core/clients``, so the service modules can name
the type without importing upwards: ``clients: GcpClients``. Attributes are the
google-cloud client objects, typed ``Any`` so no google import is needed to read
this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from google.api_core.retry import Retry
    from kubernetes.client import ApiClient


class GcpClients(Protocol):
    project: str | None
    region: str | None
    poll_interval: float

    @property
    def retry(self) -> Retry: ...

    # Compute Engine
    @property
    def networks(self) -> Any: ...
    @property
    def subnetworks(self) -> Any: ...
    @property
    def firewalls(self) -> Any: ...
    @property
    def global_operations(self) -> Any: ...
    @property
    def region_operations(self) -> Any: ...
    @property
    def projects(self) -> Any: ...
    @property
    def machine_types(self) -> Any: ...
    @property
    def regions(self) -> Any: ...
    @property
    def compute_types(self) -> Any: ...

    # GKE, Cloud TPU, Service Usage, Cloud Storage
    @property
    def container(self) -> Any: ...
    @property
    def container_types(self) -> Any: ...
    @property
    def tpu(self) -> Any: ...
    @property
    def service_usage(self) -> Any: ...
    @property
    def cloud_quotas(self) -> Any: ...
    @property
    def storage(self) -> Any: ...

    # Cloud Build and Artifact Registry (rlctl image)
    @property
    def cloudbuild(self) -> Any: ...
    @property
    def cloudbuild_types(self) -> Any: ...
    @property
    def artifactregistry(self) -> Any: ...
    @property
    def artifactregistry_types(self) -> Any: ...

    # Resource Manager (the project's IAM policy)
    @property
    def resource_manager(self) -> Any: ...

    # Kubernetes, with the same credentials
    def access_token(self) -> str | None: ...
    def kubernetes(self, endpoint: str, ca_cert_b64: str | None) -> ApiClient: ...
