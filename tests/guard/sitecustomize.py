"""The fast loop's guard (``RLCTL_FAST_GUARD=1``, on ``PYTHONPATH`` by tests/test_marks.py):
JAX, torch, transformers, vLLM, Ray, Flax, Tunix and Orbax cannot be imported, in the test
process and in every Python child it starts (this file is each child's
``sitecustomize``).

Why: ``pytest -m "not slow"`` is the contributor's loop of a few minutes; a test that
builds a real model, compiles or trains costs seconds to minutes and belongs to the
whole suite, marked ``slow`` (or ``trainer``, which the conftest makes ``slow``).

How: each name is ``None`` in ``sys.modules``, which the import system reads as "not
importable": ``import jax`` raises ModuleNotFoundError ("import of jax halted; None in
sys.modules"), and ``importlib.util.find_spec("torch")``, the probe libraries use before
an optional import, answers None, as if it were not installed.
"""

from __future__ import annotations

import os
import sys

HEAVY = ("jax", "jaxlib", "torch", "transformers", "vllm", "ray", "flax", "tunix", "orbax")


def guard() -> None:
    for name in HEAVY:
        if name not in sys.modules:  # what is imported already stays
            sys.modules[name] = None  # type: ignore[assignment]


if os.environ.get("RLCTL_FAST_GUARD") == "1":
    guard()
