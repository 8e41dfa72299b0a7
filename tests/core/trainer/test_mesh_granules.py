"""How the mesh splits devices across the data-centre network (``mesh_granules``), read
from the attributes JAX gives a device (jaxlib's ``Device``: ``platform``,
``process_index``, and ``slice_index`` on TPU and GPU devices, as jax/_src/mesh_utils.py's
``create_hybrid_device_mesh`` reads them). Stand-in devices carry those attributes only;
libtpu's and the CUDA plugin's real devices go through ``make_mesh`` in
tests/accelerator/test_mesh.py. And a compiler's refusal read as the bytes it asked for."""

from __future__ import annotations

from types import SimpleNamespace

from rlctl.core.trainer.runtime.distributed import mesh_granules
from rlctl.core.trainer.runtime.memory import is_oom, refused_need


def _devices(platform: str, slices: int, hosts: int, per_host: int) -> list[SimpleNamespace]:
    return [
        SimpleNamespace(platform=platform, slice_index=s, process_index=s * hosts + h)
        for s in range(slices)
        for h in range(hosts)
        for _ in range(per_host)
    ]


def test_tpu_slices_are_the_granules_not_their_hosts():
    assert mesh_granules(_devices("tpu", 2, 4, 4)) == ("slice_index", 2)
    assert mesh_granules(_devices("tpu", 1, 4, 4)) is None  # one slice: ICI throughout


def test_gpu_hosts_are_the_granules():
    assert mesh_granules(_devices("gpu", 1, 2, 8)) == ("process_index", 2)
    assert mesh_granules(_devices("cuda", 1, 1, 8)) is None


def test_cpu_processes_stay_one_mesh():
    assert mesh_granules(_devices("cpu", 1, 2, 1)) is None


def test_a_tpu_compilers_refusal_is_its_ask():
    e = RuntimeError(
        "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
        "temporaries (20.78G) exceeds available HBM (15.75G)."
    )
    assert is_oom(e) and refused_need(e) == int(20.78 * 2**30)
    assert refused_need(RuntimeError("RESOURCE_EXHAUSTED: something else")) is None
