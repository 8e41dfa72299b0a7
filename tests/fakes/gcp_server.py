"""A wire-level fake of the Compute, GKE, TPU, Service Usage, Cloud Build and Artifact
Registry REST APIs (stdlib only).

The real google-cloud client libraries talk to it over HTTP on 127.0.0.1. State
lives in memory; mutations return long-running operations that go PENDING ->
RUNNING -> DONE (one step per poll, or by wall time when ``latency`` is set);
errors can be injected per request (HTTP status) or per operation (an operation
that finishes with an error). ``/storage/...`` is forwarded to fake-gcs-server,
except bucket IAM policies (``GET/PUT /storage/v1/b/B/iam``), which
fake-gcs-server does not implement, and bucket ``labels``/``iamConfiguration``,
and ``location``, which it drops or ignores: this fake keeps those and merges them
into its bucket responses.

Cloud Build: a build goes QUEUED -> WORKING -> SUCCESS over the client's polls (its
context object must exist in the bucket, as the real service fetches it), then its
images' tags exist in Artifact Registry; ``fail_build(step, detail)`` makes the next
build fail in that step. Artifact Registry: Docker repositories (created through a
long-running operation), their images and tags.
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

# serve_forever() looks for shutdown() every POLL_S: at its default 0.5 s each server a
# test stops cost up to half a second, about 30 s of the fast loop (issue #56)
POLL_S = 0.02

STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}
DEFAULT_TPU_TYPES = ["v5litepod-16", "v6e-1", "v6e-4", "v6e-8", "v6e-16", "v6e-32", "v6e-64"]
MUTATING = ("POST", "PUT", "PATCH", "DELETE")


def _pathways_tag() -> str:
    from rlctl.core.k8s.backends.pathways import image_pathways_version

    return image_pathways_version()


@dataclass
class Req:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any

    @property
    def mutation(self) -> bool:
        # a POST that reads: Compute's operation wait, Resource Manager's getIamPolicy
        return self.method in MUTATING and not self.path.endswith(("/wait", ":getIamPolicy"))


@dataclass
class Fault:
    method: str
    pattern: re.Pattern
    status: int
    message: str
    reason: str | None
    times: int


@dataclass
class Op:
    id: str
    api: str  # compute | gke
    kind: str
    target: str
    created: float
    on_done: Any
    region: str | None = None
    location: str | None = None
    polls: int = 0
    state: str = "PENDING"
    error: tuple[Any, str] | None = None
    history: list[str] = field(default_factory=list)


class FakeGCP:
    def __init__(
        self,
        project: str = "p",
        number: str = "123456789012",
        latency: float = 0.0,
        gcs_url: str | None = None,
    ) -> None:
        self.project, self.number, self.latency, self.gcs_url = project, number, latency, gcs_url
        self.lock = threading.RLock()
        self.requests: list[Req] = []
        self.faults: list[Fault] = []
        self.op_faults: list[tuple[re.Pattern, Any, str]] = []
        self.ops: dict[str, Op] = {}
        self._ids = itertools.count(1)
        self.networks: dict[str, dict] = {}
        self.subnets: dict[tuple[str, str], dict] = {}
        self.firewalls: dict[str, dict] = {}
        self.clusters: dict[tuple[str, str], dict] = {}
        self.bucket_meta: dict[str, dict] = {}
        self.bucket_iam: dict[str, dict] = {}
        self.enabled = {
            "compute.googleapis.com",
            "container.googleapis.com",
            "tpu.googleapis.com",
            "storage.googleapis.com",
            "cloudbuild.googleapis.com",
            "artifactregistry.googleapis.com",
        }
        # The project's IAM policy (Resource Manager v3 projects.getIamPolicy): by default
        # a project from before 2024, whose Compute Engine default service account was
        # granted Editor on creation ("Default service accounts", Compute Engine docs);
        # tests of new projects empty it (organization policy
        # iam.automaticIamGrantsForDefaultServiceAccounts).
        self.project_iam: dict[str, Any] = {
            "version": 1,
            "etag": "BwYA",
            "bindings": [
                {
                    "role": "roles/editor",
                    "members": [f"serviceAccount:{number}-compute@developer.gserviceaccount.com"],
                }
            ],
        }
        # Compute regions.get quotas[] per region: metric -> (limit, usage); a metric not
        # listed is not reported, as for TPU v6e/v5p (kept in the Cloud Quotas API)
        self.quotas: dict[str, dict[str, tuple[float, float]]] = {}
        # Cloud Quotas' QuotaInfo JSON per service (quota_info() builds one): none by default
        self.quota_infos: dict[str, list[dict[str, Any]]] = {}
        self.tpu_types: dict[str, list[str]] = {}
        self.machine_types: dict[str, set[str]] = {}
        self.default_tpu_types = list(DEFAULT_TPU_TYPES)
        self.default_machine_types = {"a3-highgpu-8g", "e2-standard-8"}
        self.server_config = {
            "defaultClusterVersion": "1.34.1-gke.1829001",
            "validMasterVersions": ["1.35.1-gke.1000", "1.34.1-gke.1829001", "1.33.5-gke.1200"],
            "channels": [
                {"channel": "RAPID", "defaultVersion": "1.35.1-gke.1000"},
                {"channel": "REGULAR", "defaultVersion": "1.34.1-gke.1829001"},
                {"channel": "STABLE", "defaultVersion": "1.33.5-gke.1200"},
            ],
        }
        # the Kubernetes API of clusters made here (a FakeKube URL), so `cluster create`
        # installs its controllers through the real client; None: an unroutable address
        self.kube_endpoint: str | None = None
        # Artifact Registry and Cloud Build
        self.repositories: dict[tuple[str, str], dict] = {}
        self.docker_images: dict[tuple[str, str, str], dict[str, str]] = {}  # -> {tag: digest}
        # Other projects' public Docker repositories, read through the same API (a public
        # Artifact Registry repository grants roles/artifactregistry.reader to allUsers, so
        # any caller may get its tags and list its images): (project, location, repository,
        # package) -> {tag: digest}. Seeded with Google's Pathways images, which pathways-job
        # v0.1.4 pulls (pathwaysjob_controller.go DefaultPathwaysRMAndWorkerImage and
        # DefaultPathwaysProxyImage), at the tag rlctl derives from its TPU image's JAX, as if
        # published; the pre-flight's own test removes it (tests/cli/test_cluster_runs.py).
        self.public_images: dict[tuple[str, str, str, str], dict[str, str]] = {
            ("cloud-tpu-v2-images", "us", "pathways", pkg): {
                _pathways_tag(): "sha256:" + "7" * 64,
                "jax-0.9.0": "sha256:" + "6" * 64,
            }
            for pkg in ("server", "proxy_server")
        }
        self.builds: dict[str, dict] = {}
        self._build_fault: tuple[int, str] | None = None
        self._server: ThreadingHTTPServer | None = None

    # --- lifecycle ---------------------------------------------------------
    def start(self, port: int = 0) -> FakeGCP:
        """Serve on 127.0.0.1:``port`` (0: a free one) from a daemon thread."""
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def _handle(self) -> None:
                fake._dispatch(self)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, args=(POLL_S,), daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # --- test helpers ---------------------------------------------------------
    def fail(
        self,
        method: str,
        pattern: str,
        status: int,
        message: str = "injected",
        reason: str | None = None,
        times: int = 1,
    ) -> None:
        """The next ``times`` requests matching ``method`` + ``pattern`` (regex) get ``status``."""
        self.faults.append(Fault(method, re.compile(pattern), status, message, reason, times))

    def fail_operation(self, pattern: str, code: Any, message: str) -> None:
        """The operation started by the next mutation matching ``pattern`` ends with an error."""
        self.op_faults.append((re.compile(pattern), code, message))

    def mutations(self) -> list[Req]:
        return [r for r in self.requests if r.mutation]

    def find(self, method: str, pattern: str) -> list[Req]:
        rx = re.compile(pattern)
        return [r for r in self.requests if r.method == method and rx.search(r.path)]

    def is_empty(self) -> bool:
        return not (
            self.networks
            or self.subnets
            or self.firewalls
            or self.clusters
            or self.bucket_meta
            or self._gcs_buckets()
        )

    def _gcs_buckets(self) -> list[str]:
        if not self.gcs_url:
            return []
        with urllib.request.urlopen(f"{self.gcs_url}/storage/v1/b") as f:
            return [b["name"] for b in json.loads(f.read()).get("items", [])]

    # --- plumbing ---------------------------------------------------------------
    def _dispatch(self, h: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(h.path)
        n = int(h.headers.get("content-length") or 0)
        raw = h.rfile.read(n) if n else b""
        try:
            body = (
                json.loads(raw)
                if raw and "json" in (h.headers.get("content-type") or "json")
                else None
            )
        except ValueError:
            body = None
        req = Req(h.command, parts.path, parse_qs(parts.query), body)
        logged = Req(h.command, parts.path, parse_qs(parts.query), copy.deepcopy(body))
        if parts.path.startswith(
            ("/storage/", "/upload/", "/download/")
        ) and not parts.path.endswith("/iam"):
            with self.lock:
                self.requests.append(logged)
            return self._proxy(h, parts, raw)
        with self.lock:
            self.requests.append(logged)
            fault = next(
                (
                    f
                    for f in self.faults
                    if f.times > 0 and f.method == h.command and f.pattern.search(parts.path)
                ),
                None,
            )
            if fault:
                fault.times -= 1
                return self._error(h, fault.status, fault.message, fault.reason)
            if self.latency and req.mutation and not parts.path.startswith("/storage/"):
                pass  # latency is charged on the operation, not the call
            try:
                status, payload = self._route(req)
            except KeyError as e:
                return self._error(h, 404, f"The resource '{e.args[0]}' was not found", "notFound")
            except Conflict as e:
                return self._error(h, 409, str(e), "alreadyExists")
        wait = getattr(payload, "wait_for", None)
        if wait is not None:  # Compute's operations.wait blocks until DONE
            payload = wait()
        self._send(h, status, payload)

    def _send(self, h: BaseHTTPRequestHandler, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        h.send_response(status)
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _error(
        self, h: BaseHTTPRequestHandler, status: int, message: str, reason: str | None = None
    ) -> None:
        err: dict[str, Any] = {
            "code": status,
            "message": message,
            "status": STATUS_NAMES.get(status, "UNKNOWN"),
        }
        if reason:
            err["errors"] = [{"reason": reason, "message": message, "domain": "global"}]
        self._send(h, status, {"error": err})

    # --- operations -------------------------------------------------------------
    def _op(
        self,
        api: str,
        kind: str,
        target: str,
        on_done: Any,
        path: str,
        region: str | None = None,
        location: str | None = None,
    ) -> Op:
        op = Op(
            id=f"operation-{next(self._ids)}",
            api=api,
            kind=kind,
            target=target,
            created=time.monotonic(),
            on_done=on_done,
            region=region,
            location=location,
        )
        for i, (rx, code, msg) in enumerate(self.op_faults):
            if rx.search(path):
                op.error = (code, msg)
                del self.op_faults[i]
                break
        self.ops[op.id] = op
        return op

    def _advance(self, op: Op) -> None:
        """One poll: PENDING -> RUNNING -> DONE (or by wall time with ``latency``)."""
        if op.state == "DONE":
            return
        if self.latency:
            el = time.monotonic() - op.created
            state = (
                "DONE"
                if el >= self.latency
                else "RUNNING"
                if el >= self.latency / 10
                else "PENDING"
            )
        else:
            op.polls += 1
            state = "RUNNING" if op.polls == 1 else "DONE"
        if state == "DONE":
            op.on_done(op.error is None)
        op.state = state

    def _op_json(self, op: Op) -> dict:
        op.history.append(op.state)
        if op.api == "compute":
            base = f"{self.url}/compute/v1/projects/{self.project}"
            scope = f"regions/{op.region}" if op.region else "global"
            d: dict[str, Any] = {
                "kind": "compute#operation",
                "id": str(abs(hash(op.id)) % 10**12),
                "name": op.id,
                "operationType": op.kind,
                "status": op.state,
                "targetLink": op.target,
                "selfLink": f"{base}/{scope}/operations/{op.id}",
                "progress": 100 if op.state == "DONE" else 0,
            }
            if op.region:
                d["region"] = f"{base}/regions/{op.region}"
            if op.state == "DONE" and op.error:
                d["error"] = {"errors": [{"code": op.error[0], "message": op.error[1]}]}
                d["httpErrorStatusCode"] = 400
            return d
        d = {
            "name": op.id,
            "operationType": op.kind,
            "status": op.state,
            "targetLink": op.target,
            "location": op.location,
            "selfLink": f"projects/{self.project}/locations/{op.location}/operations/{op.id}",
        }
        if op.state == "DONE" and op.error:
            d["error"] = {"code": op.error[0], "message": op.error[1]}
            d["statusMessage"] = op.error[1]
        return d

    # --- routing ----------------------------------------------------------------
    def _route(self, r: Req) -> tuple[int, Any]:
        p = r.path
        m = re.fullmatch(r"/compute/v1/projects/([^/]+)(/.*)?", p)
        if m:
            return self._compute(r, m.group(2) or "")
        m = re.fullmatch(r"/v1/projects/([^/]+)/locations/global/services/([^/]+)/quotaInfos", p)
        if m and r.method == "GET":
            # Cloud Quotas v1 projects.locations.services.quotaInfos.list (one page): the
            # QuotaInfo resources of docs/quotas/reference/rest/v1/...quotaInfos, camelCase
            return 200, {
                "quotaInfos": [
                    {
                        "name": f"projects/{self.number}/locations/global/services/{m.group(2)}/"
                        f"quotaInfos/{q['quotaId']}",
                        "service": m.group(2),
                        **q,
                    }
                    for q in self.quota_infos.get(m.group(2), [])
                ]
            }
        m = re.fullmatch(r"/v1/projects/([^/]+)/locations/([^/]+)(/.*)?", p)
        if m:
            return self._gke(r, m.group(2), m.group(3) or "")
        m = re.fullmatch(r"/v2/projects/([^/]+)/locations/([^/]+)/acceleratorTypes", p)
        if m and r.method == "GET":
            types = self.tpu_types.get(m.group(2), self.default_tpu_types)
            return 200, {
                "acceleratorTypes": [
                    {
                        "name": f"projects/{self.project}/locations/{m.group(2)}/acceleratorTypes/{t}",  # noqa: E501
                        "type": t,
                    }
                    for t in types
                ]
            }
        m = re.fullmatch(r"/v1/projects/([^/]+)/services:batchGet", p)
        if m and r.method == "GET":
            names = r.query.get("names", [])
            return 200, {
                "services": [
                    {
                        "name": f"projects/{self.number}/services/{n.rsplit('/', 1)[-1]}",
                        "state": "ENABLED" if n.rsplit("/", 1)[-1] in self.enabled else "DISABLED",
                    }
                    for n in names
                ]
            }
        m = re.fullmatch(r"/storage/v1/b/([^/]+)/iam", p)
        if m:
            return self._iam(r, m.group(1))
        m = re.fullmatch(r"/v3/projects/([^/:]+):(getIamPolicy|setIamPolicy)", p)
        if m and r.method == "POST":
            return self._project_iam(m.group(2), r.body or {})
        raise KeyError(p)

    def _project_iam(self, verb: str, body: dict) -> tuple[int, Any]:
        """Resource Manager v3: getIamPolicy / setIamPolicy with the etag as a
        precondition (a stale etag is 409 ABORTED, as the API answers it)."""
        pol = self.project_iam
        if verb == "getIamPolicy":
            return 200, pol
        new = dict(body.get("policy") or {})
        if new.get("etag") and new["etag"] != pol["etag"]:
            return 409, {
                "error": {
                    "code": 409,
                    "status": "ABORTED",
                    "message": "There were concurrent policy changes.",
                }
            }
        n = int.from_bytes(base64.b64decode(pol["etag"] + "=" * (-len(pol["etag"]) % 4)), "big") + 1
        pol.update(
            bindings=new.get("bindings", []), etag=base64.b64encode(n.to_bytes(4, "big")).decode()
        )
        return 200, pol

    # Compute ----------------------------------------------------------------------
    def _compute(self, r: Req, rest: str) -> tuple[int, Any]:
        base = f"{self.url}/compute/v1/projects/{self.project}"
        if rest == "" and r.method == "GET":
            return 200, {"name": self.project, "id": self.number, "kind": "compute#project"}
        m = re.fullmatch(r"/(global|regions/([^/]+))/operations/([^/]+)(/wait)?", rest)
        if m:
            op = self.ops.get(m.group(3))
            if op is None:
                raise KeyError(m.group(3))
            if m.group(4) and self.latency:
                return 200, _Later(lambda: self._wait_done(op))
            self._advance(op)
            return 200, self._op_json(op)
        m = re.fullmatch(r"/regions/([^/]+)", rest)
        if m and r.method == "GET":
            quotas = [
                {"metric": k, "limit": v[0], "usage": v[1]}
                for k, v in self.quotas.get(m.group(1), {}).items()
            ]
            return 200, {"kind": "compute#region", "name": m.group(1), "quotas": quotas}
        m = re.fullmatch(r"/zones/([^/]+)/machineTypes/([^/]+)", rest)
        if m and r.method == "GET":
            if m.group(2) not in self.machine_types.get(m.group(1), self.default_machine_types):
                raise KeyError(m.group(2))
            return 200, {"name": m.group(2), "zone": m.group(1)}
        colls = {
            "global/networks": (self.networks, None),
            "global/firewalls": (self.firewalls, None),
        }
        m = re.fullmatch(
            r"/(global/networks|global/firewalls|regions/([^/]+)/subnetworks)"
            r"(?:/([^/]+))?",
            rest,
        )
        if not m:
            raise KeyError(rest)
        coll, region, name = m.group(1), m.group(2), m.group(3)
        if region:
            store = {k[1]: v for k, v in self.subnets.items() if k[0] == region}
        else:
            store = colls[coll][0]
        kind = {"global/networks": "network", "global/firewalls": "firewall"}.get(coll, "subnet")
        if name is None and r.method == "GET":
            return 200, {"items": list(store.values()), "kind": f"compute#{kind}List"}
        if name is None and r.method == "POST":
            body = dict(r.body or {})
            name = body["name"]
            if name in store:
                raise Conflict(f"The resource '{coll}/{name}' already exists")
            body.update(
                selfLink=f"{base}/{coll}/{name}", id=str(next(self._ids)), kind=f"compute#{kind}"
            )
            if kind == "network":
                body.setdefault("mtu", 1460)
            if kind == "subnet":
                body["region"] = f"{base}/regions/{region}"
                body["network"] = f"{base}/global/networks/{body['network'].rsplit('/', 1)[-1]}"
                if body["network"].rsplit("/", 1)[-1] not in self.networks:
                    raise KeyError(body["network"])
            if kind == "firewall":
                body["network"] = f"{base}/global/networks/{body['network'].rsplit('/', 1)[-1]}"
            self._put(kind, region, name, body)

            def done(ok: bool, kind=kind, region=region, name=name) -> None:
                if not ok:
                    self._drop(kind, region, name)

            op = self._op("compute", "insert", f"{base}/{coll}/{name}", done, r.path, region)
            return 200, self._op_json(op)
        if name not in store:
            raise KeyError(f"{coll}/{name}")
        if r.method == "GET":
            return 200, store[name]
        if r.method == "PATCH":
            store[name].update(r.body or {})
            op = self._op(
                "compute", "patch", store[name]["selfLink"], lambda ok: None, r.path, region
            )
            return 200, self._op_json(op)
        if r.method == "DELETE":
            if kind == "network":
                users = [
                    s for (_, _), s in self.subnets.items() if s["network"].endswith(f"/{name}")
                ]
                users += [f for f in self.firewalls.values() if f["network"].endswith(f"/{name}")]
                if users:
                    return 400, {
                        "error": {
                            "code": 400,
                            "message": f"The network resource "
                            f"'{name}' is already being used by "
                            f"'{users[0]['name']}'",
                            "status": "INVALID_ARGUMENT",
                        }
                    }

            def gone(ok: bool, kind=kind, region=region, name=name) -> None:
                if ok:
                    self._drop(kind, region, name)

            op = self._op("compute", "delete", store[name]["selfLink"], gone, r.path, region)
            return 200, self._op_json(op)
        raise KeyError(rest)

    def _put(self, kind: str, region: str | None, name: str, body: dict) -> None:
        if kind == "network":
            self.networks[name] = body
        elif kind == "firewall":
            self.firewalls[name] = body
        else:
            self.subnets[(region or "", name)] = body

    def _drop(self, kind: str, region: str | None, name: str) -> None:
        with self.lock:
            if kind == "network":
                self.networks.pop(name, None)
            elif kind == "firewall":
                self.firewalls.pop(name, None)
            else:
                self.subnets.pop((region or "", name), None)

    def _wait_done(self, op: Op) -> dict:
        time.sleep(max(0.0, op.created + self.latency - time.monotonic()))
        with self.lock:
            self._advance(op)
            return self._op_json(op)

    # GKE ----------------------------------------------------------------------------
    def _gke(self, r: Req, loc: str, rest: str) -> tuple[int, Any]:
        if rest == "/serverConfig" and r.method == "GET":
            return 200, self.server_config
        if rest.startswith("/repositories"):
            return self._ar(r, loc, rest)
        if rest.startswith("/builds"):
            return self._cloudbuild(r, loc, rest)
        m = re.fullmatch(r"/operations/([^/]+)", rest)
        if m and r.method == "GET":
            op = self.ops.get(m.group(1))
            if op is None:
                raise KeyError(m.group(1))
            self._advance(op)
            if op.api in ("ar", "cloudbuild"):
                return 200, self._lro_json(op)
            return 200, self._op_json(op)
        if rest == "/clusters" and r.method == "GET":
            cl = [self._cluster_json(c) for (lc, _), c in self.clusters.items() if loc in ("-", lc)]
            return 200, {"clusters": cl}
        if rest == "/clusters" and r.method == "POST":
            c = dict((r.body or {})["cluster"])
            name = c["name"]
            if (loc, name) in self.clusters:
                raise Conflict(
                    f"Already exists: projects/{self.project}/locations/{loc}/clusters/{name}"
                )
            version = c.get("initialClusterVersion") or self._channel_default(c)
            c.update(
                status="PROVISIONING",
                location=loc,
                currentMasterVersion=version,
                endpoint=self.kube_endpoint or "203.0.113.10",
                selfLink=f"projects/{self.project}/locations/{loc}/clusters/{name}",
            )
            for np in c.get("nodePools", []):
                np.update(status="PROVISIONING", version=version)
            self.clusters[(loc, name)] = c

            def done(ok: bool, loc=loc, name=name) -> None:
                cl = self.clusters.get((loc, name))
                if cl is None:
                    return
                if ok:
                    cl["status"] = "RUNNING"
                    for np in cl.get("nodePools", []):
                        np["status"] = "RUNNING"
                else:
                    cl["status"] = "ERROR"
                    cl["statusMessage"] = "creation failed"

            op = self._op("gke", "CREATE_CLUSTER", c["selfLink"], done, r.path, location=loc)
            return 200, self._op_json(op)
        m = re.fullmatch(r"/clusters/([^/]+)(?:/nodePools(?:/([^/:]+)(:setSize)?)?)?", rest)
        if not m:
            raise KeyError(rest)
        cname, pname, set_size = m.group(1), m.group(2), m.group(3)
        c = self.clusters.get((loc, cname))
        if c is None:
            raise KeyError(f"projects/{self.project}/locations/{loc}/clusters/{cname}")
        pools = c.setdefault("nodePools", [])
        if r.method == "GET":
            self._tick(c["selfLink"])  # the server makes progress while clients look
        if "/nodePools" not in rest:
            if r.method == "GET":
                return 200, self._cluster_json(c)
            if r.method == "DELETE":
                c["status"] = "STOPPING"

                def gone(ok: bool, loc=loc, cname=cname) -> None:
                    if ok:
                        self.clusters.pop((loc, cname), None)

                op = self._op("gke", "DELETE_CLUSTER", c["selfLink"], gone, r.path, location=loc)
                return 200, self._op_json(op)
            raise KeyError(rest)
        if pname is None and r.method == "GET":
            return 200, {"nodePools": pools}
        if pname is None and r.method == "POST":
            if c["status"] != "RUNNING":
                return 400, {
                    "error": {
                        "code": 400,
                        "status": "FAILED_PRECONDITION",
                        "message": f"Cluster is {c['status']}",
                    }
                }
            np = dict((r.body or {})["nodePool"])
            if any(p["name"] == np["name"] for p in pools):
                raise Conflict(f"Already exists: node pool {np['name']}")
            np.update(
                status="PROVISIONING",
                version=c["currentMasterVersion"],
                selfLink=f"{c['selfLink']}/nodePools/{np['name']}",
            )
            pools.append(np)

            def done(ok: bool, np=np, pools=pools) -> None:
                if ok:
                    np["status"] = "RUNNING"
                elif np in pools:
                    pools.remove(np)

            op = self._op("gke", "CREATE_NODE_POOL", np["selfLink"], done, r.path, location=loc)
            return 200, self._op_json(op)
        np = next((p for p in pools if p["name"] == pname), None)
        if np is None:
            raise KeyError(f"nodePools/{pname}")
        if r.method == "GET":
            return 200, np
        if set_size and r.method == "POST":
            np["initialNodeCount"] = int(r.body["nodeCount"])
            op = self._op(
                "gke", "SET_NODE_POOL_SIZE", np["selfLink"], lambda ok: None, r.path, location=loc
            )
            return 200, self._op_json(op)
        if r.method == "DELETE":
            np["status"] = "STOPPING"

            def gone(ok: bool, np=np, pools=pools) -> None:
                if ok and np in pools:
                    pools.remove(np)

            op = self._op("gke", "DELETE_NODE_POOL", np["selfLink"], gone, r.path, location=loc)
            return 200, self._op_json(op)
        raise KeyError(rest)

    # Artifact Registry ------------------------------------------------------------------
    def fail_build(self, step: int, detail: str) -> None:
        """The next build fails in ``step`` with ``detail`` (as Cloud Build reports it)."""
        self._build_fault = (step, detail)

    def _lro_json(self, op: Op) -> dict:
        d: dict[str, Any] = {
            "name": f"projects/{self.project}/locations/{op.location}/operations/{op.id}",
            "done": op.state == "DONE",
        }
        if op.api == "cloudbuild":
            d["metadata"] = {
                "@type": "type.googleapis.com/google.devtools.cloudbuild.v1.BuildOperationMetadata",
                "build": self.builds[op.target],
            }
        elif op.state == "DONE":
            if op.error:
                d["error"] = {"code": op.error[0], "message": op.error[1]}
            else:
                repo = self.repositories.get((op.location or "", op.target))
                d["response"] = {
                    "@type": "type.googleapis.com/google.devtools.artifactregistry.v1.Repository",
                    **(repo or {}),
                }
        return d

    def _public_ar(self, r: Req, project: str, loc: str, rest: str) -> tuple[int, Any]:
        """Another project's public repository: a tag's get and the images' list, as
        Artifact Registry v1 answers them (packages/PKG/tags/TAG, dockerImages)."""
        base = f"projects/{project}/locations/{loc}/repositories"
        m = re.fullmatch(
            r"/repositories/([^/]+)/(dockerImages|packages/([^/]+)/tags/([^/]+))", rest
        )
        repo = m and m.group(1)
        mine = {k[3]: t for k, t in self.public_images.items() if k[:3] == (project, loc, repo)}
        if not m or r.method != "GET" or not mine:
            raise KeyError(f"{base}{rest}")
        if m.group(2) == "dockerImages":
            host = f"{loc}-docker.pkg.dev/{project}/{repo}"
            return 200, {
                "dockerImages": [
                    {
                        "name": f"{base}/{repo}/dockerImages/{pkg}@{digest}",
                        "uri": f"{host}/{pkg}@{digest}",
                        "tags": sorted(t for t, d in tags.items() if d == digest),
                    }
                    for pkg, tags in mine.items()
                    for digest in sorted(set(tags.values()))
                ]
            }
        pkg, tag = m.group(3).replace("%2F", "/"), m.group(4)
        if tag not in mine.get(pkg, {}):
            raise KeyError(f"{base}{rest}")
        return 200, {"name": f"{base}{rest}"}

    def _ar(self, r: Req, loc: str, rest: str) -> tuple[int, Any]:
        project = re.search(r"/projects/([^/]+)/", r.path)
        if project and project.group(1) != self.project:
            return self._public_ar(r, project.group(1), loc, rest)
        base = f"projects/{self.project}/locations/{loc}/repositories"
        if rest == "/repositories" and r.method == "POST":
            rid = r.query["repositoryId"][0]
            if (loc, rid) in self.repositories:
                raise Conflict(f"the repository {rid} already exists")
            repo = {**(r.body or {}), "name": f"{base}/{rid}"}
            self.repositories[(loc, rid)] = repo

            def done(ok: bool, loc=loc, rid=rid) -> None:
                if not ok:
                    self.repositories.pop((loc, rid), None)

            op = self._op("ar", "CREATE_REPOSITORY", rid, done, r.path, location=loc)
            return 200, self._lro_json(op)
        m = re.fullmatch(
            r"/repositories/([^/]+)(?:/(dockerImages|packages/([^/]+)/tags/"
            r"([^/]+)))?",
            rest,
        )
        if not m or r.method != "GET":
            raise KeyError(rest)
        repo = self.repositories.get((loc, m.group(1)))
        if repo is None:
            raise KeyError(f"{base}/{m.group(1)}")
        if m.group(2) is None:
            return 200, repo
        if m.group(2) == "dockerImages":
            host = f"{loc}-docker.pkg.dev/{self.project}/{m.group(1)}"
            images = []
            for (lc, rp, pkg), tags in self.docker_images.items():
                if (lc, rp) != (loc, m.group(1)):
                    continue
                for digest in sorted(set(tags.values())):
                    images.append(
                        {
                            "name": f"{base}/{rp}/dockerImages/{pkg}@{digest}",
                            "uri": f"{host}/{pkg}@{digest}",
                            "tags": sorted(t for t, d in tags.items() if d == digest),
                            "imageSizeBytes": "1234567",
                            "uploadTime": "2026-11-23T10:00:00Z",
                        }
                    )
            return 200, {"dockerImages": images}
        pkg, tag = m.group(3).replace("%2F", "/"), m.group(4)
        tags = self.docker_images.get((loc, m.group(1), pkg), {})
        if tag not in tags:
            raise KeyError(f"{base}/{m.group(1)}/packages/{pkg}/tags/{tag}")
        return 200, {
            "name": f"{base}/{m.group(1)}/packages/{m.group(3)}/tags/{tag}",
            "version": f"{base}/{m.group(1)}/packages/{m.group(3)}/versions/{tags[tag]}",
        }

    # Cloud Build ------------------------------------------------------------------------
    def _cloudbuild(self, r: Req, loc: str, rest: str) -> tuple[int, Any]:
        if rest == "/builds" and r.method == "POST":
            build = copy.deepcopy(r.body or {})
            bid = f"b{next(self._ids):04d}"
            build.update(
                id=bid,
                projectId=self.project,
                status="QUEUED",
                name=f"projects/{self.project}/locations/{loc}/builds/{bid}",
                logUrl=f"https://console.cloud.google.com/cloud-build/builds;"
                f"region={loc}/{bid}?project={self.number}",
            )
            for st in build.get("steps", []):
                st["status"] = "QUEUED"
            build["_fault"], self._build_fault = self._build_fault, None
            self.builds[bid] = build
            op = self._op("cloudbuild", "BUILD", bid, lambda ok: None, r.path, location=loc)
            return 200, self._lro_json(op)
        m = re.fullmatch(r"/builds/([^/]+)", rest)
        if not m or r.method != "GET" or m.group(1) not in self.builds:
            raise KeyError(rest)
        b = self.builds[m.group(1)]
        self._step_build(b, loc)
        return 200, {k: v for k, v in b.items() if not k.startswith("_")}

    def _step_build(self, b: dict, loc: str) -> None:
        """One poll of a build: QUEUED -> WORKING -> SUCCESS (or FAILURE)."""
        steps = b.get("steps", [])
        if b["status"] == "QUEUED":
            b["status"] = "WORKING"
            if steps:
                steps[0]["status"] = "WORKING"
            return
        if b["status"] != "WORKING":
            return
        src = (b.get("source") or {}).get("storageSource") or {}
        if not self._gcs_object_exists(src.get("bucket", ""), src.get("object", "")):
            b.update(
                status="FAILURE",
                failureInfo={
                    "type": "FETCH_SOURCE_FAILED",
                    "detail": f"gs://{src.get('bucket')}/{src.get('object')}: object not found",
                },
            )
            return
        fault = b.get("_fault")
        if fault is not None:
            step, detail = fault
            for i, st in enumerate(steps):
                st["status"] = "SUCCESS" if i < step else "FAILURE" if i == step else "QUEUED"
            b.update(
                status="FAILURE",
                statusDetail=detail,
                failureInfo={"type": "USER_BUILD_STEP", "detail": detail},
            )
            return
        for st in steps:
            st["status"] = "SUCCESS"
        b["status"] = "SUCCESS"
        digest = "sha256:" + f"{abs(hash(b['id'])):064x}"[-64:]
        results = []
        for uri in b.get("images", []):
            m = re.fullmatch(r"([a-z0-9-]+)-docker\.pkg\.dev/[^/]+/([^/]+)/([^:]+):(.+)", uri)
            if m:
                self.docker_images.setdefault((m.group(1), m.group(2), m.group(3)), {})[
                    m.group(4)
                ] = digest
            results.append({"name": uri, "digest": digest})
        b["results"] = {"images": results}

    def _gcs_object_exists(self, bucket: str, name: str) -> bool:
        if not self.gcs_url or not bucket or not name:
            return False
        from urllib.parse import quote

        try:
            with urllib.request.urlopen(
                f"{self.gcs_url}/storage/v1/b/{bucket}/o/{quote(name, safe='')}"
            ):
                return True
        except urllib.error.HTTPError:
            return False

    def _tick(self, target_prefix: str) -> None:
        for op in list(self.ops.values()):
            if op.state != "DONE" and op.target.startswith(target_prefix):
                self._advance(op)

    def _channel_default(self, c: dict) -> str:
        ch = (c.get("releaseChannel") or {}).get("channel")
        names = {1: "RAPID", 2: "REGULAR", 3: "STABLE"}
        ch = names.get(ch, ch)
        for x in self.server_config["channels"]:
            if x["channel"] == ch:
                return x["defaultVersion"]
        return self.server_config["defaultClusterVersion"]

    def _cluster_json(self, c: dict) -> dict:
        return json.loads(json.dumps(c))

    # Storage IAM + bucket metadata overlay ---------------------------------------------
    def _iam(self, r: Req, bucket: str) -> tuple[int, Any]:
        if bucket not in self._gcs_buckets():
            raise KeyError(f"b/{bucket}")
        pol = self.bucket_iam.setdefault(
            bucket,
            {
                "kind": "storage#policy",
                "resourceId": f"projects/_/buckets/{bucket}",
                "version": 1,
                "etag": "CAE=",
                "bindings": [],
            },
        )
        if r.method == "GET":
            return 200, pol
        if r.method == "PUT":
            body = dict(r.body or {})
            if body.get("etag") and body["etag"] != pol["etag"]:
                return 412, {"error": {"code": 412, "message": "Precondition Failed"}}
            n = int(pol["etag"].strip("=").encode().hex(), 16) + 1
            pol.update(
                bindings=body.get("bindings", []), version=body.get("version", 1), etag=f"E{n}="
            )
            return 200, pol
        raise KeyError(r.path)

    def _proxy(self, h: BaseHTTPRequestHandler, parts: Any, raw: bytes) -> None:
        if not self.gcs_url:  # a 4xx answer: no dropped connection or 5xx to retry
            return self._error(
                h,
                400,
                "this fake serves no Cloud Storage: start it with a "
                "fake-gcs-server behind it (FakeGCP(gcs_url=...), serve --gcs)",
            )
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        bucket_create = h.command == "POST" and parts.path == "/storage/v1/b"
        sent = json.loads(raw) if bucket_create and raw else None
        headers = {
            k: v
            for k, v in h.headers.items()
            if k.lower() not in ("host", "content-length", "connection", "accept-encoding")
        }
        req = urllib.request.Request(
            self.gcs_url + path, data=raw or None, method=h.command, headers=headers
        )
        try:
            with urllib.request.urlopen(req) as f:
                status, data, ctype = f.status, f.read(), f.headers.get("content-type", "")
        except urllib.error.HTTPError as e:
            status, data, ctype = e.code, e.read(), e.headers.get("content-type", "")
        m = re.fullmatch(r"/storage/v1/b(?:/([^/]+))?", parts.path)
        if m and status < 300:
            with self.lock:
                if bucket_create and sent:
                    meta = {k: sent[k] for k in ("labels", "iamConfiguration") if k in sent}
                    if sent.get("location"):
                        meta["location"] = sent["location"].upper()
                    self.bucket_meta[sent["name"]] = meta
                if h.command == "DELETE" and m.group(1):
                    self.bucket_meta.pop(m.group(1), None)
                    self.bucket_iam.pop(m.group(1), None)
                elif data and "json" in ctype:
                    doc = json.loads(data)
                    items = doc.get("items") if m.group(1) is None and not bucket_create else [doc]
                    for b in items or []:
                        b.update(self.bucket_meta.get(b.get("name"), {}))
                    data = json.dumps(doc).encode()
        h.send_response(status)
        h.send_header("content-type", ctype or "application/json")
        h.send_header("content-length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)


class Conflict(Exception):
    pass


class _Later:
    """A response computed outside the lock (Compute's blocking operations.wait)."""

    def __init__(self, fn: Any) -> None:
        self.wait_for = fn


def quota_info(
    quota_id: str,
    display_name: str,
    values: dict[tuple[tuple[str, str], ...], int],
    dimensions: tuple[str, ...] = ("region",),
) -> dict[str, Any]:
    """A Cloud Quotas QuotaInfo as its REST API returns it (camelCase; int64 values as
    strings): one dimensions entry per key of ``values``, e.g.
    ``{(("region", "us-central1"), ("tpu_family", "CT6E")): 64}``."""
    return {
        "quotaId": quota_id,
        "quotaDisplayName": display_name,
        "metric": f"compute.googleapis.com/{quota_id.lower()}",
        "dimensions": list(dimensions),
        "metricUnit": "1",
        "isPrecise": True,
        "containerType": "PROJECT",
        "dimensionsInfos": [
            {
                "dimensions": dict(k),
                "details": {"value": str(v)},
                "applicableLocations": [dict(k).get("region", "global")],
            }
            for k, v in values.items()
        ],
    }
