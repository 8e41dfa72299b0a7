"""An accelerator kind for rlctl: add the class to rlctl/core/config/kinds.py and to
``KINDS`` there, its machine types to the catalog (rlctl/data/accelerators.yaml) and, for
the image flavour ``rlctl-<name>``, a ``Dockerfile.<name>.j2`` in rlctl/templates.

This one is the GPU pattern under another name: whole machines, each one node with
``per_node`` devices behind one extended resource, ``-a "TYPE xN"`` counting machines.
So it starts from ``Gpu`` and says only what differs: its name, its resource and node
label, its part of a node pool's body and the plan's fields. A kind of multi-host slices
(a topology label, a pool per slice) starts from ``Tpu``; one unlike both implements every
abstract method of ``AcceleratorKind`` (it cannot be made otherwise). Then add its case
to tests/core/config/test_kinds.py (docs/contributing/accelerator-kinds.md);
tests/test_contributing.py instantiates this very class and asks it a shape.
"""

from __future__ import annotations

from typing import Any

from rlctl.core.config.kinds import Gpu, Slice

RESOURCE = "example.com/accelerator"  # the extended resource its device plugin offers
LABEL = "example.com/accelerator-type"  # the node label its machines carry


class MyAccelerator(Gpu):
    name = "myacc"  # the catalog's kind, and the image flavour rlctl-myacc
    resource = RESOURCE
    unit = "devices"

    def node_labels(self, acc: Slice) -> dict[str, str]:
        return {LABEL: acc.gpu_type or ""}

    def selector(self, accelerator: str, topology: str | None) -> dict[str, str]:
        return {LABEL: accelerator}

    def pool_config(self, acc: Slice) -> dict[str, Any]:
        """Its part of a GKE node pool's ``config``: here, no driver installed by GKE."""
        return {"accelerators": [{"accelerator_count": acc.gpus, "accelerator_type": acc.gpu_type}]}

    def plan_fields(self, acc: Slice) -> dict[str, Any]:
        return {"devices": f"{acc.gpus} x {acc.gpu_type}"}
