"""Multi-controller JAX: join the other hosts, span one mesh, let one process write.

In a JobSet or Ray workload every host runs the same trainer program (SPMD).
Each process computes every step on the same global inputs (prompts and seeds
are pure functions of (seed, step), see loop.py), the model and optimizer are
sharded FSDP-style over a mesh of *all* devices, and XLA inserts the
collectives. Only process 0 writes the run store (status, metrics, eval,
checkpoints): the others would race it on status.json.

Checkpoints of a multi-process run are gathered to host memory and written by
process 0 alone, so they are plain, unsharded arrays: a run saved on 4 hosts
restores on 2 (an elastic Ray job that lost a slice) or on a laptop.

How a process learns its place, in order (``plan_from_env``, pure and tested):
1. ``jax.distributed`` already initialized (Ray Train's JaxTrainer does it) -> as is;
2. ``JAX_COORDINATOR_ADDRESS`` + ``JAX_NUM_PROCESSES`` + ``JAX_PROCESS_ID`` (the
   GPU JobSet sets them from the pod's completion index) -> explicit;
3. a multi-host TPU slice (``TPU_WORKER_HOSTNAMES`` lists more than one host) or
   several slices (``MEGASCALE_NUM_SLICES`` > 1) -> JAX's own TPU auto-detection;
4. ``JAX_PLATFORMS=proxy`` -> Pathways: one controller process that sees every TPU
   of the slices through the proxy backend of ``pathwaysutils``;
5. otherwise one process (a laptop, one machine with several GPUs).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rlctl.core.errors import ConfigError

Mode = Literal["single", "external", "explicit", "tpu-auto", "pathways"]


@dataclass(frozen=True)
class InitPlan:
    mode: Mode
    coordinator: str | None = None
    num_processes: int = 1
    process_id: int = 0


def _int(env: Mapping[str, str], key: str) -> int:
    raw = env.get(key, "")
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(
            f"{key}={raw!r} is not an integer", hint=f"set {key} to a whole number"
        ) from None


def plan_from_env(env: Mapping[str, str], *, already_initialized: bool = False) -> InitPlan:
    if already_initialized:
        return InitPlan("external")
    if env.get("JAX_PLATFORMS", "").split(",")[0] == "proxy":
        return InitPlan("pathways")  # one controller drives every slice
    if env.get("JAX_NUM_PROCESSES") is not None:
        n = _int(env, "JAX_NUM_PROCESSES")
        if n < 1:
            raise ConfigError(f"JAX_NUM_PROCESSES={n} must be at least 1")
        if n == 1:
            return InitPlan("single")
        coordinator = env.get("JAX_COORDINATOR_ADDRESS", "")
        if not coordinator:
            raise ConfigError(
                "JAX_NUM_PROCESSES is set but JAX_COORDINATOR_ADDRESS is not",
                hint="set JAX_COORDINATOR_ADDRESS=HOST:PORT of process 0",
            )
        if "JAX_PROCESS_ID" not in env:
            raise ConfigError(
                "JAX_NUM_PROCESSES is set but JAX_PROCESS_ID is not",
                hint="set JAX_PROCESS_ID to this host's index, 0-based",
            )
        pid = _int(env, "JAX_PROCESS_ID")
        if not 0 <= pid < n:
            raise ConfigError(f"JAX_PROCESS_ID={pid} is outside 0..{n - 1}")
        return InitPlan("explicit", coordinator, n, pid)
    hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
    slices = _int(env, "MEGASCALE_NUM_SLICES") if env.get("MEGASCALE_NUM_SLICES") else 1
    if len(hosts) > 1 or slices > 1:
        return InitPlan("tpu-auto")
    return InitPlan("single")


@dataclass(frozen=True)
class Topology:
    process_index: int
    process_count: int
    device_count: int

    @property
    def is_writer(self) -> bool:
        """Process 0 alone writes the run store."""
        return self.process_index == 0

    @property
    def multi_process(self) -> bool:
        return self.process_count > 1


def initialize(env: Mapping[str, str] | None = None) -> Topology:
    """Join the other processes of this workload (before any JAX computation)."""
    import jax

    plan = plan_from_env(
        os.environ if env is None else env, already_initialized=jax.distributed.is_initialized()
    )
    if plan.mode == "explicit":
        jax.distributed.initialize(
            plan.coordinator, num_processes=plan.num_processes, process_id=plan.process_id
        )
    elif plan.mode == "tpu-auto":
        jax.distributed.initialize()
    elif plan.mode == "pathways":
        _pathways_backend()
    return current()


def _pathways_backend() -> None:
    from rlctl.core.errors import MissingDependencyError

    try:
        import pathwaysutils
    except ImportError:
        raise MissingDependencyError(
            "JAX_PLATFORMS=proxy (the pathways backend) needs pathwaysutils in the image",
            hint="add 'pip install pathwaysutils' to the trainer image, or use --backend jobset",
        ) from None
    pathwaysutils.initialize()


def current() -> Topology:
    import jax

    return Topology(jax.process_index(), jax.process_count(), jax.device_count())


def make_mesh(devices: Sequence[Any] | None = None) -> Any:
    """An FSDP mesh over ``devices`` (every device of every process by default); None
    for a single device, which keeps the one-device path (the laptop default) free of
    sharding.

    The devices of several TPU slices (their ``slice_index`` differs) or of several GPU
    hosts are joined by the data-centre network, their chips within a slice or host by
    ICI or NVLink: ``jax.make_mesh`` refuses such a set (an AssertionError for libtpu's
    devices of two v6e-16 slices, "does not support multi-slice topologies" on two GPU
    hosts). So, as MaxText's ``create_device_mesh`` does, the mesh is a hybrid one
    (``mesh_utils.create_hybrid_device_mesh``): each slice's (host's) devices laid out
    by their ICI topology, the slices (hosts) stacked along the same ``fsdp`` axis,
    grouped by slice on a TPU and by process on a GPU (``process_is_granule``, the
    t5x/paxml spelling for GPUs, which set no meaningful slice index)."""
    import jax
    from jax.sharding import AxisType, Mesh

    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    if n == 1:
        return None
    names, types = ("fsdp", "tp"), (AxisType.Auto,) * 2  # Tunix's ("fsdp", "tp")
    granules = mesh_granules(devices)
    if granules is None:
        return jax.make_mesh((n, 1), names, axis_types=types, devices=devices)
    from jax.experimental import mesh_utils

    attr, count = granules
    grid = mesh_utils.create_hybrid_device_mesh(
        (n // count, 1),
        (count, 1),
        devices=devices,
        process_is_granule=attr == "process_index",
        allow_split_physical_axes=True,
    )
    return Mesh(grid, names, axis_types=types)


def mesh_granules(devices: Sequence[Any]) -> tuple[str, int] | None:
    """How ``devices`` split across the data-centre network: (the device attribute
    that names a part, the number of parts), or None when they are one slice or host.

    TPU devices name their slice (``slice_index``); GPU devices their host
    (``process_index``; a GPU's ``slice_index``, where set, is its process's)."""
    platform = devices[0].platform
    if platform == "tpu":
        slices = {getattr(d, "slice_index", 0) for d in devices}
        return ("slice_index", len(slices)) if len(slices) > 1 else None
    if platform == "cpu":
        return None  # one process's, or a test's multi-process CPU: one fabric
    hosts = {d.process_index for d in devices}
    return ("process_index", len(hosts)) if len(hosts) > 1 else None


@contextlib.contextmanager
def using_mesh(mesh: Any) -> Iterator[None]:
    if mesh is None:
        yield
        return
    import jax

    with jax.set_mesh(mesh):
        yield


def weights_fit_each_device(model: Any, share: float = 0.25) -> bool:
    """Whether one whole copy of the weights takes at most ``share`` of a device's
    memory (unknown on CPU: yes), so the sampler can decode on whole weights."""
    import jax
    from flax import nnx

    size = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    stats = jax.local_devices()[0].memory_stats() or {}
    limit = stats.get("bytes_limit")
    return not limit or size <= share * limit


def agree(value: Any, topo: Topology) -> Any:
    """Process 0's ``value`` on every process: decisions read from the run store
    (which checkpoint, whether to evaluate) must be the same everywhere, or the
    processes would run different programs and hang in a collective."""
    if not topo.multi_process:
        return value
    import numpy as np
    from jax.experimental import multihost_utils

    return multihost_utils.broadcast_one_to_all(np.asarray(value)).item()


def least(value: int, topo: Topology) -> int:
    """The smallest of every process's ``value`` (free memory: the tightest host
    decides a micro-batch size that every process must share)."""
    if not topo.multi_process:
        return value
    import numpy as np
    from jax.experimental import multihost_utils

    # in MiB: with JAX's 64-bit mode off an int64 travels as int32, and 4 GB wrapped
    # to a negative number; 2**31 MiB is 2 PiB
    mib = np.asarray(min(value >> 20, 2**31 - 1), np.int32)
    return int(np.min(multihost_utils.process_allgather(mib))) << 20


def to_host(tree: Any, topo: Topology) -> Any:
    """Every array of ``tree`` as one whole numpy array (a collective when sharded
    over several processes: every process must call it)."""
    import jax

    if topo.multi_process:
        from jax.experimental import multihost_utils

        return multihost_utils.process_allgather(tree, tiled=True)
    return jax.device_get(tree)


def place_like(host_tree: Any, like: Any) -> Any:
    """Whole host arrays -> global arrays sharded as ``like``'s leaves are."""
    import jax

    def put(x, ref):
        return jax.make_array_from_callback(x.shape, ref.sharding, lambda idx: x[idx])

    return jax.tree.map(put, host_tree, like)
