"""Node pools both ways: ``desired_pools`` (what ``cluster create`` asks GKE for) and
``slices_from_pools`` (what ``train --cluster`` reads back), with the real
``container_v1.NodePool`` type, for TPU slices, multi-slice and GPUs."""

from __future__ import annotations

from collections import Counter

import pytest

from rlctl.core.config.catalog import cores_per_chip
from rlctl.core.config.infra import InfraSpec
from rlctl.core.gcp.cluster import desired_pools, slices_from_pools
from rlctl.core.k8s.shapes import SliceShape, slice_shape
from tests.fakes.shapes import h100_8, v6e_16

container_v1 = pytest.importorskip("google.cloud.container_v1")


def spec(accelerators: list[str], dcn: int = 0) -> InfraSpec:
    return InfraSpec(
        project="p",
        region="us-central1",
        cluster="rl",
        accelerators=accelerators,
        dcn={"count": dcn},
    )


def node_pools(s: InfraSpec) -> list:
    """The pools as the GKE API returns them, plus the CPU pool every cluster has."""
    cpu = container_v1.NodePool(
        name="cpu", initial_node_count=1, config={"machine_type": "e2-standard-8"}
    )
    return [cpu, *(container_v1.NodePool(body) for *_, body in desired_pools(s))]


def pool(name: str, machine: str, nodes: int, topology: str | None = None) -> object:
    """A pool made by hand (or by another tool): any name, TPU topology when multi-host."""
    return container_v1.NodePool(
        name=name,
        initial_node_count=nodes,
        config={"machine_type": machine},
        placement_policy={"type_": "COMPACT", "tpu_topology": topology} if topology else {},
    )


def layout(pools) -> Counter:
    """(machine type, TPU topology, nodes) of each accelerator pool."""
    return Counter(
        (p.config.machine_type, p.placement_policy.tpu_topology or None, p.initial_node_count)
        for p in pools
        if p.name != "cpu"
    )


ACCELERATORS = [
    ["v6e-16"],  # one multi-host slice
    ["v6e-16 x2"],  # multi-slice: one pool per slice
    ["v5p-128 x3"],
    ["v5litepod-16 x2"],
    ["tpu7x-128"],
    ["v6e-4"],  # a single-host slice: no placement policy
    ["v6e-4", "v5litepod-8"],  # two single-host types, one slice each
    ["v5p-8"],
    ["a3-highgpu-8g x2"],  # GPU: one pool of two machines
    ["g2-standard-8 x3"],
    ["v6e-16 x2", "a3-highgpu-8g x3"],  # TPU and GPU in one cluster
]


@pytest.mark.parametrize("accelerators", ACCELERATORS, ids=" + ".join)
class TestSpecToPoolsAndBack:
    def test_the_slices_come_back(self, accelerators):
        s = spec(accelerators, dcn=2)
        slices, networks = slices_from_pools(node_pools(s))
        assert [(x.accelerator.name, x.count) for x in slices] == [
            (a.type, a.count) for a in s.accelerators
        ]
        assert networks == ["rl-dcn-0", "rl-dcn-1"]

    def test_the_shape_matches_its_pools(self, accelerators):
        pools = node_pools(spec(accelerators))
        slices, _ = slices_from_pools(pools)
        for x in slices:
            shape = slice_shape(x.accelerator, x.count)
            mine = [p for p in pools if p.config.machine_type == shape.machine_type]
            assert shape.total_hosts == sum(p.initial_node_count for p in mine)
            if shape.kind == "tpu":
                assert shape.num_slices == len(mine) == x.count
                # the name counts chips (v5e, v6e) or TensorCores (v4, v5p, tpu7x)
                cores = (
                    shape.hosts_per_slice
                    * shape.chips_per_host
                    * cores_per_chip(x.accelerator.family or "")
                )
                assert cores == int(x.accelerator.name.rsplit("-", 1)[1])
                if x.accelerator.multi_host:
                    assert {p.placement_policy.tpu_topology for p in mine} == {shape.topology}
            else:
                assert shape.chips_per_host == x.accelerator.gpus

    def test_and_back_to_the_same_pools(self, accelerators):
        first = node_pools(spec(accelerators))
        slices, _ = slices_from_pools(first)
        again = node_pools(spec([f"{x.accelerator.name} x{x.count}" for x in slices]))
        assert layout(again) == layout(first)


class TestPoolsToSpecAndBack:
    @pytest.mark.parametrize(
        "pools",
        [
            [
                pool("tpu-a", "ct6e-standard-4t", 4, "4x4"),
                pool("tpu-b", "ct6e-standard-4t", 4, "4x4"),
            ],
            [pool("big", "ct5p-hightpu-4t", 16, "4x4x4")],
            [pool("small", "ct6e-standard-4t", 1)],
            [pool("ironwood", "tpu7x-standard-4t", 4, "2x2x4"), pool("h100", "a3-highgpu-8g", 2)],
            [
                pool("v6e-16-0", "ct6e-standard-4t", 4, "4x4"),
                pool("v6e-16-1", "ct6e-standard-4t", 4, "4x4"),
            ],
        ],
        ids=["v6e-16 x2", "v5p-128", "v6e-4", "tpu7x-32 + a3", "rlctl names"],
    )
    def test_pools_give_back_the_same_pools(self, pools):
        slices, _ = slices_from_pools(pools)
        again = node_pools(spec([f"{x.accelerator.name} x{x.count}" for x in slices]))
        assert layout(again) == layout(pools)

    def test_known_shapes(self):
        pools = node_pools(spec(["v6e-16 x2", "a3-highgpu-8g x2"]))
        slices, _ = slices_from_pools(pools)
        shapes = {x.accelerator.name: slice_shape(x.accelerator, x.count) for x in slices}
        assert shapes == {"v6e-16": v6e_16(2), "a3-highgpu-8g": h100_8(hosts=2)}
        assert isinstance(shapes["v6e-16"], SliceShape)

    def test_gpu_pools_of_one_type_are_one_group(self):
        slices, _ = slices_from_pools(
            [pool("gpu-a", "a3-highgpu-8g", 2), pool("gpu-b", "a3-highgpu-8g", 3)]
        )
        assert [(x.accelerator.name, x.count) for x in slices] == [("a3-highgpu-8g", 5)]

    def test_cpu_and_unknown_pools_are_not_accelerators(self):
        slices, networks = slices_from_pools(
            [pool("cpu", "e2-standard-8", 3), pool("odd", "ct6e-standard-4t", 4, "9x9")]
        )
        assert slices == [] and networks == []
