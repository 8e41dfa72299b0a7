"""The model families rlctl trains and converts, as plug-ins: one module per family
(``llama.py``, ``mistral.py``, ...), each declaring a ``Family`` record (``record.py``):
the ``model_type`` it accepts, its Tunix model and config mapping, its tensor layout,
what the trainer may do with it (``Capabilities``) and a tiny config for tests.
``registry.py`` finds them; tests/core/families/test_conformance.py checks every one.

Low and pure (no jax, no Tunix, no numpy): the converter, the trainer and the CLI's
checks all read it. Adding a family of an existing architecture is one module here
and its row in the conformance test (docs/checkpoints.md, "Adding a model family").
"""

from rlctl.core.families.record import Capabilities, Family, Layout, Wrapper
from rlctl.core.families.registry import (
    FAMILIES,
    SUPPORTED,
    WRAPPED,
    family,
    find,
    of_config,
    of_gguf,
    with_lora,
)

__all__ = [
    "FAMILIES",
    "SUPPORTED",
    "WRAPPED",
    "Capabilities",
    "Family",
    "Layout",
    "Wrapper",
    "family",
    "find",
    "of_config",
    "of_gguf",
    "with_lora",
]
