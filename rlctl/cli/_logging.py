"""Library chatter on stderr: off by default, back with ``-v``.

JAX, Orbax (through absl), TensorStore/XLA (C++ logging) and friends write
warnings and background-thread ERROR lines straight to stderr. A user reads
rlctl's own progress and one-line errors there; ``-v`` shows library warnings,
``-vv`` their info lines. Nothing here imports those libraries: it configures
the standard ``logging`` tree and environment variables they read at import.
"""

from __future__ import annotations

import logging
import os
import warnings

LIBRARY_LOGGERS = (
    "absl",
    "jax",
    "jaxlib",
    "orbax",
    "flax",
    "tunix",
    "etils",
    "tensorstore",
    "google",
    "urllib3",
    "kubernetes",
    "tensorboardX",
    "numba",
    "datasets",
    "huggingface_hub",
    "grain",
)
# 2 and more: INFO (JAX accepts named levels only, so CRITICAL rather than CRITICAL + 1)
_LEVELS = {0: logging.CRITICAL, 1: logging.WARNING}


def configure_library_logging(verbose: int) -> None:
    """Set library loggers (and XLA's C++ log level) for this verbosity."""
    level = _LEVELS.get(verbose, logging.INFO)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(level)
    if verbose == 0:
        # read by XLA/TSL when jax first loads; a user's own setting wins
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=UserWarning)
