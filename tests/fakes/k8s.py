"""A small in-memory Kubernetes API on 127.0.0.1 that the real ``kubernetes`` client talks to.

It speaks enough of the REST protocol for rlctl: create (POST), get, list (with
``labelSelector`` equality terms), server-side apply (PATCH with
``application/apply-patch+yaml``: create or replace the applied fields, owned by
``fieldManager``), delete, and ``pods/NAME/log``, for namespaced objects and for
cluster-scoped ones (namespaces, CRDs, cluster roles, webhook configurations: the
controllers ``cluster create`` installs; stored under namespace ""). An applied
CustomResourceDefinition is reported ``Established`` after ``crd_delay`` GETs
(0: at once), as the API server does once it serves the new kind. Tests seed pods,
events and logs directly into ``FakeKube.objects`` / ``FakeKube.logs`` and read
the request log from ``FakeKube.requests``.

With ``FakeKube.nodes`` set (the cluster's node pools, ``nodes_of_cluster``), a
workload that is created or applied becomes pods as the controllers rlctl relies on
make and admit them (``rlctl.core.k8s.admission``: JobSet v0.12.0's exclusive
placement, pathways-job v0.1.4's head sidecars and host network, KubeRay's probe
injection for ``controller_versions``, GKE's GCS FUSE sidecar; each cited there), named and
labelled as those controllers name and label them (``tests.fakes.controllers``), placed
on the nodes as kube-scheduler's filters would (``rlctl.core.k8s.fit``). A pod that no
node can take is stored Pending with an ``Unschedulable`` condition, as the scheduler
reports it, and listed in ``FakeKube.unschedulable``: fixtures fail a test that leaves
one behind.
"""

from __future__ import annotations

import copy
import json
import random
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

# serve_forever() looks for shutdown() every POLL_S: at its default 0.5 s each server a
# test stops cost up to half a second, about 30 s of the fast loop (issue #56)
POLL_S = 0.02

_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>log))?$"
)
BUILTIN_GROUPS = {
    "apps",
    "batch",
    "apiextensions.k8s.io",
    "rbac.authorization.k8s.io",
    "admissionregistration.k8s.io",
    "resource.k8s.io",
}
KINDS = {
    "pods": "Pod",
    "events": "Event",
    "configmaps": "ConfigMap",
    "secrets": "Secret",
    "serviceaccounts": "ServiceAccount",
    "jobsets": "JobSet",
    "rayjobs": "RayJob",
    "pathwaysjobs": "PathwaysJob",
    "leaderworkersets": "LeaderWorkerSet",
    "workloads": "Workload",
    "localqueues": "LocalQueue",
    "clusterqueues": "ClusterQueue",
    "resourceclaimtemplates": "ResourceClaimTemplate",
    "services": "Service",
    "namespaces": "Namespace",
    "customresourcedefinitions": "CustomResourceDefinition",
    "deployments": "Deployment",
    "roles": "Role",
    "rolebindings": "RoleBinding",
    "clusterroles": "ClusterRole",
    "clusterrolebindings": "ClusterRoleBinding",
    "mutatingwebhookconfigurations": "MutatingWebhookConfiguration",
    "validatingwebhookconfigurations": "ValidatingWebhookConfiguration",
}


def _matches(obj: dict[str, Any], selector: str | None) -> bool:
    if not selector:
        return True
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in selector.split(","):
        k, _, v = term.partition("=")
        if labels.get(k) != v:
            return False
    return True


class FakeKube:
    def __init__(self) -> None:
        # (api_prefix, plural, namespace, name) -> object
        self.objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self.logs: dict[tuple[str, str], str] = {}  # (namespace, pod) -> text
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self._rv = 0
        self.crd_delay = 0  # GETs of a new CRD before it reports Established
        # True: a custom kind is served only once its CRD exists (else the API server's
        # 404 "the server could not find the requested resource"), as on a real cluster
        self.served_only = False
        self._crd_gets: dict[str, int] = {}
        self.nodes: list[Any] | None = None  # config.nodes.NodePool; None: no pods made
        # backend -> its controller's version to model (None: the backend's own default;
        # KubeRay 1.5.2's exec wget probes, pod.go)
        self.controller_versions: dict[str, tuple[int, ...]] = {}
        self.unschedulable: list[str] = []  # 'pod: reason' of pods left Pending
        # the random tails of generated pod names, repeatable from one test run to the next
        self.rng = random.Random(0)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(
            target=self.server.serve_forever, args=(POLL_S,), daemon=True
        )

    def __enter__(self) -> FakeKube:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    # --- seeding and inspection ----------------------------------------------------
    def put(self, api: str, plural: str, obj: dict[str, Any]) -> None:
        """Seed an object, e.g. put("v1", "pods", {...})."""
        md = obj.setdefault("metadata", {})
        md.setdefault("namespace", "default")
        md.setdefault("uid", str(uuid.uuid4()))
        obj.setdefault("kind", KINDS.get(plural, plural))
        obj.setdefault("apiVersion", api)
        with self.lock:
            self.objects[(api, plural, md["namespace"], md["name"])] = obj

    def seed_ready(
        self,
        namespace: str = "default",
        service_account: str = "rlctl",
        crds: tuple[str, ...] = (
            "jobsets.jobset.x-k8s.io",
            "pathwaysjobs.pathways-job.pathways.domain",
            "rayjobs.ray.io",
        ),
    ) -> None:
        """What ``cluster create`` leaves: established CRDs, the namespace and the KSA."""
        for crd in crds:
            self.put(
                "apiextensions.k8s.io/v1",
                "customresourcedefinitions",
                {
                    "metadata": {"name": crd, "namespace": ""},
                    "status": {"conditions": [{"type": "Established", "status": "True"}]},
                },
            )
        self.put("v1", "namespaces", {"metadata": {"name": namespace, "namespace": ""}})
        self.put(
            "v1", "serviceaccounts", {"metadata": {"name": service_account, "namespace": namespace}}
        )

    def names(self, plural: str | None = None, cluster: bool = False) -> list[str]:
        """'Kind/name' of every stored namespaced object (optionally of one plural), sorted;
        cluster-scoped ones (CRDs, namespaces, cluster roles) with ``cluster=True``. Pods
        a controller made (``admit``) only when asked for by plural."""
        return sorted(
            f"{o['kind']}/{o['metadata']['name']}"
            for (_, p, ns, _), o in self.objects.items()
            if plural in (None, p)
            and (bool(ns) != cluster)
            and (plural == "pods" or not o["metadata"].get("ownerReferences"))
        )

    def _establish(self, crd: dict[str, Any]) -> None:
        name = crd["metadata"]["name"]
        seen = self._crd_gets[name] = self._crd_gets.get(name, 0) + 1
        if seen > self.crd_delay:
            crd["status"] = {"conditions": [{"type": "Established", "status": "True"}]}

    # --- what controllers and the scheduler do with a workload -------------------------
    def admit(self, obj: dict[str, Any], locked: bool = False) -> None:
        """Create the pods the workload's controller makes, as admitted and scheduled
        (``locked``: the caller holds ``self.lock``, as the request handler does).

        Their specs are ``rlctl.core.k8s.admission``'s model (pinned to its sources by
        tests/core/k8s/test_upstream.py); their names, labels and annotations are the
        controllers' own (``tests.fakes.controllers``, each citing its upstream file):
        JobSet's RUN-RJOB-J-I-xxxxx with the pod template's labels and JobSet's, the
        Pathways head with JobSet's labels only, KubeRay's CLUSTER-head-xxxxx,
        CLUSTER-GROUP-worker-xxxxx and the submitter RUN-xxxxx."""
        from rlctl.core.k8s import backends
        from rlctl.core.k8s.fit import check
        from tests.fakes import kueue
        from tests.fakes.controllers import generic_identities, pod_identities

        backend = backends.for_object(obj)
        if self.nodes is None or backend is None or obj.get("kind") != backend.kind:
            return
        groups = backend.pod_groups(obj, self.controller_versions.get(backend.name))
        if (obj["metadata"].get("labels") or {}).get(kueue.QUEUE_LABEL):
            if locked:  # Kueue suspends a queued job until it admits it (tests/fakes/kueue.py)
                admitted = kueue.admit(self.objects, obj, groups)
            else:
                with self.lock:
                    admitted = kueue.admit(self.objects, obj, groups)
            if not admitted:
                return
        report = check(groups, self.nodes)
        ns = obj["metadata"].get("namespace", "default")
        run = obj["metadata"]["name"]
        worker_vms = groups[-1].pods if obj["kind"] == "PathwaysJob" else 1
        # a workload kind no fake controller emulates (a backend being added): its pods
        # as a controller that copies the pod template's labels names them
        identities = pod_identities(obj, self.rng, worker_vms) or generic_identities(
            run, [g.total for g in groups]
        )
        for g, placed, ids in zip(groups, report.placements, identities, strict=True):
            assert len(ids) == g.jobs * g.pods, (g.name, len(ids))
            for ident in ids:
                name = ident["name"]
                pod: dict[str, Any] = {
                    "metadata": {
                        "name": name,
                        "namespace": ns,
                        "labels": ident["labels"],
                        "annotations": ident["annotations"],
                        # owned through Jobs/RayClusters in reality; deleting the
                        # workload removes its pods (garbage collection, cascading)
                        "ownerReferences": [
                            {
                                "uid": obj["metadata"].get("uid", ""),
                                "kind": obj["kind"],
                                "name": run,
                            }
                        ],
                    },
                    "spec": copy.deepcopy(g.pod),
                }
                if placed.fits:
                    pod["spec"]["nodeName"] = f"{placed.pools[0]}-node"
                    pod["status"] = {"phase": "Running"}
                else:
                    msg = (
                        f"0/{sum(p.nodes for p in self.nodes)} nodes are available: {placed.detail}"
                    )
                    pod["status"] = {
                        "phase": "Pending",
                        "conditions": [
                            {
                                "type": "PodScheduled",
                                "status": "False",
                                "reason": "Unschedulable",
                                "message": msg,
                            }
                        ],
                    }
                    self.unschedulable.append(f"{name}: {placed.reason}: {placed.detail}")
                if locked:
                    pod.update(kind="Pod", apiVersion="v1")
                    pod["metadata"]["uid"] = str(uuid.uuid4())
                    self.objects[("v1", "pods", ns, name)] = pod
                else:
                    self.put("v1", "pods", pod)

    def pods_of(self, run: str, **labels: str) -> list[dict[str, Any]]:
        """The pods a controller made for ``run``'s workload with these labels, by name
        (how a test finds them: their names end in random characters, as on GKE)."""
        with self.lock:
            return sorted(
                (
                    o
                    for (_, p, _, _), o in self.objects.items()
                    if p == "pods"
                    and any(
                        r.get("name") == run for r in o["metadata"].get("ownerReferences") or []
                    )
                    and all(o["metadata"].get("labels", {}).get(k) == v for k, v in labels.items())
                ),
                key=lambda o: o["metadata"]["name"],
            )

    def mutations(self) -> list[tuple[str, str]]:
        return [(r["method"], r["path"]) for r in self.requests if r["method"] != "GET"]

    # --- HTTP ------------------------------------------------------------------------
    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def _send(self, code: int, body: Any, ctype: str = "application/json") -> None:
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, reason: str, msg: str) -> None:
                self._send(
                    code,
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "reason": reason,
                        "message": msg,
                        "code": code,
                    },
                )

            def _route(self, method: str) -> None:
                url = urlparse(self.path)
                q = {k: v[0] for k, v in parse_qs(url.query).items()}
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                fake.requests.append(
                    {
                        "method": method,
                        "path": url.path,
                        "query": q,
                        "content_type": self.headers.get("Content-Type"),
                        "authorization": self.headers.get("Authorization"),
                        "body": raw.decode(errors="replace"),
                    }
                )
                m = _PATH.match(url.path)
                if not m:
                    return self._status(404, "NotFound", f"no route {url.path}")
                api = m["core"] or f"{m['group']}/{m['version']}"
                ns, plural, name = m["ns"] or "", m["plural"], m["name"]
                key = (api, plural, ns, name or "")
                with fake.lock:
                    if (
                        fake.served_only
                        and m["group"]
                        and m["group"] not in BUILTIN_GROUPS
                        and (
                            "apiextensions.k8s.io/v1",
                            "customresourcedefinitions",
                            "",
                            f"{plural}.{m['group']}",
                        )
                        not in fake.objects
                    ):
                        return self._status(
                            404, "NotFound", "the server could not find the requested resource"
                        )
                    if m["sub"] == "log":
                        if (ns, name) not in fake.logs:
                            return self._status(404, "NotFound", f"no log for {name}")
                        lines = fake.logs[(ns, name)].splitlines()
                        tail = int(q.get("tailLines", len(lines) or 1))
                        return self._send(
                            200, "".join(f"{ln}\n" for ln in lines[-tail:]), "text/plain"
                        )
                    if method == "GET" and not name:
                        items = [
                            copy.deepcopy(o)
                            for (a, p, n, _), o in fake.objects.items()
                            if (a, p, n) == (api, plural, ns)
                            and _matches(o, q.get("labelSelector"))
                        ]
                        kind = KINDS.get(plural, plural)
                        return self._send(
                            200,
                            {
                                "kind": f"{kind}List",
                                "apiVersion": api,
                                "metadata": {"resourceVersion": str(fake._rv)},
                                "items": items,
                            },
                        )
                    if method == "GET":
                        if key not in fake.objects:
                            return self._status(404, "NotFound", f"{plural} {name!r} not found")
                        if plural == "customresourcedefinitions":
                            fake._establish(fake.objects[key])
                        return self._send(200, fake.objects[key])
                    if method == "DELETE":
                        obj = fake.objects.pop(key, None)
                        if obj is None:
                            return self._status(404, "NotFound", f"{plural} {name!r} not found")
                        uid = obj["metadata"].get("uid")
                        for k, o in list(fake.objects.items()):  # the garbage collector
                            if uid and any(
                                r.get("uid") == uid
                                for r in o["metadata"].get("ownerReferences") or []
                            ):
                                del fake.objects[k]
                        return self._send(
                            200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}
                        )
                    body = json.loads(raw or b"{}")  # JSON is YAML: the client sends JSON
                    fake._rv += 1
                    if method == "POST":
                        key = (api, plural, ns, body["metadata"]["name"])
                        if key in fake.objects:
                            return self._status(
                                409, "AlreadyExists", f"{plural} {key[3]!r} already exists"
                            )
                        obj = self._stamp(body, ns, None)
                        fake.objects[key] = obj
                        fake.admit(copy.deepcopy(obj), locked=True)
                        return self._send(201, obj)
                    if method == "PATCH":
                        if self.headers.get("Content-Type") != "application/apply-patch+yaml":
                            return self._status(
                                415, "UnsupportedMediaType", "only server-side apply is implemented"
                            )
                        if not q.get("fieldManager"):
                            return self._status(422, "Invalid", "fieldManager is required")
                        if body.get("metadata", {}).get("name") != name:
                            return self._status(400, "BadRequest", "name mismatch")
                        old = fake.objects.get(key)
                        obj = self._stamp(body, ns, old)
                        obj["metadata"]["managedFields"] = [
                            {"manager": q["fieldManager"], "operation": "Apply"}
                        ]
                        fake.objects[key] = obj
                        if old is None:
                            fake.admit(copy.deepcopy(obj), locked=True)
                        return self._send(201 if old is None else 200, obj)
                return self._status(405, "MethodNotAllowed", method)

            def _stamp(
                self, body: dict[str, Any], ns: str, old: dict[str, Any] | None
            ) -> dict[str, Any]:
                obj = copy.deepcopy(body)
                md = obj.setdefault("metadata", {})
                if ns:
                    md["namespace"] = ns
                else:  # cluster-scoped
                    md.pop("namespace", None)
                md["uid"] = (old or {}).get("metadata", {}).get("uid") or str(uuid.uuid4())
                md["resourceVersion"] = str(fake._rv)
                if old and "status" in old:
                    obj["status"] = old["status"]
                return obj

            def do_GET(self) -> None:
                self._route("GET")

            def do_POST(self) -> None:
                self._route("POST")

            def do_PATCH(self) -> None:
                self._route("PATCH")

            def do_DELETE(self) -> None:
                self._route("DELETE")

        return Handler


def nodes_of_cluster(gcp: Any, cluster: str, region: str = "us-central1") -> list[Any]:
    """The node pools of a cluster in the GCP fake, as the scheduler sees their nodes
    (``rlctl.core.gcp.cluster.node_pools_of`` on the REST JSON the fake holds)."""
    from google.cloud import container_v1

    from rlctl.core.gcp.cluster import node_pools_of

    doc = gcp.clusters[(region, cluster)]
    pools = [
        container_v1.NodePool.from_json(json.dumps(p), ignore_unknown_fields=True)
        for p in doc.get("nodePools", [])
    ]
    return node_pools_of(pools)[0]
