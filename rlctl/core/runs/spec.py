"""Resolve the RunSpec a command will run (defaults < YAML < --set < named flags),
and write it once into a new run."""

from __future__ import annotations

from typing import Any

from rlctl.core.config.load import build, dump_yaml, read_yaml
from rlctl.core.config.models import RunSpec
from rlctl.core.errors import AlreadyExistsError, ConfigError
from rlctl.core.runs.store import SPEC, RunDir, RunStore


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



def write_new_run(store: RunStore, spec: RunSpec) -> RunDir:
    """Claim ``spec.name`` in ``store`` by writing its spec.yaml. A spec is written
    once: a name already in use is refused, since continuing a run is resume's job."""
    assert spec.name is not None
    run = store.run(spec.name)
    if run.exists(SPEC):
        raise AlreadyExistsError(
            f"run {spec.name!r} already exists in {store.uri}",
            hint=f"continue it with 'rlctl resume {spec.name}' or choose another --name",
        )
    run.write_text(SPEC, dump_yaml(spec))
    return run
