"""The workload backends a cluster run can use (``rlctl train --backend``): one registry.

Each backend is one folder here (``jobset/``, ``lws/``, ``pathways/``, ``ray/``; every folder
is registered, by name) whose ``BACKEND`` implements the protocol of ``base.py``: its
template, CRD schema and controllers, the pods its controller makes (the fit check),
its phase, how its pods and leading log are found, the core templates it embeds
(validation) and the fix for a missing CRD. The registry resolves a name once, where a
run is submitted or opened (``runs/cluster.py``); below that code holds the ``Backend``
and calls it. Adding a backend is a folder (its template in it, or in ``rlctl/templates``),
its CRD schema in ``rlctl/data/crds`` (a custom resource) and a row in
tests/core/k8s/test_backend_conformance.py (docs/cluster.md, "adding one"); one from
outside the package is ``register``ed with its own ``template_dir``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from rlctl.core.errors import ConfigError
from rlctl.core.k8s.backends.base import Backend, Controller

if TYPE_CHECKING:  # pydantic: the CLI reads the registry for --help, which stays instant
    from rlctl.core.config.pools import ClusterNeeds, PoolRequest
    from rlctl.core.k8s.admission import PodGroup

__all__ = [
    "Backend",
    "Controller",
    "by_kind",
    "cluster_needs",
    "for_object",
    "get",
    "is_backend",
    "names",
    "node_pools",
    "pod_groups",
    "register",
    "registered",
    "resolve",
    "template_source",
    "unregister",
]

_REGISTRY: dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    """Add a backend; its name must be new (``unregister`` first to replace one)."""
    if backend.name in _REGISTRY:
        raise ValueError(f"backend {backend.name!r} is already registered")
    _REGISTRY[backend.name] = backend
    return backend


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def registered() -> tuple[Backend, ...]:
    """Every backend, in registration order (the built-in ones first)."""
    return tuple(_REGISTRY.values())


def names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def is_backend(name: object) -> bool:
    return isinstance(name, str) and name in _REGISTRY


def get(name: str) -> Backend:
    """The backend called ``name``: where a run is submitted or opened, once."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(
            f"--backend must be one of {', '.join(_REGISTRY)}, not {name!r}"
        ) from None


def resolve(name: object) -> Backend | None:
    """The backend a run recorded (status.json's ``backend``); None: not a cluster run
    (``local``) or one this rlctl has no backend for."""
    return _REGISTRY[name] if isinstance(name, str) and name in _REGISTRY else None


def by_kind(api_version: str, kind: str) -> Backend | None:
    return next((b for b in _REGISTRY.values() if b.workload_kind == (api_version, kind)), None)


def for_object(obj: dict[str, Any]) -> Backend | None:
    """The backend that reads ``obj``'s kind (a workload, or a kind it knows: RayCluster)."""
    kind = obj.get("kind")
    return next((b for b in _REGISTRY.values() if kind in b.object_kinds), None)


def pod_groups(
    objs: Iterable[dict[str, Any]], versions: Mapping[str, tuple[int, ...]] | None = None
) -> list[PodGroup]:
    """Every pod the run's objects become, grouped (each workload's backend says which);
    objects that make no pods (ConfigMap, ServiceAccount, ...) are skipped.

    ``versions``: backend name -> the version of its controller to model (each backend
    assumes one where it is not given: ``Backend.pod_groups``).
    """
    out: list[PodGroup] = []
    for o in objs:
        b = for_object(o)
        if b is not None and o.get("kind") == b.kind:
            out += b.pod_groups(o, (versions or {}).get(b.name))
    return out


def node_pools() -> tuple[PoolRequest, ...]:
    """The CPU pools every registered backend brings (``cluster create`` makes each once
    a cluster may run that backend: ``InfraSpec.wants_pool``)."""
    seen: dict[str, PoolRequest] = {}
    for b in _REGISTRY.values():
        for p in b.node_pools:
            seen.setdefault(p.name, p)
    return tuple(seen.values())


def cluster_needs() -> ClusterNeeds:
    """What the registered backends need of a cluster: their pools and GKE add-ons,
    handed to the cluster plan by ``runs/readiness.py`` (gcp/ knows no backend)."""
    from types import MappingProxyType

    from rlctl.core.config.pools import ClusterNeeds

    addons: dict[str, str] = {}
    for b in _REGISTRY.values():
        addons.update(b.gke_addons)
    return ClusterNeeds(pools=node_pools(), addons=MappingProxyType(addons))


def template_source(name: str) -> tuple[str, str, Callable[[], bool]] | None:
    """A template in a registered backend's ``template_dir``, as a Jinja2 loader returns
    it: (source, file name, up-to-date check). The package's own templates come first.
    Never cached: the backend may be unregistered (or the file rewritten) later."""
    for b in _REGISTRY.values():
        if b.template_dir is not None and (b.template_dir / name).is_file():
            path = b.template_dir / name
            return path.read_text(), str(path), lambda: False
    return None


def _builtin() -> list[Backend]:
    """The ``BACKEND`` of every folder here, by name: a new folder is a new backend,
    with no list to edit (its controllers install in this order too: jobset's first)."""
    import importlib
    import pkgutil

    found = []
    for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if m.ispkg:
            module = importlib.import_module(f"{__name__}.{m.name}")
            found.append(module.BACKEND)
    return found


for _b in _builtin():
    register(_b)
