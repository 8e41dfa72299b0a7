"""The mesh of several TPU slices and of several GPU hosts, built over libtpu's and the
CUDA plugin's compile-only devices, and the run's update, rollout and eval compiled
over it.

``jax.make_mesh`` refuses the devices of two slices (an AssertionError from libtpu's
devices of two v6e-16 slices; "does not support multi-slice topologies" where the
devices name different slices): every run of the README's first cluster example
(``-a 'v6e-16 x2'``) died there before its first step. ``distributed.make_mesh`` joins
them as MaxText does (``mesh_utils.create_hybrid_device_mesh``: ICI within a slice, DCN
across slices or GPU hosts)."""

from __future__ import annotations

import jax
import pytest

from rlctl.core.config.catalog import lookup
from rlctl.core.config.compile_targets import compile_target
from rlctl.core.config.models import RunSpec
from rlctl.core.trainer.device_fit.check import check
from rlctl.core.trainer.runtime import distributed, targets

SLICES = ["v6e-16", "v5p-16"]


def _devices(name: str, count: int) -> list:
    target = compile_target(lookup(name), count)
    assert target is not None
    return targets.devices(target)


@pytest.mark.parametrize("name", SLICES)
def test_two_slices_make_one_mesh_each_slice_contiguous_along_fsdp(name):
    devices = _devices(name, 2)
    assert len({d.slice_index for d in devices}) == 2
    with pytest.raises(AssertionError):  # what today's trainer called, and died in
        jax.make_mesh((len(devices), 1), ("fsdp", "tp"), devices=devices)
    mesh = distributed.make_mesh(devices)
    assert mesh.shape == {"fsdp": len(devices), "tp": 1}
    order = [d.slice_index for d in mesh.devices.flat]
    half = len(order) // 2
    assert order == [order[0]] * half + [order[-1]] * half and order[0] != order[-1]
    assert set(mesh.devices.flat) == set(devices)


def test_two_gpu_hosts_make_one_mesh_grouped_by_host():
    devices = _devices("a3-ultragpu-8g", 2)  # 2 machines of 8 H200s
    assert sorted({d.process_index for d in devices}) == [0, 1]
    mesh = distributed.make_mesh(devices)
    assert mesh.shape == {"fsdp": 16, "tp": 1}
    hosts = [d.process_index for d in mesh.devices.flat]
    assert hosts == sorted(hosts)  # each host's 8 GPUs side by side (NVLink), then DCN


def test_one_slice_and_one_device():
    devices = _devices("v6e-8", 1)
    assert distributed.mesh_granules(devices) is None
    assert distributed.make_mesh(devices).shape == {"fsdp": 8, "tp": 1}
    assert distributed.make_mesh(devices[:1]) is None  # the laptop's path: no mesh


@pytest.mark.parametrize("name", ["v6e-16 x2", "v5p-16 x2", "a3-ultragpu-8g x2"])
def test_the_update_rollout_and_eval_compile_over_slices_and_hosts(name, tiny_config):
    acc, _, count = name.partition(" x")
    target = compile_target(lookup(acc), int(count))
    spec = RunSpec(
        rollout={"num_generations": 4, "max_new_tokens": 16}, training={"prompts_per_step": 2}
    )
    report = check(spec, tiny_config, target)
    assert report.checked and report.fits, report
    assert [p.name for p in report.programs] == ["update", "rollout", "eval"]
    for p in report.programs:
        assert p.cpu_only == [], (p.name, p.cpu_only)
        assert 0 < p.peak < report.usable
    assert report.devices == target.devices
