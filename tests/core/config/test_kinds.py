"""Each accelerator kind's strategy answers what the ``kind == "tpu"`` branches did."""

from __future__ import annotations

import pytest

from rlctl.core.config import kinds
from rlctl.core.config.catalog import all_types, lookup
from rlctl.core.k8s.shapes import slice_shape


def test_every_catalog_kind_has_a_strategy():
    assert {a.kind for a in all_types()} <= set(kinds.KINDS)
    assert all(a.strategy is kinds.of(a.kind) for a in all_types())


def test_a_tpu_slice():
    acc = lookup("v6e-16")
    tpu = acc.strategy
    assert (acc.chips, acc.multi_host) == (16, True)
    assert tpu.node_labels(acc) == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
        "cloud.google.com/gke-tpu-topology": "4x4",
    }
    assert (tpu.resource, tpu.per_node(acc), tpu.pool_sizes(acc, 2)) == (
        "google.com/tpu",
        4,
        [4, 4],
    )
    assert tpu.pool_extras(acc) == {"placement_policy": {"type_": "COMPACT", "tpu_topology": "4x4"}}
    assert tpu.price_key(acc) == ("tpu_chip_hour", "v6e", 4)
    shape = slice_shape(acc, 2)
    assert (shape.count, shape.num_slices, shape.threads_per_core) == (2, 2, 1)
    assert shape.with_count(1).num_slices == 1
    assert shape.node_selector == tpu.node_labels(acc)


@pytest.mark.parametrize(
    ("accelerator", "threads"),
    [("v6e-16", 1), ("v6e-8", 1), ("v5p-16", None), ("v5litepod-16", None)],
)
def test_one_thread_per_core_on_v6e_only(accelerator, threads):
    """Seed 001 sets --threads-per-core=1 on its v6e pools only; whether GKE takes it for
    the other generations is unverified (issue 55 point 3), so their pools keep the
    machine's default and their pods are sized by all its vCPUs."""
    acc = lookup(accelerator)
    tpu = acc.strategy
    assert tpu.threads(acc) == threads
    assert slice_shape(acc, 1).threads_per_core == threads
    assert tpu.plan_fields(acc)["threads_per_core"] == threads
    expected = {"advanced_machine_features": {"threads_per_core": 1}} if threads else {}
    assert tpu.pool_config(acc) == expected


def test_a_gpu_machine():
    acc = lookup("a3-highgpu-8g")
    gpu = acc.strategy
    assert (acc.chips, acc.multi_host, gpu.unit, gpu.count_word) == (8, False, "GPUs", "machine")
    assert gpu.node_labels(acc) == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    assert gpu.pool_sizes(acc, 3) == [3] and gpu.count_from_pools(2, 0) == 1
    assert gpu.pool_extras(acc) == {} and gpu.resizable and not gpu.libtpu
    shape = slice_shape(acc, 2)
    assert (shape.count, shape.hosts_per_slice, shape.threads_per_core) == (2, 2, None)
    assert shape.with_count(1).hosts_per_slice == 1
    assert shape.node_selector == gpu.node_labels(acc)


@pytest.mark.parametrize("kind", sorted(kinds.KINDS))
def test_a_strategy_implements_everything(kind):
    import inspect

    assert not inspect.isabstract(type(kinds.of(kind)))
