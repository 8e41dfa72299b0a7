"""Put into a ``FakeGCP`` what ``rlctl cluster create`` would have made, already RUNNING.

The request bodies come from the production code (``cluster_body``,
``desired_pools``, ``network.desired``) and are turned into REST JSON by the
client library's own types, so the seeded node pools have exactly the machine
types, TPU topologies, node counts and DCN network configs the catalog gives an
accelerator, and a change there cannot leave the fake behind.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Sequence
from typing import Any

from tests.fakes.gcp_server import FakeGCP

DEFAULT_ENDPOINT = "203.0.113.10"  # TEST-NET-3: a GKE endpoint nothing answers on
DEFAULT_VERSION = "1.34.1-gke.1829001"


def _rest(message: Any) -> dict[str, Any]:
    """A proto-plus message as the REST API would return it: camelCase, enum names,
    without the empty defaults proto JSON adds."""
    raw = json.loads(type(message).to_json(message, use_integers_for_enums=False))
    return _prune(raw)


def _prune(node: Any) -> Any:
    if isinstance(node, dict):
        kept = {k: _prune(v) for k, v in node.items()}
        return {
            k: v
            for k, v in kept.items()
            if v not in ("", [], {}, None)
            and not (isinstance(v, str) and v.endswith("_UNSPECIFIED"))
        }
    if isinstance(node, list):
        return [_prune(v) for v in node]
    return node


def infra_spec(
    cluster: str,
    accelerators: Sequence[str],
    dcn_networks: int = 0,
    project: str = "p",
    region: str = "us-central1",
) -> Any:
    from rlctl.core.config.infra import InfraSpec

    return InfraSpec(
        project=project,
        region=region,
        cluster=cluster,
        accelerators=list(accelerators),
        dcn={"count": dcn_networks},
    )


def seed_cluster(
    fake: FakeGCP,
    cluster: str,
    accelerators: Sequence[str] = ("v6e-16 x2",),
    dcn_networks: int = 0,
    region: str = "us-central1",
    endpoint: str = DEFAULT_ENDPOINT,
    version: str = DEFAULT_VERSION,
) -> dict[str, Any]:
    """A RUNNING regional cluster with a CPU pool, one pool per TPU slice (or GPU
    group) of ``accelerators`` (e.g. ``["v6e-16 x2"]``), and ``dcn_networks`` DCN
    networks (networks, subnets, firewall rules, and the pools' additional node
    network configs). Returns the cluster's REST JSON as stored in the fake."""
    from google.cloud import compute_v1, container_v1

    from rlctl.core.gcp import network
    from rlctl.core.gcp.cluster import cluster_body, desired_pools
    from rlctl.core.gcp.pools import backend_pool_body, wanted_backend_pools
    from rlctl.core.k8s import backends

    spec = infra_spec(cluster, accelerators, dcn_networks, fake.project, region)
    needs = backends.cluster_needs()
    body = cluster_body(spec, needs)
    body["node_pools"] = [
        *body.get("node_pools", []),
        *(b for *_, b in desired_pools(spec)),
        *(backend_pool_body(spec, p) for p in wanted_backend_pools(spec, needs.pools)),
    ]
    doc = _rest(container_v1.Cluster(body))
    link = f"projects/{fake.project}/locations/{region}/clusters/{cluster}"
    doc.update(
        status="RUNNING",
        location=region,
        endpoint=endpoint,
        selfLink=link,
        currentMasterVersion=version,
        currentNodeVersion=version,
    )
    for pool in doc.get("nodePools", []):
        pool.update(status="RUNNING", version=version, selfLink=f"{link}/nodePools/{pool['name']}")

    base = f"{fake.url}/compute/v1/projects/{fake.project}"
    types = {
        "network": compute_v1.Network,
        "subnet": compute_v1.Subnetwork,
        "firewall": compute_v1.Firewall,
    }
    with fake.lock:
        for change in network.desired(spec):
            res = _rest(types[change.kind](change.body))
            coll = {
                "network": "global/networks",
                "firewall": "global/firewalls",
                "subnet": f"regions/{region}/subnetworks",
            }[change.kind]
            res.update(selfLink=f"{base}/{coll}/{change.name}", kind=f"compute#{change.kind}")
            if "network" in res:  # subnets and firewalls point at their network by URL
                res["network"] = f"{base}/global/networks/{res['network'].rsplit('/', 1)[-1]}"
            if change.kind == "subnet":
                res["region"] = f"{base}/regions/{region}"
            fake._put(change.kind, region, change.name, res)
        fake.clusters[(region, cluster)] = doc
    return doc


def seed_bucket(fake: FakeGCP, bucket: str, cluster: str, region: str = "us-central1") -> None:
    """The run bucket ``cluster create --bucket`` makes, found by its rlctl labels
    (needs the fake to front a fake-gcs-server)."""
    from rlctl.core.config.infra import CLUSTER_LABEL, MANAGED_BY, RLCTL

    body = {
        "name": bucket,
        "location": region.upper(),
        "labels": {MANAGED_BY: RLCTL, CLUSTER_LABEL: cluster},
        "iamConfiguration": {"uniformBucketLevelAccess": {"enabled": True}},
    }
    req = urllib.request.Request(
        f"{fake.url}/storage/v1/b?project={fake.project}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req) as r:
        r.read()
