"""The accelerator catalog and price table: every listed type, and unknown names."""

from __future__ import annotations

import math

import pytest

from rlctl.core.config import catalog, prices
from rlctl.core.errors import ConfigError

# name: (machine type, chips per host, hosts, topology) -- written independently of the data.
TPU = {
    "v4-8": ("ct4p-hightpu-4t", 4, 1, "2x2x1"),
    "v4-16": ("ct4p-hightpu-4t", 4, 2, "2x2x2"),
    "v4-32": ("ct4p-hightpu-4t", 4, 4, "2x2x4"),
    "v4-64": ("ct4p-hightpu-4t", 4, 8, "2x4x4"),
    "v4-128": ("ct4p-hightpu-4t", 4, 16, "4x4x4"),
    "v4-256": ("ct4p-hightpu-4t", 4, 32, "4x4x8"),
    "v4-512": ("ct4p-hightpu-4t", 4, 64, "4x8x8"),
    "v5p-8": ("ct5p-hightpu-4t", 4, 1, "2x2x1"),
    "v5p-16": ("ct5p-hightpu-4t", 4, 2, "2x2x2"),
    "v5p-32": ("ct5p-hightpu-4t", 4, 4, "2x2x4"),
    "v5p-64": ("ct5p-hightpu-4t", 4, 8, "2x4x4"),
    "v5p-128": ("ct5p-hightpu-4t", 4, 16, "4x4x4"),
    "v5p-256": ("ct5p-hightpu-4t", 4, 32, "4x4x8"),
    "v5p-512": ("ct5p-hightpu-4t", 4, 64, "4x8x8"),
    "v5p-1024": ("ct5p-hightpu-4t", 4, 128, "8x8x8"),
    "v5litepod-1": ("ct5lp-hightpu-1t", 1, 1, "1x1"),
    "v5litepod-4": ("ct5lp-hightpu-4t", 4, 1, "2x2"),
    "v5litepod-8": ("ct5lp-hightpu-8t", 8, 1, "2x4"),
    "v5litepod-16": ("ct5lp-hightpu-4t", 4, 4, "4x4"),
    "v5litepod-32": ("ct5lp-hightpu-4t", 4, 8, "4x8"),
    "v5litepod-64": ("ct5lp-hightpu-4t", 4, 16, "8x8"),
    "v5litepod-128": ("ct5lp-hightpu-4t", 4, 32, "8x16"),
    "v5litepod-256": ("ct5lp-hightpu-4t", 4, 64, "16x16"),
    "v6e-1": ("ct6e-standard-1t", 1, 1, "1x1"),
    "v6e-4": ("ct6e-standard-4t", 4, 1, "2x2"),
    "v6e-8": ("ct6e-standard-8t", 8, 1, "2x4"),
    "v6e-16": ("ct6e-standard-4t", 4, 4, "4x4"),
    "v6e-32": ("ct6e-standard-4t", 4, 8, "4x8"),
    "v6e-64": ("ct6e-standard-4t", 4, 16, "8x8"),
    "v6e-128": ("ct6e-standard-4t", 4, 32, "8x16"),
    "v6e-256": ("ct6e-standard-4t", 4, 64, "16x16"),
    "tpu7x-8": ("tpu7x-standard-4t", 4, 1, "2x2x1"),
    "tpu7x-16": ("tpu7x-standard-4t", 4, 2, "2x2x2"),
    "tpu7x-32": ("tpu7x-standard-4t", 4, 4, "2x2x4"),
    "tpu7x-64": ("tpu7x-standard-4t", 4, 8, "2x4x4"),
    "tpu7x-128": ("tpu7x-standard-4t", 4, 16, "4x4x4"),
    "tpu7x-256": ("tpu7x-standard-4t", 4, 32, "4x4x8"),
    "tpu7x-512": ("tpu7x-standard-4t", 4, 64, "4x8x8"),
}
GPU = {
    "a2-highgpu-1g": ("nvidia-tesla-a100", 1),
    "a2-highgpu-8g": ("nvidia-tesla-a100", 8),
    "a2-ultragpu-8g": ("nvidia-a100-80gb", 8),
    "a3-highgpu-8g": ("nvidia-h100-80gb", 8),
    "a3-megagpu-8g": ("nvidia-h100-mega-80gb", 8),
    "a3-ultragpu-8g": ("nvidia-h200-141gb", 8),
    "a4-highgpu-8g": ("nvidia-b200", 8),
    "g2-standard-8": ("nvidia-l4", 1),
}


class TestCatalog:
    def test_lists_exactly_these_types(self):
        assert {a.name for a in catalog.all_types()} == set(TPU) | set(GPU)

    @pytest.mark.parametrize("name", sorted(TPU))
    def test_tpu(self, name):
        machine, cph, hosts, topo = TPU[name]
        a = catalog.lookup(name)
        assert (a.kind, a.machine_type, a.chips_per_host, a.hosts, a.topology) == (
            "tpu",
            machine,
            cph,
            hosts,
            topo,
        )
        assert a.chips == math.prod(int(x) for x in topo.split("x")) == cph * hosts
        # the number in the name counts chips (v5e/v6e) or TensorCores (v4, v5p, tpu7x)
        assert int(name.rsplit("-", 1)[1]) == a.chips * catalog.cores_per_chip(a.family)
        assert a.gke_accelerator

    @pytest.mark.parametrize("name", sorted(GPU))
    def test_gpu(self, name):
        a = catalog.lookup(name)
        assert (a.kind, a.machine_type, a.gpu_type, a.gpus) == ("gpu", name, *GPU[name])

    @pytest.mark.parametrize(
        "bad,suggest",
        [
            ("v6e-15", "v6e-16"),
            ("v5p128", "v5p-128"),
            ("a3-highgpu-8", "a3-highgpu-8g"),
            ("v6e-3", "v6e-"),
        ],
    )
    def test_unknown_type_suggests_closest(self, bad, suggest):
        with pytest.raises(ConfigError) as e:
            catalog.lookup(bad)
        assert "unknown accelerator type" in e.value.message
        assert suggest in e.value.hint

    @pytest.mark.parametrize(
        "text,expected",
        [("v6e-16 x2", ("v6e-16", 2)), ("v6e-16", ("v6e-16", 1)), ("V5P-128 X 3", ("v5p-128", 3))],
    )
    def test_parse_slices(self, text, expected):
        assert catalog.parse_slices(text) == expected


class TestPrices:
    def test_pool_cost_on_demand_and_spot(self):
        a = catalog.lookup("v6e-16")
        od = prices.pool_hour(a, 4, "on-demand")
        spot = prices.pool_hour(a, 4, "spot")
        assert od == round(prices.table()["tpu_chip_hour"]["v6e"]["on-demand"] * 16, 2)
        assert spot is not None and spot < od

    def test_unknown_price_is_none_and_caveat_is_dated(self):
        assert prices.pool_hour(catalog.lookup("tpu7x-128"), 16) is None
        assert "estimate" in prices.caveat() and prices.table()["as_of"] in prices.caveat()


class TestMachineMemory:
    """Compute Engine's "GB" of machine memory are GiB: its machineTypes API gives
    memoryMb in MiB, 131072 for n2-standard-32's "128 GB". Read as decimal GB, every
    node was about 7% smaller to the fit check than it is (issue #43 point 9)."""

    @pytest.mark.parametrize(
        ("name", "mib"),
        [
            ("n2-standard-32", 131072),
            ("n2-standard-64", 262144),
            ("e2-standard-8", 32768),
            ("ct6e-standard-4t", 737280),
            ("a3-highgpu-8g", 1916928),
        ],
    )
    def test_the_catalog_holds_what_the_api_reports(self, name, mib):
        from rlctl.core.config.catalog import machine

        assert machine(name).memory_gib * 1024 == mib

    def test_allocatable_memory_is_reserved_from_gib(self):
        from rlctl.core.config.catalog import allocatable, machine

        # GKE keeps back 25% of the first 4 GiB, 20% of the next 4, 10% of the next 8,
        # 6% of the next 112, 2% of the rest and 100 MiB: 4 + ... of 128 GiB
        _, mem = allocatable(machine("n2-standard-32"))
        kept = 4 * 0.25 + 4 * 0.20 + 8 * 0.10 + 112 * 0.06 + 100 / 1024
        assert mem == pytest.approx(128 - kept)


class TestMultisliceOfOneHostSlices:
    """GKE's Multislice joins multi-host slices only (cloud.google.com/tpu/docs/
    tpu-gke-multislice): two single-host slices never become one job."""

    @pytest.mark.parametrize("text", ["v6e-8 x2", "v5litepod-4 x3", "v4-8 x2", "v6e-1 x2"])
    def test_several_single_host_slices_are_refused_with_the_way_out(self, text):
        from pydantic import ValidationError

        from rlctl.core.config.infra import SliceSpec

        with pytest.raises(ValidationError) as e:
            SliceSpec.model_validate(text)
        msg = str(e.value)
        assert "single host" in msg and "multi-host slices only" in msg
        assert f"use one {text.split()[0]}" in msg

    @pytest.mark.parametrize("text", ["v6e-8", "v6e-16 x2", "v5p-128 x3", "a3-highgpu-8g x4"])
    def test_one_slice_multi_host_slices_and_gpus_are_kept(self, text):
        from rlctl.core.config.infra import SliceSpec

        SliceSpec.model_validate(text)

    def test_the_refusal_names_a_multi_host_slice_that_holds_them(self):
        from rlctl.core.config.catalog import lookup, multislice_refusal

        assert "or one v6e-16 slice" in multislice_refusal(lookup("v6e-8"), 2)
        assert multislice_refusal(lookup("v6e-16"), 2) is None
