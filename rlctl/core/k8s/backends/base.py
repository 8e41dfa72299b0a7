"""The one protocol every workload backend implements, and what they share.

A backend is everything rlctl must know about one kind of workload object (JobSet,
PathwaysJob, RayJob, ...): which template renders it, which CRD schema validates it
and which controller serves it, the pods its controller makes of it (the fit check,
``admission.py``), how its status reads as a phase, how its pods are found and whose
log is the run's, which core templates it embeds (validation), and what to run when
its CRD is missing (the pre-submit readiness check). The registry
(``backends/__init__.py``) resolves a name to a ``Backend`` once, where a run is
submitted or opened; below that, code calls the object's methods and never compares
a backend's name (tests/core/k8s/test_backend_names.py keeps it so).

The methods are abstract on purpose: a backend that registers without saying which
pods it makes would make the fit check see none and pass silently.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # both import pydantic: the CLI reads the registry for --help
    from rlctl.core.config.pools import PoolRequest
    from rlctl.core.k8s.admission import PodGroup
    from rlctl.core.k8s.shapes import SliceShape
    from rlctl.core.phases import Phase

RUN_LABEL = "rlctl.dev/run"


class View(Protocol):
    """What a backend's hooks read of the run's ``render.WorkloadView`` (a protocol:
    ``render.py`` imports the registry, so the registry cannot import it)."""

    @property
    def run(self) -> str: ...

    @property
    def shape(self) -> SliceShape: ...


def run_selector(run: str) -> str:
    """The label selector of the objects and pods rlctl labels as the run's."""
    return f"managed-by=rlctl,{RUN_LABEL}={run}"


def condition_phase(workload: dict[str, Any]) -> tuple[Phase | None, str | None]:
    """(phase, message) from ``status.conditions`` as a JobSet or batch/v1 Job writes
    them; phase None while not finished (its pods say whether it runs)."""
    from rlctl.core.phases import Phase

    conds = (workload.get("status") or {}).get("conditions") or []
    true = {c.get("type"): c for c in conds if c.get("status") == "True"}
    if "Completed" in true:
        return Phase.COMPLETED, None
    if "Failed" in true:
        c = true["Failed"]
        return Phase.FAILED, c.get("message") or c.get("reason")
    if "Suspended" in true:
        return Phase.SUSPENDED, None
    return None, None


def pod_template(path: str, template: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """An embedded pod template as a core PodTemplate object ``kubernetes-validate`` checks."""
    return path, {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": "embedded"},
        "template": template,
    }


@dataclass(frozen=True)
class Controller:
    """One controller rlctl installs (``rlctl cluster create``): its pinned manifest and
    the CRDs it serves. The backends that need it name it (``Backend.controllers``)."""

    name: str
    version: str
    manifest: str  # file name in rlctl/data/controllers
    crds: tuple[str, ...]  # CRD names (plural.group) its workloads need
    title: str  # for people: "JobSet controller"
    after: tuple[str, ...] = ()  # controllers installed before it (whose kinds it makes)


class Backend(ABC):
    """One way to run the trainer on a cluster: its workload object and everything
    about it that differs from the other backends. Subclasses set the class attributes
    and implement every abstract method; ``register`` takes an instance."""

    name: str
    template: str  # renders the workload object; looked up in rlctl/templates, then template_dir
    api_version: str
    kind: str
    help: str  # one phrase for --backend's help
    # its CRD's schema in rlctl/data/crds (validation); None: a core kind (batch/v1 Job)
    crd_schema: str | None = None
    # the controllers rlctl installs for it, in install order; () for a core kind or a
    # GKE add-on (then ``crd_fix`` says how to turn it on)
    controllers: tuple[Controller, ...] = ()
    tpu_only: bool = False
    # One process drives every host (Pathways' single controller), so what runs in one
    # process (rollout.placement=split) may span hosts.
    single_controller: bool = False
    # Kueue has an integration for its kind (pkg/controller/jobs/): --queue and
    # --priority put it in a LocalQueue
    queueable: bool = True
    # It renders a pipelined run's generator pods of their own (rollout.placement=process,
    # WorkloadView.generator): one host beside the learner's, running
    # ``python -m rlctl.core.trainer.run.generate --pod`` (a pod's command, a Ray task)
    generator_group: bool = False
    # Its workload object ends when the trainer does; False (a LeaderWorkerSet): it keeps
    # its pods, and status says to delete the run once it is over
    finishes: bool = True
    # Its pod templates take the run's DRANET ResourceClaimTemplate (when the cluster has
    # DCN networks). A PathwaysJob's controller builds its worker pods itself.
    dcn_claim: bool = True
    # The CPU pools its pods need beside the accelerator pools (the Pathways head's):
    # 'cluster create' makes them, the quota check counts them, the fit check places on them.
    node_pools: tuple[PoolRequest, ...] = ()
    # GKE add-ons that serve its kind (addons_config field -> the add-on's gcloud name):
    # 'cluster create' enables them with the cluster
    gke_addons: Mapping[str, str] = MappingProxyType({})
    # Extra files for the run's ConfigMap (mounted at /etc/rlctl): file name -> template.
    config_files: Mapping[str, str] = MappingProxyType({})
    # the container whose log 'rlctl logs' shows when the run store has no train.log yet
    leader_container: str = "trainer"
    # where its template is when not in rlctl/templates: its own folder
    # (``Path(__file__).parent``; package data) or, registered from outside, any
    template_dir: Path | None = None

    @property
    def plural(self) -> str:
        """REST resource name (jobsets, rayjobs)."""
        return f"{self.kind.lower()}s"

    @property
    def workload_kind(self) -> tuple[str, str]:
        """(apiVersion, kind) of the workload object."""
        return self.api_version, self.kind

    @property
    def object_kinds(self) -> tuple[str, ...]:
        """The kinds this backend knows how to read (its workload's first)."""
        return (self.kind,)

    @property
    def crd(self) -> str | None:
        """The CRD its workload kind needs (``jobsets.jobset.x-k8s.io``); None: core kind."""
        if self.crd_schema is None:
            return None
        return f"{self.plural}.{self.api_version.split('/')[0]}"

    def __repr__(self) -> str:
        return f"<backend {self.name}: {self.api_version} {self.kind}>"

    # --- the protocol ----------------------------------------------------------------
    @abstractmethod
    def pod_groups(
        self, obj: dict[str, Any], controller_version: tuple[int, ...] | None = None
    ) -> list[PodGroup]:
        """Every pod its controller makes of ``obj``, as admitted (the fit check).
        ``controller_version``: the version of its controller to model where what that
        makes differs by version (KubeRay's probes); None: the one the backend assumes."""

    @abstractmethod
    def phase(self, workload: dict[str, Any]) -> tuple[Phase | None, str | None]:
        """(phase, message) from the object's status alone; phase None when it is not
        finished and its status does not say it runs (its pods do)."""

    @abstractmethod
    def pod_selectors(self, run: str) -> tuple[str, ...]:
        """The label selectors that together find every pod of the run."""

    @abstractmethod
    def embedded_templates(self, obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        """(path, core object) for each pod/Job template embedded in ``obj``, which
        ``validate.py`` checks strictly beside the CRD schema."""

    def view_fields(self, view: View) -> Mapping[str, Any]:
        """What its templates read beside the shared view, as ``b.NAME`` (Ray's version,
        the Pathways head's pool and resources): data from the view, the catalog and the
        image pins, never a cloud call. The shared view (``render.py``) holds nothing
        that only one backend reads."""
        return MappingProxyType({})

    def pulled_images(self, shape: SliceShape) -> Mapping[str, str]:
        """The images its controller pulls beside rlctl's own (reference -> what it is),
        which the pre-flight looks up in their registry: a tag no one publishes fails
        every pod's pull after the slices were paid for."""
        return MappingProxyType({})

    def misfit_hint(self, role: str, reason: str, create: str, accelerator: str) -> str | None:
        """The fix for one of its pod groups (``role``) that would stay Pending for
        ``reason`` (``k8s/fit.py``'s), where the shared hints (``runs/placement.py``: an
        accelerator host's --cpu/--memory, a pool to add) would be wrong; ``create`` is
        this cluster's 'rlctl cluster create' command. None: the shared hint."""
        return None

    def crd_fix(self, cluster: str, where: str) -> str:
        """Why its CRD is missing and the command that fixes it (a readiness line's
        end); this default names the controller of ``controllers`` that serves it."""
        c = next((c for c in self.controllers if self.crd in c.crds), None)
        if c is None:
            return "(nothing rlctl installs serves it): install its controller"
        return (
            f"({c.title} {c.version} is not installed): run 'rlctl cluster create "
            f"{cluster}{where}', which installs it"
        )
