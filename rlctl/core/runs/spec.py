"""Resolve the RunSpec a command will run (defaults < YAML < --set < named flags),
and write it once into a new run."""

from __future__ import annotations

import os
from typing import Any

from rlctl.core.config.load import build, read_yaml
from rlctl.core.config.models import DEFAULT_MODEL, RunSpec
from rlctl.core.errors import AlreadyExistsError, ConfigError, ConflictError
from rlctl.core.store.base import SPEC, RunDir, RunStore
from rlctl.core.store.records import spec_text


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
    spec = build(RunSpec, base, [*(overrides or []), *extra])
    root = absolute_root(spec.output.root)
    return spec.model_copy(update={"output": spec.output.model_copy(update={"root": root})})


def absolute_root(root: str) -> str:
    """A local run store root as an absolute path (``~`` expanded); ``gs://`` unchanged.

    Resolved once, against the directory the command starts in: Orbax >= 0.12.8
    refuses relative checkpoint paths, and the stored spec must name the same folder
    whichever directory a later ``resume`` or ``status`` runs from.
    """
    if "://" in root:
        return root
    return os.path.abspath(os.path.expanduser(root))


def local_paths_absolute(spec: RunSpec) -> RunSpec:
    """The spec of a run on this machine with its local inputs as absolute paths.

    ``data.path``/``data.eval_path`` and a ``model.source`` that is an existing local
    folder are relative to the directory ``train`` started in; made absolute before
    the spec is stored, a ``resume`` from any other directory reads the same files.
    A hub id and the embedded model's name stay as they are. Not applied to cluster
    runs: their paths are the pod's, not this machine's.
    """
    data = {k: os.path.abspath(os.path.expanduser(v))
            for k in ("path", "eval_path")
            if (v := getattr(spec.data, k)) and "://" not in v}
    source = spec.model.source
    model: dict[str, Any] = {}
    if source != DEFAULT_MODEL and os.path.exists(os.path.expanduser(source)):
        model["source"] = os.path.abspath(os.path.expanduser(source))
    return spec.model_copy(update={
        "data": spec.data.model_copy(update=data),
        "model": spec.model.model_copy(update=model),
        "output": spec.output.model_copy(update={"root": absolute_root(spec.output.root)}),
    })


def _yaml_scalar(v: Any) -> str:
    import json

    # JSON scalars are YAML scalars; strings are quoted so "1e-5"-like names stay strings.
    return json.dumps(v)


def write_new_run(store: RunStore, spec: RunSpec) -> RunDir:
    """Claim ``spec.name`` in ``store`` by writing its spec.yaml. A spec is written
    once: a name already in use is refused, since continuing a run is resume's job."""
    assert spec.name is not None
    run = store.run(spec.name)
    taken = AlreadyExistsError(
        f"run {spec.name!r} already exists in {store.uri}",
        hint=f"continue it with 'rlctl resume {spec.name}', remove it with 'rlctl delete "
        f"run {spec.name}', or choose another --name",
    )
    if run.exists(SPEC):
        raise taken
    if any(not n.startswith(".") for n in run.list("")):  # a lock or lease is no run
        # checkpoints without a spec: a damaged run a new spec would silently resume
        raise AlreadyExistsError(
            f"run folder {run.uri} exists without its {SPEC}",
            hint=f"restore its {SPEC}, remove it with 'rlctl delete run {spec.name}', or "
            "choose another --name")
    try:
        # exclusive: of two racing creators, one wins; checked by its reader first
        run.write_text(SPEC, spec_text(spec, f"{run.uri}/{SPEC}"))
    except ConflictError:
        raise taken from None
    return run
