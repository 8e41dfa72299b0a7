"""Compile-only devices: a TPU topology or GPU machines that are not here, as JAX
devices XLA compiles for (``core/config/compile_targets.py`` says which).

``jax.experimental.topologies.get_topology_desc`` gives them: libtpu describes a TPU
topology (slices, hosts, chips, their slice and process indices), JAX's CUDA plugin a
GPU from a device description (XLA's published specs, rlctl/data/gpu_targets). A
program jitted over them with abstract inputs (``jax.ShapeDtypeStruct`` with a
sharding on those devices) compiles to the real executable for that target, with its
real memory analysis. Nothing can run on them.

Without a device there is no autotuning: XLA picks GEMM and fusion configurations by
its heuristics, so a GPU's own compile takes longer, and its memory may differ a
little (``AUTOTUNE_NOTE``, said beside every GPU figure).

JAX must not initialize the plugins' real backends for this (``JAX_PLATFORMS=cpu``,
which the fit check's process sets): on a machine without the device, the CUDA
plugin's initialization prints a traceback and libtpu's looks for TPU hosts. Both
still describe their compile-only devices.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from rlctl.core.config.compile_targets import CompileTarget, gpu_target_text
from rlctl.core.errors import MissingDependencyError

AUTOTUNE_NOTE = "compiled without the GPU: no autotuning, XLA's heuristics chose its kernels"
# the CUDA plugin packages JAX discovers (jax_plugins.xla_cuda12 / xla_cuda13)
_CUDA_PLUGINS = ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13")


def missing_extra(target: CompileTarget) -> str | None:
    """Why this environment cannot compile for ``target`` (the extra to install), or
    None. Checked without importing JAX's plugins."""
    if target.kind == "tpu":
        if importlib.util.find_spec("libtpu") is None:
            return "compiling for a TPU needs libtpu (the compile-tpu extra)"
        return None
    if not any(_spec(name) for name in _CUDA_PLUGINS):
        return "compiling for a GPU needs JAX's CUDA plugin (the compile-gpu extra)"
    return None


def _spec(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # no jax_plugins namespace at all
        return False


def devices(target: CompileTarget) -> list[Any]:
    """``target``'s compile-only devices, in JAX's order."""
    from jax.experimental import topologies

    if why := missing_extra(target):
        from rlctl.core.install import extra_install_command

        raise MissingDependencyError(
            why, hint=extra_install_command(target.extra, constrained=True)
        )
    if target.kind == "tpu":
        assert target.topology_name and target.chips_per_host_bounds
        # libtpu's lockfile (/tmp/libtpu_lockfile) guards the chips of a TPU host, which
        # compile-only devices never open: without this, a second process holding libtpu
        # (a notebook, a parallel dry run, the tests' own process) makes the load fail
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        topo = topologies.get_topology_desc(
            topology_name=target.topology_name,
            platform="tpu",
            chip_config_name=target.chip_config,
            chips_per_host_bounds=target.chips_per_host_bounds,
            num_slices=target.num_slices,
        )
    else:
        assert target.gpu_target
        topo = topologies.get_topology_desc(
            target.gpu_target,
            "cuda",
            target_config=gpu_target_text(target.gpu_target),
            topology=f"1x{target.hosts}x{target.per_host}",
        )
    found = list(topo.devices)
    if len(found) != target.devices:
        raise RuntimeError(
            f"{target.label}: libtpu/XLA described {len(found)} devices, rlctl's catalog "
            f"{target.devices}"
        )
    return found
