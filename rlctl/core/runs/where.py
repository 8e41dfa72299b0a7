"""Where a run is: on this machine (a run store it reads and trains in) or on a cluster.

The one place that decides it, for ``train`` (``locate_new``) and for ``status``,
``resume``, ``logs`` and ``delete run`` (``locate``); the CLI only maps its flags to
these calls and renders. A new run goes to a cluster only when one is named (a gs://
store alone is written from here). An existing run is on a cluster when a cluster is
named or its store is gs://, unless (``locate`` with ``run``) its status.json says it
was trained on this machine: a local run may keep its store on gs://.

Clients are built only when a cluster run first asks for them (``OnCluster.clients``),
and nothing here imports Google Cloud or Kubernetes at module level.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from rlctl.core.paths import RUNS_ROOT

if TYPE_CHECKING:  # pragma: no cover
    from rlctl.core.gcp.api import GcpClients
    from rlctl.core.runs.cluster import ClusterRef
    from rlctl.core.store.base import RunDir

ClientsFactory = Callable[[], "GcpClients"]  # the CLI's (injected in tests), made on demand


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


@dataclass
class OnCluster:
    """A run on a cluster: where it is as the user said it, and the clients to reach it."""

    ref: ClusterRef
    make_clients: ClientsFactory

    @cached_property
    def clients(self) -> GcpClients:
        return self.make_clients()


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
