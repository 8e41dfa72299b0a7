"""The records rlctl writes into a run and reads back: ``spec.yaml``, ``status.json``
and a checkpoint's ``rlctl-manifest.json``. Each has one reader here, and its
writer passes what it is about to write through that same reader first, so rlctl
never writes a file it would then refuse (#47: ``resume --steps 10^20`` wrote a
``spec.yaml`` that every later resume refused as "invalid RunSpec" until edited by
hand). A record the reader refuses is a bug in the writer: it raises before the
file is touched, and the file on disk stays as it was.
"""

from __future__ import annotations

import json
import math
from typing import Any

from rlctl.core.config.load import build, dump_yaml
from rlctl.core.config.models import RunSpec
from rlctl.core.errors import ConfigError, RlctlError
from rlctl.core.phases import Phase

# --- spec.yaml -------------------------------------------------------------------


def read_spec(text: str, where: str) -> RunSpec:
    """The RunSpec of a ``spec.yaml``'s text (``where`` names the file in errors)."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(
            f"{where} is not valid YAML", hint="restore the run's spec.yaml (its settings)"
        ) from e
    except RecursionError as e:  # nested deeper than the parser's stack
        raise ConfigError(
            f"{where} is nested too deeply to read",
            hint="restore the run's spec.yaml (its settings)",
        ) from e
    if not isinstance(data, dict):
        raise ConfigError(
            f"{where} is empty or not a mapping", hint="restore the run's spec.yaml (its settings)"
        )
    try:
        return build(RunSpec, _stored_before_26(data))
    except ConfigError as e:
        raise ConfigError(f"{where}: {e.message}", hint="fix or restore the run's spec.yaml") from e


def spec_text(spec: RunSpec, where: str) -> str:
    """The text of ``spec`` as ``spec.yaml``, read back by ``read_spec`` first: a spec
    the reader refuses, or reads as another spec, is never written."""
    text = dump_yaml(spec)
    try:
        back = read_spec(text, where)
    except ConfigError as e:
        raise RlctlError(
            f"rlctl would write a {where} it cannot read back ({e.message}); nothing was written",
            hint="report this; the run's files are unchanged",
        ) from e
    if back != spec:
        raise RlctlError(
            f"rlctl would write a {where} that reads back differently; nothing was written",
            hint="report this; the run's files are unchanged",
        )
    return text


def _stored_before_26(data: dict[str, Any]) -> dict[str, Any]:
    """A spec.yaml written before #26 as what its run trained on: with ``name:
    arithmetic`` that trainer ignored ``path`` and ``eval_path`` (the generator ran),
    so they are dropped rather than refused; the other old keys are DataSpec's
    deprecated names."""
    old = data.get("data")
    if not isinstance(old, dict) or old.get("name") != "arithmetic":
        return data
    kept = {
        k: v
        for k, v in old.items()
        if k not in ("path", "eval_path", "question_field", "answer_field")
    }
    return {**data, "data": kept}


# --- status.json -----------------------------------------------------------------

_COUNTS = ("step", "total_steps", "latest_checkpoint", "pid", "processes", "devices")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(text: str) -> Any:
    """Strict JSON: no NaN or Infinity (Python's extension, which other readers of
    the file refuse), and nesting too deep to read is a ValueError, not a
    RecursionError."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError as e:
        raise ValueError("nested too deeply to read") from e


def status_problems(data: Any) -> dict[str, str]:
    """What is wrong with a ``status.json`` object, field by field ({} when nothing):
    the one check its reader and its writer share."""
    if not isinstance(data, dict):
        return {"": f"a JSON {type(data).__name__}, not an object"}
    problems = {}
    phase = data.get("phase")
    if "phase" in data and (not isinstance(phase, str) or phase not in Phase._value2member_map_):
        problems["phase"] = f"phase {phase!r} is not a phase"
    for key in _COUNTS:
        value = data.get(key)
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 0
        ):
            problems[key] = f"{key} {value!r} is not a whole number >= 0"
    for key, value in data.items():
        if isinstance(value, float) and not math.isfinite(value):
            problems[key] = f"{key} is {value}"
    return problems


def read_status_text(text: str) -> tuple[dict[str, Any], str | None]:
    """(the status, None), or (what of it can be trusted, why it is damaged): a field
    that fails ``status_problems`` is left out, never raised, so one bad run cannot
    break ``status`` for the others and ``resume`` rebuilds what is missing."""
    try:
        data = parse_json(text)
    except ValueError as e:
        line = f" (line {e.lineno})" if isinstance(e, json.JSONDecodeError) else f" ({e})"
        return {}, f"status.json is not valid JSON{line}"
    problems = status_problems(data)
    if "" in problems:
        return {}, f"status.json holds {problems['']}"
    if not problems:
        return data, None
    kept = {k: v for k, v in data.items() if k not in problems}
    return kept, "status.json: " + "; ".join(problems.values())


def status_text(data: dict[str, Any]) -> str:
    """The text of ``data`` as ``status.json``, checked by its reader first."""
    problems = status_problems(data)
    if problems:
        raise RlctlError(
            f"rlctl would write a status.json it cannot read back "
            f"({'; '.join(problems.values())}); nothing was written",
            hint="report this; the run's files are unchanged",
        )
    return json.dumps(data, indent=2, default=str, allow_nan=False) + "\n"


# --- a checkpoint's manifest -----------------------------------------------------


def read_manifest(text: str) -> dict[str, tuple[int, str]]:
    """A checkpoint manifest's files: relative path -> (bytes, SHA-256 hex). Raises
    ValueError when ``text`` is not one."""
    try:
        files = parse_json(text)["files"]
        out = {str(rel): (int(size), str(digest)) for rel, (size, digest) in files.items()}
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"not a manifest ({type(e).__name__})") from e
    for rel, (size, digest) in out.items():
        parts = rel.split("/")
        if size < 0 or len(digest) != 64 or not rel or rel.startswith("/") or ".." in parts:
            raise ValueError(f"not a manifest (entry {rel!r})")
    return out


def manifest_text(files: dict[str, tuple[int, str]]) -> str:
    """The text of a manifest of ``files``, checked by its reader first."""
    text = (
        json.dumps(
            {"files": {rel: [size, digest] for rel, (size, digest) in files.items()}}, indent=1
        )
        + "\n"
    )
    try:
        back = read_manifest(text)
    except ValueError as e:
        raise RlctlError(
            f"rlctl would write a checkpoint manifest it cannot read back ({e})", hint="report this"
        ) from e
    if back != files:
        raise RlctlError(
            "rlctl would write a checkpoint manifest that reads back differently",
            hint="report this",
        )
    return text
