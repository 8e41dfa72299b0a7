"""Resolve the RunSpec a command will run: defaults < YAML < --set < named flags."""

from __future__ import annotations

from typing import Any

from rlctl.core.config.load import build, read_yaml, set_path
from rlctl.core.config.models import RunSpec
from rlctl.core.errors import ConfigError


def resolve_run_spec(
    algorithm: str,
    config: str | None = None,
    overrides: list[str] | None = None,
    flags: dict[str, Any] | None = None,
) -> RunSpec:
    base = read_yaml(config) if config else {}
    file_algo = base.get("algorithm")
    if file_algo not in (None, algorithm):
        raise ConfigError(
            f"config file says algorithm {file_algo!r} but the command is 'train {algorithm}'",
            hint=f"run 'rlctl train {file_algo}' or remove 'algorithm' from the file",
        )
    base["algorithm"] = algorithm
    extra = [f"{k}={_yaml_scalar(v)}" for k, v in (flags or {}).items() if v is not None]
    return build(RunSpec, base, [*(overrides or []), *extra])


def _yaml_scalar(v: Any) -> str:
    import json

    # JSON scalars are YAML scalars; strings are quoted so "1e-5"-like names stay strings.
    return json.dumps(v)


__all__ = ["resolve_run_spec", "set_path"]
