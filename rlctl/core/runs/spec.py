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


def reward_flag(text: str) -> dict[str, Any]:
    """``--reward REF[:WEIGHT]`` -> a rewards entry: REF is a built-in name (correct,
    format), ``package.module:function`` or ``path/to/file.py:function``; a last ``:``
    part that is a number is its weight (``my_rewards.py:length:0.5``)."""
    ref, sep, last = text.strip().rpartition(":")
    if sep and ref:
        try:
            weight = float(last)
        except ValueError:
            return {"fn": text.strip()}
        import math

        if not math.isfinite(weight):
            raise ConfigError(
                f"--reward {text!r}: the weight {last!r} is not a finite number",
                hint="e.g. --reward my_rewards.py:length:0.5",
            )
        return {"fn": ref, "weight": weight}
    if not text.strip():
        raise ConfigError(
            "--reward is empty",
            hint="name a reward: correct, format, module:function or "
            "file.py:function, with :WEIGHT if you like",
        )
    return {"fn": text.strip()}


def spec_sources(
    config: str | None, overrides: list[str] | None, flags: dict[str, str], env_set: list[str]
) -> dict[str, str]:
    """Where each value a user set came from, by dotted path (later sources win):
    ``config FILE``, ``RLCTL_SET``, ``--set``, then a flag's name (``flags``: path ->
    flag). Paths not listed are the spec's defaults. Pure: reads the config file only."""
    from rlctl.core.config.load import parse_override

    out: dict[str, str] = {"algorithm": "the command"}

    def leaves(node: Any, prefix: str) -> list[str]:
        if isinstance(node, dict) and node:
            return [p for k, v in node.items() for p in leaves(v, f"{prefix}{k}.")]
        return [prefix.rstrip(".")]

    if config:
        for path in leaves(read_yaml(config), ""):
            out[path] = f"config {config}"
    for source, items in (("RLCTL_SET", env_set), ("--set", overrides or [])):
        for item in items:
            keys, value = parse_override(item)
            for leaf in leaves(value, ".".join(keys) + "."):
                out[leaf] = source
    for path, flag in flags.items():
        for known in [k for k in out if k == path or k.startswith(path + ".")]:
            del out[known]
        out[path] = flag
    return out


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
    data = {
        k: os.path.abspath(os.path.expanduser(v))
        for k in ("path", "eval_path")
        if (v := getattr(spec.data, k)) and "://" not in v
    }
    source = spec.model.source
    model: dict[str, Any] = {}
    if source != DEFAULT_MODEL and os.path.exists(os.path.expanduser(source)):
        model["source"] = os.path.abspath(os.path.expanduser(source))
    return spec.model_copy(
        update={
            "data": spec.data.model_copy(update=data),
            "model": spec.model.model_copy(update=model),
            "output": spec.output.model_copy(update={"root": absolute_root(spec.output.root)}),
        }
    )


def _yaml_scalar(v: Any) -> str:
    import json

    # JSON scalars are YAML scalars; strings are quoted so "1e-5"-like names stay strings.
    return json.dumps(v)


def _taken(store: RunStore, name: str) -> AlreadyExistsError:
    return AlreadyExistsError(
        f"run {name!r} already exists in {store.uri}",
        hint=f"continue it with 'rlctl resume {name}', remove it with 'rlctl delete "
        f"run {name}', or choose another --name",
    )


def check_name_free(store: RunStore, name: str) -> None:
    """Refuse a name already in use (before anything is loaded or printed as started);
    ``write_new_run`` claims it atomically later, so a race is still refused there."""
    run = store.run(name)
    if run.exists(SPEC):
        raise _taken(store, name)
    if any(not n.startswith(".") for n in run.list("")):  # a lock or lease is no run
        # checkpoints without a spec: a damaged run a new spec would silently resume
        raise AlreadyExistsError(
            f"run folder {run.uri} exists without its {SPEC}",
            hint=f"restore its {SPEC}, remove it with 'rlctl delete run {name}', or "
            "choose another --name",
        )


def write_new_run(store: RunStore, spec: RunSpec) -> RunDir:
    """Claim ``spec.name`` in ``store`` by writing its spec.yaml. A spec is written
    once: a name already in use is refused, since continuing a run is resume's job."""
    assert spec.name is not None
    run = store.run(spec.name)
    check_name_free(store, spec.name)
    try:
        # exclusive: of two racing creators, one wins; checked by its reader first
        run.write_text(SPEC, spec_text(spec, f"{run.uri}/{SPEC}"))
    except ConflictError:
        raise _taken(store, spec.name) from None
    return run
