"""Talk to the cluster: server-side apply, create-if-missing, list, delete, logs.

One thin wrapper, ``KubeApi``, over the ``kubernetes`` client's ``ApiClient``
(built by ``kubeconfig.py``, or by the client factory). It addresses objects by
(apiVersion, kind) -> REST path, so the same code applies core objects and each
backend's workload (JobSet, RayJob, PathwaysJob: ``backends/``). ``kubernetes``
API errors are translated into rlctl errors here, ``from e``.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from rlctl.core.errors import (
    AlreadyExistsError,
    CloudError,
    ConfigError,
    NotFoundError,
    PermissionDeniedError,
)
from rlctl.core.k8s import backends, kueue
from rlctl.core.k8s.backends.base import RUN_LABEL, Backend, run_selector
from rlctl.core.k8s.diagnose import Diagnosis, diagnose
from rlctl.core.phases import Phase

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

FIELD_MANAGER = "rlctl"
# The kinds rlctl manages besides the workloads (whose plurals their backends give).
PLURALS = {
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Secret"): "secrets",
    ("v1", "Pod"): "pods",
    ("v1", "Event"): "events",
    ("resource.k8s.io/v1", "ResourceClaimTemplate"): "resourceclaimtemplates",
    # what the controllers' manifests (rlctl/data/controllers) hold besides the above
    ("v1", "Service"): "services",
    ("apps/v1", "Deployment"): "deployments",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
    ("kueue.x-k8s.io/v1beta2", "Workload"): "workloads",  # read only: why a run waits
    ("kueue.x-k8s.io/v1beta2", "LocalQueue"): "localqueues",  # read only: is it there
}
# Kinds that live outside any namespace (addressed without /namespaces/NS).
CLUSTER_PLURALS = {
    ("v1", "Namespace"): "namespaces",
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): "customresourcedefinitions",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "clusterroles",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "clusterrolebindings",
    (
        "admissionregistration.k8s.io/v1",
        "MutatingWebhookConfiguration",
    ): "mutatingwebhookconfigurations",
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingWebhookConfiguration",
    ): "validatingwebhookconfigurations",
}
# Created only when missing, never updated: shared or holding a secret value.
CREATE_ONLY = {"ServiceAccount", "Secret"}


def run_kinds() -> list[tuple[str, str]]:
    """What `delete run` looks for, in deletion order (workloads first, so their pods stop)."""
    return [
        *(b.workload_kind for b in backends.registered()),
        ("resource.k8s.io/v1", "ResourceClaimTemplate"),
        ("v1", "ConfigMap"),
        ("v1", "Secret"),
    ]


def _collection(api_version: str, kind: str, namespace: str) -> str:
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    cluster_plural = CLUSTER_PLURALS.get((api_version, kind))
    if cluster_plural is not None:
        return f"{base}/{cluster_plural}"
    backend = backends.by_kind(api_version, kind)
    plural = backend.plural if backend else PLURALS.get((api_version, kind))
    if plural is None:
        raise ConfigError(f"rlctl does not manage {api_version} {kind} objects")
    return f"{base}/namespaces/{namespace}/{plural}"


def _translate(e: Exception, what: str) -> Exception:
    status = getattr(e, "status", None)
    reason = getattr(e, "reason", "") or ""
    if status == 404 and "could not find the requested resource" in _body_message(e):
        # the kind itself is not served: its CRD (controller) is not installed
        return NotFoundError(
            f"the cluster does not serve the kind of {what}: its CRD is not installed",
            hint="re-run 'rlctl cluster create CLUSTER', which installs the JobSet and "
            "PathwaysJob controllers (the Ray operator is GKE's RayOperator add-on)",
        )
    if status == 404:
        return NotFoundError(f"{what} not found")
    if status == 409:
        return AlreadyExistsError(f"{what} already exists")
    if status in (401, 403):
        return PermissionDeniedError(
            f"not allowed: {what} ({status} {reason})",
            hint="check that your account has roles/container.developer on the cluster",
        )
    if status in (400, 422):
        return ConfigError(f"the cluster rejected {what}: {_body_message(e)}")
    return CloudError(f"{what}: {status or ''} {reason}".strip())


def _body_message(e: Exception) -> str:
    import json

    try:
        return json.loads(getattr(e, "body", "") or "{}").get("message") or str(e)
    except ValueError:
        return str(e)


class KubeApi:
    """Namespaced object operations with the real ``kubernetes`` client."""

    def __init__(self, api_client: ApiClient, namespace: str = "default") -> None:
        self.api = api_client
        self.namespace = namespace

    def _call(
        self,
        method: str,
        path: str,
        what: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        response_type: str = "object",
    ) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError as TransportError

        headers = {
            "Accept": "application/json" if response_type == "object" else "*/*",
            "Content-Type": content_type,
        }
        try:
            # the generated client's public request path: serialize (auth, query), send
            method_, url, headers_, body_, post_ = self.api.param_serialize(
                method=method,
                resource_path=path,
                query_params=query or [],
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            resp = self.api.call_api(
                method_, url, header_params=headers_, body=body_, post_params=post_
            )
            data = resp.read()
            if not 200 <= resp.status < 300:
                raise ApiException(http_resp=resp)
        except ApiException as e:
            raise _translate(e, what) from e
        except (OSError, TransportError) as e:  # refused, reset, timed out, retries spent
            reason = getattr(e, "reason", None) or e
            raise CloudError(
                f"cannot reach the cluster API for {what}: {reason}",
                hint="check the cluster's endpoint and your network (a private "
                "cluster needs a route to its control plane)",
            ) from e
        text = data.decode() if isinstance(data, bytes) else str(data or "")
        if response_type != "object":
            return text
        import json

        return json.loads(text) if text else {}

    # --- single objects ----------------------------------------------------------------
    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        ns = namespace or self.namespace
        try:
            return self._call(
                "GET", f"{_collection(api_version, kind, ns)}/{name}", f"{kind}/{name}"
            )
        except NotFoundError:
            return None

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply with field manager ``rlctl`` (forcing our fields), in the
        object's own namespace when it names one (a controller's), else this API's."""
        kind, name = obj["kind"], obj["metadata"]["name"]
        ns = obj["metadata"].get("namespace") or self.namespace
        path = f"{_collection(obj['apiVersion'], kind, ns)}/{name}"
        return self._call(
            "PATCH",
            path,
            f"{kind}/{name}",
            body=obj,
            content_type="application/apply-patch+yaml",
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
        )

    def create_if_missing(self, obj: dict[str, Any]) -> bool:
        """Create ``obj`` unless an object of that name exists; True if created."""
        kind, name = obj["kind"], obj["metadata"]["name"]
        ns = obj["metadata"].get("namespace") or self.namespace
        try:
            self._call(
                "POST",
                _collection(obj["apiVersion"], kind, ns),
                f"{kind}/{name}",
                body=obj,
                query=[("fieldManager", FIELD_MANAGER)],
            )
        except AlreadyExistsError:
            return False
        return True

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> bool:
        path = f"{_collection(api_version, kind, namespace or self.namespace)}/{name}"
        try:
            self._call("DELETE", path, f"{kind}/{name}", body={"propagationPolicy": "Background"})
        except NotFoundError:
            return False
        return True

    def list(
        self, api_version: str, kind: str, selector: str | None = None
    ) -> list[dict[str, Any]]:
        query = [("labelSelector", selector)] if selector else []
        try:
            out = self._call(
                "GET", _collection(api_version, kind, self.namespace), f"{kind} list", query=query
            )
        except NotFoundError:  # the CRD is not installed: nothing of that kind
            return []
        return list(out.get("items") or [])

    def log(self, pod: str, container: str | None = None, tail_lines: int | None = None) -> str:
        query = [("container", container)] if container else []
        if tail_lines is not None:
            query.append(("tailLines", str(tail_lines)))
        return self._call(
            "GET",
            f"/api/v1/namespaces/{self.namespace}/pods/{pod}/log",
            f"log of {pod}",
            query=query,
            response_type="str",
        )

    def last_log_line(
        self, pod: str, container: str | None = None, previous: bool = False
    ) -> str | None:
        query = [("tailLines", "1")]
        if container:
            query.append(("container", container))
        if previous:
            query.append(("previous", "true"))
        try:
            text = self._call(
                "GET",
                f"/api/v1/namespaces/{self.namespace}/pods/{pod}/log",
                f"log of {pod}",
                query=query,
                response_type="str",
            )
        except (NotFoundError, ConfigError):
            return None
        lines = [ln for ln in str(text).splitlines() if ln.strip()]
        return lines[-1] if lines else None


# --- run-level operations ---------------------------------------------------------------
def hf_token_secret(run: str, token: str, name: str, key: str = "token") -> dict[str, Any]:
    """The run's HF token Secret. Built here, never rendered or printed."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": name,
            "labels": {
                "managed-by": "rlctl",
                "app.kubernetes.io/managed-by": "rlctl",
                RUN_LABEL: run,
            },
        },
        "data": {key: base64.b64encode(token.encode()).decode()},
    }


def apply_objects(api: KubeApi, objs: list[dict[str, Any]]) -> list[str]:
    """Create-if-missing the shared/secret kinds, server-side apply the rest, in order.

    Returns 'Kind/name (action)' lines, with no object content.
    """
    done = []
    for obj in objs:
        label = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] in CREATE_ONLY:
            created = api.create_if_missing(obj)
            done.append(f"{label} ({'created' if created else 'exists, kept'})")
        else:
            api.apply(obj)
            done.append(f"{label} (applied)")
    return done


def list_run_objects(api: KubeApi, run: str) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of every rlctl-labelled object of ``run``."""
    found = []
    for api_version, kind in run_kinds():
        for obj in api.list(api_version, kind, run_selector(run)):
            labels = obj.get("metadata", {}).get("labels") or {}
            if labels.get("managed-by") == "rlctl" and labels.get(RUN_LABEL) == run:
                found.append((api_version, kind, obj["metadata"]["name"]))
    return found


def delete_objects(api: KubeApi, objs: list[tuple[str, str, str]]) -> list[str]:
    return [
        f"{kind}/{name}" for api_version, kind, name in objs if api.delete(api_version, kind, name)
    ]


def _or_all(backend: Backend | None) -> tuple[Backend, ...]:
    """The run's backend, or (not known: a run recorded by another rlctl) every one."""
    return (backend,) if backend is not None else backends.registered()


def find_workload(api: KubeApi, run: str, backend: Backend | None = None) -> dict[str, Any] | None:
    kinds = [b.workload_kind for b in _or_all(backend)]
    for api_version, kind in kinds:
        obj = api.get(api_version, kind, run)
        if obj is not None and (obj.get("metadata", {}).get("labels") or {}).get(RUN_LABEL) == run:
            return obj
    return None


def run_pods(api: KubeApi, run: str, backend: Backend | None = None) -> list[dict[str, Any]]:
    """The run's pods, found by the backend's selectors (every backend's when it is not
    known): rlctl's run label, plus e.g. the JobSet name a PathwaysJob's workers carry."""
    selectors = dict.fromkeys(s for b in _or_all(backend) for s in b.pod_selectors(run))
    pods: list[dict[str, Any]] = []
    names: set[str] = set()
    for selector in selectors:
        for p in api.list("v1", "Pod", selector):
            if p["metadata"]["name"] not in names:
                names.add(p["metadata"]["name"])
                pods.append(p)
    return pods


def describe_workload(api: KubeApi, run: str, backend: Backend | None = None) -> Diagnosis:
    """The run's workload phase and, when it is not running, why (one line)."""
    workload = find_workload(api, run, backend)
    pods = run_pods(api, run, backend)
    names = {p["metadata"]["name"] for p in pods}
    events = [
        e
        for e in api.list("v1", "Event")
        if (e.get("involvedObject") or {}).get("name") in names | {run}
    ]
    last_lines: dict[str, str] = {}
    for p in pods:
        for cs in (p.get("status") or {}).get("containerStatuses") or []:
            crashing = ((cs.get("state") or {}).get("waiting") or {}).get(
                "reason"
            ) == "CrashLoopBackOff" or cs.get("restartCount")
            failed = (p.get("status") or {}).get("phase") == "Failed"
            if crashing or failed:
                line = api.last_log_line(
                    p["metadata"]["name"], cs.get("name"), previous=bool(crashing)
                )
                if line:
                    last_lines[p["metadata"]["name"]] = line
    if workload is None and not pods:
        return Diagnosis(phase=Phase.ABSENT, reason="no workload on the cluster")
    queue = kueue.queue_of(workload)
    if queue and workload is not None:  # suspended by Kueue until it is admitted
        waiting = kueue.waiting_reason(api.list(kueue.WORKLOAD_API, "Workload"), workload)
        if waiting is not None:
            found = diagnose(workload, pods, events, last_lines)
            return Diagnosis(
                phase=Phase.PENDING,
                reason=f"waiting in Kueue queue {queue}: {waiting}",
                pods=found.pods,
            )
    return diagnose(workload, pods, events, last_lines)


def trainer_logs(
    api: KubeApi, run: str, tail_lines: int = 100, backend: Backend | None = None
) -> tuple[str, str]:
    """(pod, text): the last lines of the run's leading trainer process, from its pod.

    ``rlctl logs`` reads the run store's train.log first (every backend's trainer writes
    it); this is its fallback, before the trainer has written any. The pods are found as
    the controllers label them (``run_pods``: JobSet and KubeRay copy the template's
    labels, pathways-job's head carries only JobSet's), and the leader is the first by
    name that runs the backend's ``leader_container``: JobSet ``RUN-slice-0-0-…``
    (process 0), Pathways the head, Ray the submitter, where the driver's output lands.
    """
    pods = sorted(run_pods(api, run, backend), key=lambda p: p["metadata"]["name"])
    leaders = list(dict.fromkeys(b.leader_container for b in _or_all(backend)))
    for c in leaders:
        for p in pods:
            names = [x.get("name") for x in (p.get("spec") or {}).get("containers") or []]
            if c in names:
                return p["metadata"]["name"], api.log(p["metadata"]["name"], c, tail_lines)
    raise NotFoundError(
        f"no trainer pod for run {run!r} yet", hint=f"see why with 'rlctl status {run}'"
    )
