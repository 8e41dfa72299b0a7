"""Run stores: where a run's spec, status, metrics, checkpoints and evals live.

``base`` holds the layout and the contract (``RunDir``, ``RunStore``, and the
``Phase`` status.json records), ``local`` and ``gcs`` the two stores; ``open_store``
picks one from a root.
"""

from __future__ import annotations

from typing import Any

from rlctl.core.errors import ConfigError
from rlctl.core.store.base import RunStore
from rlctl.core.store.local import LocalRunStore


def open_store(root: str, client: Any = None) -> RunStore:
    """A local or ``gs://`` run store; ``client`` is a storage client from the factory
    (``Clients.storage``), built from ADC when None."""
    if root.startswith("gs://"):
        from rlctl.core.errors import require_extra

        require_extra("google.cloud.storage", "gcp")  # checks, imports nothing
        from rlctl.core.store.gcs import GcsRunStore

        return GcsRunStore(root, client=client)
    if "://" in root:
        raise ConfigError(
            f"run store {root!r}: only local paths and gs:// are supported",
            hint="use a local path or gs://BUCKET/PREFIX",
        )
    return LocalRunStore(root)
