"""Name rules shared by runs, clusters and every Kubernetes/GCP object we create."""

from __future__ import annotations

import re
import secrets
import time

from rlctl.core.errors import ConfigError

_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME = 40  # leaves room for suffixes such as "-slice-0-worker-12" inside 63 chars


def validate_name(name: str, kind: str = "run", max_len: int = MAX_NAME) -> str:
    """Accept a DNS-1035 label short enough for derived object names."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{kind} name is empty", hint="use lowercase letters, digits and '-'")
    if len(name) > max_len:
        raise ConfigError(
            f"{kind} name {name!r} is {len(name)} characters; the limit is {max_len}",
            hint="choose a shorter name",
        )
    if not _DNS_1035.fullmatch(name):
        raise ConfigError(
            f"{kind} name {name!r} is not a DNS-1035 label",
            hint="start with a lowercase letter; use only lowercase letters, digits and '-'; "
            "do not end with '-'",
        )
    return name


def generate_run_name(algorithm: str, now: float | None = None) -> str:
    """A sortable, unique default: ``grpo-20261122-101500-3fa2``."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now if now is not None else time.time()))
    return f"{algorithm}-{stamp}-{secrets.token_hex(2)}"
