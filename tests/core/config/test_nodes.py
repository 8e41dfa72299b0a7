"""The node model: what a node of each pool ``cluster create`` makes offers a pod.

Facts and their sources are in ``rlctl/core/config/nodes.py``; the pools here are built
from the request bodies ``cluster create`` sends (``tests/fakes/seed.py``), read back
as GKE returns them.
"""

from __future__ import annotations

import pytest

from rlctl.core.config import catalog, nodes
from rlctl.core.k8s.backends.pathways import HEAD_POOL, HEAD_SIDECARS, head_resources
from tests.fakes.gcp_server import FakeGCP
from tests.fakes.k8s import nodes_of_cluster
from tests.fakes.seed import seed_cluster


@pytest.fixture()
def gcp():
    fake = FakeGCP().start()
    yield fake
    fake.stop()


def _pools(gcp, *accelerators: str) -> dict[str, nodes.NodePool]:
    seed_cluster(gcp, "c", accelerators)
    return {p.name: p for p in nodes_of_cluster(gcp, "c")}


class TestThreadsPerCore:
    @pytest.mark.parametrize(
        ("machine", "listed"),
        [
            ("ct6e-standard-4t", 180),
            ("ct5p-hightpu-4t", 208),
            ("ct5lp-hightpu-4t", 112),
            ("ct4p-hightpu-4t", 240),
            ("tpu7x-standard-4t", 224),
        ],
    )
    def test_one_thread_per_core_halves_the_vcpus(self, machine, listed):
        """Compute Engine: one thread per core halves the vCPUs (issue 24 point 1: every
        catalogued TPU host pod asked for CPU computed from the listed count)."""
        m = catalog.machine(machine)
        assert m.vcpus == listed
        assert nodes.node_vcpus(m, 1) == listed // 2
        assert nodes.node_vcpus(m, None) == listed
        cpu, _ = nodes.host_pod_resources(machine, 1)
        assert int(cpu) < listed // 2

    def test_tpu_pools_cluster_create_makes_have_90_vcpus_a_v6e_host(self, gcp):
        pools = _pools(gcp, "v6e-16 x2")
        p = pools["v6e-16-0"]
        assert (p.vcpus, p.nodes) == (90, 4)
        assert 80 < p.cpu < 90


class TestLabelsAndTaints:
    def test_tpu_nodes(self, gcp):
        p = _pools(gcp, "v6e-16 x2")["v6e-16-1"]
        assert p.labels["cloud.google.com/gke-tpu-accelerator"] == "tpu-v6e-slice"
        assert p.labels["cloud.google.com/gke-tpu-topology"] == "4x4"
        assert p.labels["cloud.google.com/gke-nodepool"] == "v6e-16-1"
        assert p.extended == {"google.com/tpu": 4}
        assert [(t.key, t.value, t.effect) for t in p.taints] == [
            ("google.com/tpu", "present", "NoSchedule")
        ]

    def test_gpu_nodes(self, gcp):
        p = _pools(gcp, "a3-highgpu-8g x2")["a3-highgpu-8g-0"]
        assert p.nodes == 2 and p.vcpus == 208  # GPU pools keep two threads per core
        assert p.labels["cloud.google.com/gke-accelerator"] == "nvidia-h100-80gb"
        assert p.extended == {"nvidia.com/gpu": 8}
        assert [t.key for t in p.taints] == ["nvidia.com/gpu"]

    def test_the_pathways_pool_is_tainted_autoscaled_and_counted_at_its_maximum(self, gcp):
        pools = _pools(gcp, "v6e-16")
        p = pools[HEAD_POOL.name]
        assert p.machine_type == "n2-standard-64" and p.autoscaled and p.nodes == 1
        assert p.taints == [nodes.Taint(key="rlctl.dev/pool", value="pathways")]
        assert "pathways" not in _pools(gcp, "a3-highgpu-8g")  # GPUs: no Pathways

    def test_cpu_pool(self, gcp):
        p = _pools(gcp, "v6e-16")["cpu"]
        assert (p.machine_type, p.nodes, p.taints, p.extended) == ("e2-standard-8", 1, [], {})
        cpu, gib = catalog.allocatable(catalog.machine("e2-standard-8"))
        assert p.cpu == pytest.approx(cpu * (1 - nodes.DAEMONSET_SHARE))
        assert p.memory_gib == pytest.approx(gib * (1 - nodes.DAEMONSET_SHARE))


def test_the_pathways_head_takes_what_its_node_leaves_beside_the_sidecars():
    from rlctl.core.units import quantity

    cpu, mem = head_resources()
    node = nodes.node_pool("p", HEAD_POOL.machine_type, 1)
    sidecars = [*HEAD_SIDECARS.values(), nodes.GCSFUSE_SIDECAR]
    assert [s["cpu"] for s in sidecars] == ["8", "16", "250m"]  # pathways-job v0.1.4, GKE
    head = int(cpu) + sum(quantity(s["cpu"]) for s in sidecars)
    assert node.cpu - 1 <= head <= node.cpu
    used = int(mem[:-2]) * 2**30 + sum(quantity(s["memory"]) for s in sidecars)
    assert node.memory_gib * 2**30 - 2**30 <= used <= node.memory_gib * 2**30
