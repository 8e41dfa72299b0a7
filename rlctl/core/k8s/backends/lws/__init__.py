"""A LeaderWorkerSet: one group of pods per TPU slice (a leader and its workers), or one
group of every GPU host; every pod runs the trainer.

What its controller makes of it follows kubernetes-sigs/lws v0.10.0 (the newest tag,
2161f38f): the leader StatefulSet ``RUN`` of ``spec.replicas`` pods ``RUN-G`` from
``leaderTemplate`` or, absent, ``workerTemplate``
(``pkg/controllers/leaderworkerset_controller.go``
``constructLeaderStatefulSetApplyConfiguration``), and per group a worker StatefulSet of
``size - 1`` pods ``RUN-G-W`` from ``workerTemplate``, created only when ``size > 1``
(``pkg/controllers/pod_controller.go`` ``Reconcile``,
``constructWorkerStatefulSetApplyConfiguration``). With the
``leaderworkerset.sigs.k8s.io/exclusive-topology`` annotation the leader gets a required
affinity to its own group and an anti-affinity to the others on that key
(``pkg/webhooks/pod_webhook.go`` ``SetExclusiveAffinities``) and the workers a node
selector of the leader's domain (``setNodeSelectorForWorkerPods``): one group per node
pool, as JobSet's exclusive placement. The controller injects ``LWS_LEADER_ADDRESS``,
``LWS_GROUP_SIZE`` and ``LWS_WORKER_INDEX`` into every container, and the TPU worker
variables into pods that request TPUs (``pkg/utils/pod/pod_utils.go``
``AddLWSVariables``, ``pkg/utils/accelerators/tpu.go``).

An LWS never ends: its only conditions are Available, Progressing and UpdateInProgress
(``api/leaderworkerset/v1/leaderworkerset_types.go``), and a StatefulSet's pods restart
always. So the template's trainer idles once the run is over (done, or an error a restart
cannot fix), and the run's phase is its run store's; ``rlctl delete run`` frees the nodes.
rlctl installs no LWS controller: no release manifest can be vendored here (it is a
release artifact, ``make artifacts``), so a cluster without the CRD is told the upstream
install command.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlctl.core.k8s.backends.base import Backend, pod_template, run_selector

if TYPE_CHECKING:  # pydantic, imported where used: the CLI reads the registry for --help
    from rlctl.core.k8s.admission import PodGroup
    from rlctl.core.phases import Phase

LWS_VERSION = "v0.10.0"
EXCLUSIVE_KEY = "leaderworkerset.sigs.k8s.io/exclusive-topology"
INSTALL = (
    "kubectl apply --server-side -f https://github.com/kubernetes-sigs/lws/releases/"
    f"download/{LWS_VERSION}/manifests.yaml"
)


def _templates(obj: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    lwt = (obj.get("spec") or {}).get("leaderWorkerTemplate") or {}
    return lwt.get("leaderTemplate"), lwt.get("workerTemplate") or {}


class LeaderWorkerSetBackend(Backend):
    name = "lws"
    template = "lws.yaml.j2"
    template_dir = Path(__file__).parent
    api_version = "leaderworkerset.x-k8s.io/v1"
    kind = "LeaderWorkerSet"
    help = "a LeaderWorkerSet, a leader and workers per slice, no controller installed"
    crd_schema = "leaderworkerset-leaderworkerset.x-k8s.io-v1.json"
    finishes = False  # no terminal condition; its pods idle once the run is over

    def pod_groups(
        self, obj: dict[str, Any], controller_version: tuple[int, ...] | None = None
    ) -> list[PodGroup]:
        """``replicas`` groups of ``size`` pods (the CRD's defaults: 1 and 1); a distinct
        leader template makes the leaders a group of their own."""
        from rlctl.core.k8s.admission import group

        spec = obj.get("spec") or {}
        name = obj["metadata"]["name"]
        replicas = int(spec.get("replicas", 1))
        size = int((spec.get("leaderWorkerTemplate") or {}).get("size", 1))
        pinned = ((obj.get("metadata") or {}).get("annotations") or {}).get(EXCLUSIVE_KEY)
        leader, worker = _templates(obj)
        if leader is None or size == 1:
            pod = leader if size == 1 and leader is not None else worker
            return [
                group(
                    f"{self.kind} {name}",
                    "trainer",
                    pod.get("metadata") or {},
                    pod.get("spec") or {},
                    jobs=replicas,
                    pods=size,
                    pinned=pinned,
                )
            ]
        return [
            group(
                f"{self.kind} {name}, {role}s",
                f"lws-{role}",
                t.get("metadata") or {},
                t.get("spec") or {},
                jobs=replicas,
                pods=n,
                pinned=pinned,
            )
            for role, t, n in (("leader", leader, 1), ("worker", worker, size - 1))
        ]

    def phase(self, workload: dict[str, Any]) -> tuple[Phase | None, str | None]:
        """Never finished by its status (no such condition): its pods say it runs."""
        return None, None

    def pod_selectors(self, run: str) -> tuple[str, ...]:
        return (run_selector(run),)  # both StatefulSets copy the template's labels

    def embedded_templates(self, obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        leader, worker = _templates(obj)
        if leader is not None:
            yield pod_template("spec.leaderWorkerTemplate.leaderTemplate", leader)
        yield pod_template("spec.leaderWorkerTemplate.workerTemplate", worker)

    def crd_fix(self, cluster: str, where: str) -> str:
        return (
            f"(rlctl does not install the LeaderWorkerSet controller): run 'gcloud container "
            f"clusters get-credentials {cluster}{where}', then '{INSTALL}' (LWS {LWS_VERSION})"
        )


BACKEND = LeaderWorkerSetBackend()
