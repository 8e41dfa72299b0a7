"""An accelerator kind for rlctl: add the class to rlctl/core/config/kinds.py and to
``KINDS`` there, its machine types to the catalog (rlctl/data/accelerators.yaml) and, for
the image flavour ``rlctl-<name>``, a ``Dockerfile.<name>.j2`` in rlctl/templates.

This one is the GPU pattern under another name: whole machines, each one node with
``per_node`` devices behind one extended resource, ``-a "TYPE xN"`` counting machines.
A TPU-like kind (slices of several hosts, a topology label) follows ``Tpu`` instead.
Then add its case to tests/core/config/test_kinds.py (docs/contributing/accelerator-kinds.md);
tests/test_contributing.py instantiates this very class and asks it a shape.
"""

from __future__ import annotations

from typing import Any

from rlctl.core.config.kinds import AcceleratorKind, Slice

RESOURCE = "example.com/accelerator"  # the extended resource its device plugin offers
LABEL = "cloud.google.com/gke-accelerator"  # the node label GKE puts on its machines


class MyAccelerator(AcceleratorKind):
    name = "myacc"  # the catalog's kind, and the image flavour rlctl-myacc
    resource = RESOURCE
    unit = "devices"
    count_word = "machine"
    count_field = "hosts_per_slice"
    threads_per_core = None  # the machine's default
    resizable = True

    def chips(self, acc: Slice) -> int:
        return acc.gpus

    def multi_host(self, acc: Slice) -> bool:
        return False

    def node_labels(self, acc: Slice) -> dict[str, str]:
        return {LABEL: acc.gpu_type or ""}

    def per_node(self, acc: Slice) -> int:
        return acc.gpus

    def selector(self, accelerator: str, topology: str | None) -> dict[str, str]:
        return {LABEL: accelerator}

    def shape_fields(self, acc: Slice, count: int) -> dict[str, Any]:
        return {
            "accelerator": acc.gpu_type or "",
            "hosts_per_slice": count,
            "chips_per_host": acc.gpus,
        }

    def pool_sizes(self, acc: Slice, count: int) -> list[int]:
        return [count]  # one pool of ``count`` machines

    def count_from_pools(self, pools: int, nodes: int) -> int:
        return max(nodes, 1)

    def pool_config(self, acc: Slice) -> dict[str, Any]:
        return {"accelerators": [{"accelerator_count": acc.gpus, "accelerator_type": acc.gpu_type}]}

    def pool_extras(self, acc: Slice) -> dict[str, Any]:
        return {}

    def plan_fields(self, acc: Slice) -> dict[str, Any]:
        return {"devices": f"{acc.gpus} x {acc.gpu_type}"}

    def price_key(self, acc: Slice) -> tuple[str, str, int]:
        return "machine_hour", acc.machine_type, 1

    def quota_key(self, acc: Slice) -> str:
        return acc.gpu_type or ""

    def matches(self, acc: Slice, topology: str | None) -> bool:
        return True
