"""Where a run is: on this machine (a run store it reads and trains in) or on a cluster.

The one place that decides it, for ``train`` (``locate_new``) and for ``status``,
``resume``, ``logs`` and ``delete run`` (``locate``); the CLI only maps its flags to
these calls and renders. A new run goes to a cluster only when one is named (a gs://
store alone is written from here). An existing run is on a cluster when a cluster is
named or its store is gs://, unless (``locate`` with ``run``) its status.json says it
was trained on this machine: a local run may keep its store on gs://.

Both places answer one interface (``Place``): list and describe runs, tail and
follow a run's log, resume it, plan its deletion. The CLI maps its flags to
``locate`` and renders what these return; it never asks which place it holds (a
local resume trains in this process, so it shows progress: ``trains_here``).

Clients are built only when a cluster run first asks for them (``OnCluster.clients``),
and nothing here imports Google Cloud or Kubernetes at module level.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

from rlctl.core.paths import RUNS_ROOT
from rlctl.core.runs.results import LogTail
from rlctl.core.store.base import LOG

if TYPE_CHECKING:  # pragma: no cover
    from rlctl.core.gcp.api import GcpClients
    from rlctl.core.plan import Plan
    from rlctl.core.runs.cluster import ClusterRef
    from rlctl.core.runs.results import RunInfo
    from rlctl.core.store.base import RunDir

ClientsFactory = Callable[[], "GcpClients"]  # the CLI's (injected in tests), made on demand


@dataclass
class Following:
    """A followed log: a note for stderr first (or None), its lines as they come, then
    (``end``) the line that says why it ended."""

    note: str | None
    lines: Iterator[str]
    end: Callable[[], str]


@dataclass
class Deletion:
    """What ``delete run`` removes (``plan``, shown first), how (``apply``, given the
    progress callback: the result's JSON) and the line that says it was done."""

    plan: Plan
    apply: Callable[[Any], Any]
    done: str


class Place(Protocol):
    """What ``status``, ``logs``, ``resume`` and ``delete run`` ask of where a run is."""

    trains_here: bool  # a resume trains in this process (the CLI shows its progress)

    def runs(self) -> tuple[str, list[RunInfo]]:
        """(the store's URI, its runs)."""
        ...

    def describe(self, name: str) -> RunInfo:
        """One run as ``status`` shows it, with its learning curve."""
        ...

    def tail(self, name: str, n: int, log: str = LOG) -> tuple[LogTail, str | None]:
        """(the last ``n`` lines of the run's log, a note for stderr or None). ``log``:
        train.log, or the generator's (``generator.log``)."""
        ...

    def follow(self, name: str, n: int, interval: float, log: str = LOG) -> Following:
        """The last ``n`` lines, then each new one until the run has ended."""
        ...

    def resume(
        self,
        name: str,
        *,
        image: str | None,
        recover: bool,
        steps: int | None,
        progress: Any = None,
    ) -> Any:
        """Continue the run from its latest complete checkpoint: the attempt's
        ``TrainResult`` where it trains here, else the re-submission's
        ``ResumeResult``."""
        ...

    def plan_delete(self, name: str, purge: bool) -> Deletion:
        """What deleting the run removes, and how."""
        ...


@dataclass
class Local:
    """A run on this machine. ``root``: its run store (a folder, or a gs:// store a run
    trained here writes to); None only for ``train``, where the spec's ``output.root``
    decides. ``run``: the run, when ``locate`` already opened it to ask where it was
    trained (a gs:// store; ``logs`` reads it there)."""

    root: str | None
    run: RunDir | None = None

    @property
    def known_root(self) -> str:
        """``root`` for a command on an existing run (``locate`` always sets it)."""
        if self.root is None:
            raise ValueError("no run store given: only train's spec decides its own")
        return self.root

    trains_here = True

    def _run(self, name: str) -> RunDir:
        from rlctl.core.store import open_store

        return self.run or open_store(self.known_root).existing(name)

    def runs(self) -> tuple[str, list[RunInfo]]:
        from rlctl.core.runs.status import list_runs
        from rlctl.core.store import open_store

        store = open_store(self.known_root)
        return store.uri, list_runs(store)

    def describe(self, name: str) -> RunInfo:
        from rlctl.core.runs.status import describe_run
        from rlctl.core.store import open_store

        return describe_run(open_store(self.known_root).existing(name), curve=True)

    def tail(self, name: str, n: int, log: str = LOG) -> tuple[LogTail, str | None]:
        from rlctl.core.runs.run_log import read_log, tail_lines

        run = self._run(name)
        text = read_log(run, log)
        tail = LogTail(run=run.name, log=f"{run.uri}/{log}", lines=tail_lines(text or "", n))
        return tail, None if text is not None else _no_log(run, log)

    def follow(self, name: str, n: int, interval: float, log: str = LOG) -> Following:
        from rlctl.core.runs.run_log import follow_log, read_log
        from rlctl.core.runs.status import run_phase

        run = self._run(name)
        return Following(
            None if read_log(run, log) is not None else _no_log(run, log),
            follow_log(run, n, interval, log=log),
            lambda: f"run {run.name} is {run_phase(run)}: its log ends here",
        )

    def resume(
        self,
        name: str,
        *,
        image: str | None,
        recover: bool,
        steps: int | None,
        progress: Any = None,
    ) -> Any:
        from rlctl.core.runs.local import resume_local

        return resume_local(self.known_root, name, progress=progress, recover=recover, steps=steps)

    def plan_delete(self, name: str, purge: bool) -> Deletion:
        """The run's whole folder (``purge`` changes nothing: it is all of it)."""
        from rlctl.core.runs.local_delete import delete_local, plan_delete_local

        root = self.known_root
        plan = plan_delete_local(root, name)
        return Deletion(
            plan,
            lambda ev: delete_local(root, plan, ev).model_dump(mode="json"),
            f"deleted run {name} ({plan.changes[-1].fields['path']})",
        )


def _no_log(run: RunDir, log: str = LOG) -> str:
    """What ``logs`` says of a run that has no train.log (trained before rlctl kept one),
    or no generator.log (its generator has not started, or it has none)."""
    if log != LOG:
        return (
            f"run {run.name} has no {log}: only a run with rollout.placement=process has "
            "a generator of its own, and it writes one once it starts"
        )
    return (
        f"run {run.name} has no {LOG} yet: a run trained before rlctl kept one "
        f"shows its steps in 'rlctl status {run.name}'"
    )


@dataclass
class OnCluster:
    """A run on a cluster: where it is as the user said it, and the clients to reach it."""

    ref: ClusterRef
    make_clients: ClientsFactory

    @cached_property
    def clients(self) -> GcpClients:
        return self.make_clients()

    trains_here = False

    def runs(self) -> tuple[str, list[RunInfo]]:
        from rlctl.core.runs import cluster as core

        return core.list_store(self.clients, self.ref)

    def describe(self, name: str) -> RunInfo:
        from rlctl.core.runs import cluster as core

        return core.describe(self.clients, self.ref, name, curve=True)

    def tail(self, name: str, n: int, log: str = LOG) -> tuple[LogTail, str | None]:
        from rlctl.core.runs import cluster as core

        got = core.logs(self.clients, self.ref, name, n, log=log)
        return got, got.source

    def follow(self, name: str, n: int, interval: float, log: str = LOG) -> Following:
        from rlctl.core.runs import cluster as core

        return Following(
            None,
            core.follow_logs(self.clients, self.ref, name, n, interval, log=log),
            lambda: "the run's workload has ended",
        )

    def resume(
        self,
        name: str,
        *,
        image: str | None,
        recover: bool,
        steps: int | None,
        progress: Any = None,
    ) -> Any:
        """Re-submitted with its recorded backend, image and accelerator (``image``
        overrides); ``recover`` and ``steps`` are a local run's."""
        from rlctl.core.runs import cluster as core

        if recover or steps is not None:
            from rlctl.core.errors import ConfigError

            flag = "--recover" if recover else "--steps"
            raise ConfigError(
                f"{flag} is for a run trained on this machine",
                hint="copy the run's folder here, resume it, then copy it back",
            )
        return core.resume(
            self.clients,
            self.ref,
            name,
            hf_token=core.hf_token_from_env(),
            image=image,
            on_progress=progress,
        )

    def plan_delete(self, name: str, purge: bool) -> Deletion:
        """The run's rlctl-labelled objects (``purge``: and its files in the store)."""
        from rlctl.core.runs import cluster as core

        clients, ref = self.clients, self.ref
        plan = core.plan_delete(clients, ref, name, purge)
        n = len(plan.pending())
        return Deletion(
            plan,
            lambda ev: core.delete(clients, ref, plan, ev).model_dump(mode="json"),
            f"deleted {n} item{'s' if n != 1 else ''} of run {name}",
        )


Where = Local | OnCluster


def _cluster_ref(
    cluster: str | None,
    project: str | None,
    region: str | None,
    runs_dir: str | None,
    accelerator: str | None = None,
) -> ClusterRef:
    from rlctl.core.runs.cluster import ClusterRef

    return ClusterRef(
        cluster=cluster, project=project, region=region, runs_dir=runs_dir, accelerator=accelerator
    )


def locate_new(
    runs_dir: str | None,
    cluster: str | None,
    project: str | None,
    region: str | None,
    accelerator: str | None,
    clients: ClientsFactory,
) -> Where:
    """Where ``train`` runs a new run: on ``cluster`` (its store ``runs_dir``, else the
    cluster's bucket), else here, writing to ``runs_dir`` (or the spec's output.root)."""
    if not cluster:
        return Local(runs_dir)
    return OnCluster(_cluster_ref(cluster, project, region, runs_dir, accelerator), clients)


def locate(
    runs_dir: str | None,
    cluster: str | None,
    project: str | None,
    region: str | None,
    clients: ClientsFactory,
    run: str | None = None,
) -> Where:
    """Where an existing run (or, ``run`` None, the runs of a store) is.

    With ``run`` (``resume``, ``logs``), a cluster store's run is first opened: one
    trained on this machine (its status.json names no cluster backend) is ``Local``,
    resumed here from ``runs_dir`` (or ./runs) and read in place. ``status`` and
    ``delete run`` do not ask: the cluster side handles a local run in its store.
    """
    if not (cluster or (runs_dir or "").startswith("gs://")):
        return Local(runs_dir or RUNS_ROOT)
    where = OnCluster(_cluster_ref(cluster, project, region, runs_dir), clients)
    if run is None:
        return where
    from rlctl.core.runs.cluster import is_cluster_run, open_run

    opened = open_run(where.clients, where.ref, run, connect=False)
    if is_cluster_run(opened.status):
        return where
    return Local(runs_dir or RUNS_ROOT, run=opened.run)
