"""Every accelerator of the catalog as compile-only devices (pure: the catalog and the
GPU descriptions shipped as package data); libtpu and JAX's CUDA plugin turning them
into devices is tests/accelerator/test_mesh.py's, in the compile extras' venv."""

from __future__ import annotations

import re

import pytest

from rlctl.core.config.catalog import all_types, lookup
from rlctl.core.config.compile_targets import compile_target, gpu_target_text, gpu_targets

GIB = 2**30


@pytest.mark.parametrize("acc", [a for a in all_types() if a.kind == "tpu"], ids=lambda a: a.name)
def test_every_tpu_slice_is_a_topology_libtpu_names(acc):
    for count in (1, 2):
        t = compile_target(acc, count)
        assert t is not None and t.kind == "tpu" and t.num_slices == count
        gen, topo = t.topology_name.split(":")
        assert topo == acc.topology and gen == acc.compile.libtpu_name
        per_chip = acc.compile.devices_per_chip
        assert t.devices == acc.chips_per_host * acc.hosts * per_chip * count
        x, y, z = t.chips_per_host_bounds
        assert x * y * z == acc.chips_per_host
        assert t.device_memory * per_chip == acc.compile.hbm_gib * GIB
        assert t.label == (acc.name if count == 1 else f"{acc.name} x{count}")


def test_hbm_per_chip_is_cloud_tpus():
    hbm = {a.family: a.compile.hbm_gib for a in all_types() if a.kind == "tpu"}
    assert hbm == {"v4": 32, "v5p": 95, "v5e": 16, "v6e": 32, "tpu7x": 192}
    assert lookup("v4-8").compile.chip_config == "megacore"  # JAX shows a v4-8 as 4 devices


def test_every_gpu_machine_has_its_description_but_the_l4():
    for acc in (a for a in all_types() if a.kind == "gpu"):
        t = compile_target(acc, 2)
        if acc.gpu_type == "nvidia-l4":
            assert t is None
            continue
        assert t is not None and t.hosts == 2 and t.per_host == acc.gpus
        assert t.devices == 2 * acc.gpus and t.gpu_target in gpu_targets()
    h200 = compile_target(lookup("a3-ultragpu-8g"))
    assert h200.device_name == "NVIDIA H200 141GB HBM3e"
    assert h200.device_memory == 151397597184 and h200.memory_line == "141.00 GiB per GPU"


@pytest.mark.parametrize("name", gpu_targets())
def test_each_description_names_its_source_and_the_fields_jaxlib_parses(name):
    text = gpu_target_text(name)
    assert "xla/backends/gpu/target_config/specs/" in text and "openxla/xla commit" in text
    assert re.search(r"^  device_memory_size: \d+$", text, re.M)
    assert re.search(r'^device_description_str: "NVIDIA ', text, re.M)
    # the newer rate tables and version strings jaxlib 0.10.2/0.11.2 reject are left out
    assert "rate_infos" not in text and "driver_version" not in text
