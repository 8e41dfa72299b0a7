"""Shell completion of run names, cluster names, accelerator types and backends.

Each function answers ``rlctl ... <TAB>`` while the shell waits, so each reads only
what is on this machine and cheap: a listing of the local run store, the cluster
names rlctl remembered (``core/gcp/known.py``), the accelerator catalog shipped
with rlctl, the backend registry. Never the network, never jax or google-cloud; any
error means "no suggestions", never a traceback in the user's prompt.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from pydantic import BaseModel

Suggestions = list[str] | list[tuple[str, str]]


def _quiet(fn: Callable[..., Suggestions]) -> Callable[..., Suggestions]:
    """No suggestion instead of an exception: completion must never break a prompt."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]  # fn's own signature, kept by wraps
        try:
            return fn(*args, **kwargs)
        except Exception:
            return []

    return wrapper


def _starting(names: Iterable[str], incomplete: str) -> list[str]:
    return [n for n in names if n.startswith(incomplete)]


def local_run_names(root: str) -> list[str]:
    """Folders of a local run store that hold a run (its spec.yaml), sorted; none
    for a gs:// store (a bucket listing is a network call)."""
    from rlctl.core.store.base import SPEC

    if root.startswith("gs://"):
        return []
    root = os.path.expanduser(root)
    with os.scandir(root) as it:
        return sorted(
            e.name for e in it if e.is_dir() and os.path.isfile(os.path.join(e.path, SPEC))
        )


@_quiet
def run_names(ctx: typer.Context, incomplete: str) -> Suggestions:
    """Runs in ``--runs-dir`` (or ``$RLCTL_RUNS_DIR``, or ``./runs``)."""
    from rlctl.core.paths import RUNS_ROOT

    root = ctx.params.get("runs_dir") or os.environ.get("RLCTL_RUNS_DIR") or RUNS_ROOT
    return _starting(local_run_names(root), incomplete)


@_quiet
def cluster_names(incomplete: str) -> Suggestions:
    """Clusters rlctl has created, listed or described on this machine."""
    from rlctl.core.gcp.known import known_clusters

    return _starting(known_clusters(), incomplete)


@_quiet
def accelerators(incomplete: str) -> Suggestions:
    """Accelerator types of the catalog, e.g. v6e-16, a3-highgpu-8g."""
    from rlctl.core.config.catalog import all_types

    return [
        (a.name, f"{a.kind}, {a.chips} {a.strategy.unit}")
        for a in all_types()
        if a.name.startswith(incomplete.lower())
    ]


@_quiet
def backends(incomplete: str) -> Suggestions:
    """The registered cluster backends (jobset, pathways, ray) with their one-line help."""
    from rlctl.core.k8s import backends as registry

    return [(b.name, b.help) for b in registry.registered() if b.name.startswith(incomplete)]


def spec_keys(model: type[BaseModel]) -> list[str]:
    """Every ``--set`` key of a spec model, as ``section.field=`` (its schema, walked)."""
    from rlctl.core.config.load import _section

    out: list[str] = []

    def is_list(annotation: object) -> bool:
        import typing

        if typing.get_origin(annotation) is list:
            return True
        return any(
            is_list(a)
            for a in typing.get_args(annotation)
            if typing.get_origin(a) is not None or a is list
        )

    def walk(m: type[BaseModel], prefix: str) -> None:
        for name, field in m.model_fields.items():
            inner = _section(field.annotation)
            if isinstance(inner, type) and not is_list(field.annotation):
                walk(inner, f"{prefix}{name}.")
            else:
                out.append(f"{prefix}{name}=")

    walk(model, "")
    return out


@_quiet
def run_spec_keys(ctx: typer.Context, incomplete: str) -> Suggestions:
    """``rlctl train grpo --set mo<TAB>``: the run spec's keys (model.source=, ...)."""
    from rlctl.core.config.models import RunSpec

    return _starting(spec_keys(RunSpec), incomplete)
