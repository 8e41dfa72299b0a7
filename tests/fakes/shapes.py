"""Hand-written slice shapes for render/apply tests (independent of the catalog)."""

from __future__ import annotations

from rlctl.core.k8s.shapes import SliceShape


def v6e_16(num_slices: int = 1) -> SliceShape:
    """v6e-16: ct6e-standard-4t, topology 4x4, 4 hosts x 4 chips (GKE's TPU v6e table), in
    pools of one thread per core as ``cluster create`` makes them (90 vCPUs a host)."""
    return SliceShape(
        kind="tpu",
        accelerator="tpu-v6e-slice",
        machine_type="ct6e-standard-4t",
        topology="4x4",
        hosts_per_slice=4,
        chips_per_host=4,
        num_slices=num_slices,
        threads_per_core=1,
    )


def h100_8(hosts: int = 1, num_slices: int = 1) -> SliceShape:
    """a3-highgpu-8g nodes with 8 H100s each."""
    return SliceShape(
        kind="gpu",
        accelerator="nvidia-h100-80gb",
        machine_type="a3-highgpu-8g",
        hosts_per_slice=hosts,
        chips_per_host=8,
        num_slices=num_slices,
    )
