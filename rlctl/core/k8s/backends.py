"""The workload backends a cluster run can use (``rlctl train --backend``): one registry.

Everything that differs between backends is one ``Backend`` entry and its
template: ``render.py`` renders ``template`` (plus ``config_files`` into the
run's ConfigMap), ``apply.py`` finds, lists and deletes the workload by its
kind, ``runs/cluster.py`` checks backend names, and ``rlctl train`` builds the
``--backend`` help from the ``help`` lines. Adding a backend is one
``register(Backend(...))`` and one template (in ``rlctl/templates``, or in
``template_dir`` for one registered from outside the package). A custom
resource also needs its CRD schema in ``rlctl/data/crds`` to pass validation;
a core kind (batch/v1 Job) needs nothing more.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rlctl.core.errors import ConfigError


@dataclass(frozen=True)
class Backend:
    """One way to run the trainer on a cluster: the workload object and how it differs."""

    name: str
    template: str  # renders the workload object; looked up in rlctl/templates, then template_dir
    api_version: str
    kind: str
    help: str  # one phrase for --backend's help
    plural: str = ""  # REST resource name; "" = kind.lower() + "s" (jobsets, rayjobs)
    tpu_only: bool = False
    # Its pod templates take the run's DRANET ResourceClaimTemplate (when the cluster has
    # DCN networks). A PathwaysJob's controller builds its worker pods itself.
    dcn_claim: bool = True
    # Extra files for the run's ConfigMap (mounted at /etc/rlctl): file name -> template.
    config_files: Mapping[str, str] = field(default_factory=dict)
    # the container whose log 'rlctl logs' shows when the run store has no train.log yet
    leader_container: str = "trainer"
    template_dir: Path | None = None

    def __post_init__(self) -> None:
        if not self.plural:
            object.__setattr__(self, "plural", f"{self.kind.lower()}s")

    @property
    def workload_kind(self) -> tuple[str, str]:
        """(apiVersion, kind) of the workload object."""
        return self.api_version, self.kind


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
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(
            f"--backend must be one of {', '.join(_REGISTRY)}, not {name!r}"
        ) from None


def by_kind(api_version: str, kind: str) -> Backend | None:
    return next((b for b in _REGISTRY.values() if b.workload_kind == (api_version, kind)), None)


def template_source(name: str) -> tuple[str, str, Callable[[], bool]] | None:
    """A template in a registered backend's ``template_dir``, as a Jinja2 loader returns
    it: (source, file name, up-to-date check). The package's own templates come first.
    Never cached: the backend may be unregistered (or the file rewritten) later."""
    for b in _REGISTRY.values():
        if b.template_dir is not None and (b.template_dir / name).is_file():
            path = b.template_dir / name
            return path.read_text(), str(path), lambda: False
    return None


register(
    Backend(
        "jobset",
        "jobset.yaml.j2",
        "jobset.x-k8s.io/v1alpha2",
        "JobSet",
        help="a JobSet, every host runs the trainer",
    )
)
register(
    Backend(
        "pathways",
        "pathways.yaml.j2",
        "pathways-job.pathways.domain/v1",
        "PathwaysJob",
        help="a PathwaysJob, one controller drives TPU slices",
        tpu_only=True,
        dcn_claim=False,
    )
)
register(
    Backend(
        "ray",
        "rayjob.yaml.j2",
        "ray.io/v1",
        "RayJob",
        help="a KubeRay RayJob, elastic over slices",
        config_files={"ray_driver.py": "ray_driver.py.j2"},
        # the driver's output, the trainer's lines with it, goes to the submitter
        # ('ray job logs --follow', KubeRay's K8sJobMode), not to the head's log
        leader_container="ray-job-submitter",
    )
)
