"""The run bucket (same region as the cluster, uniform access) and its IAM binding.

The binding grants ``roles/storage.objectUser`` on the bucket to the Workload
Identity principal of the namespace's Kubernetes service account, so pods read
and write checkpoints without keys. ``runs_bucket`` finds the bucket again by its
labels, for cluster runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlctl.core.config.infra import CLUSTER_LABEL, MANAGED_BY, RLCTL, InfraSpec
from rlctl.core.errors import AlreadyExistsError, ConfigError
from rlctl.core.gcp.api import GcpClients
from rlctl.core.gcp.operations import call
from rlctl.core.plan import Action, Change

ROLE = "roles/storage.objectUser"


def bucket_location(spec: InfraSpec) -> str:
    return (spec.bucket.location or spec.region).upper()


def runs_bucket(clients: GcpClients, project: str, cluster: str) -> str:
    """The bucket ``rlctl cluster create --bucket`` made for the cluster (by label)."""
    found = [
        b.name
        for b in call(clients, "listing buckets", clients.storage.list_buckets, project=project)
        if (b.labels or {}).get(MANAGED_BY) == RLCTL
        and (b.labels or {}).get(CLUSTER_LABEL) == cluster
    ]
    if not found:
        raise ConfigError(
            f"cluster {cluster!r} has no run bucket made by rlctl",
            hint="pass --runs-dir gs://BUCKET/runs, or create one with "
            f"'rlctl cluster create {cluster} --bucket NAME'",
        )
    return sorted(found)[0]


def _iam_change(
    spec: InfraSpec, member: str, action: Action, suffix: str = "", why: str | None = None
) -> Change:
    name = spec.bucket.name or ""
    fields = {"role": ROLE, "member": member, **({"why": why} if why else {})}
    # one bucket policy: its bindings are written one after the other (each a
    # read-modify-write guarded by the policy's etag, which a parallel write would fail)
    after = [f"iam/{name}"] if suffix else []
    return Change(
        kind="iam",
        name=name + suffix,
        action=action,
        depends_on=[f"bucket/{name}", f"cluster/{spec.cluster}", *after],
        fields=fields,
        body={"role": ROLE, "member": member, "bucket": name},
    )


def node_service_account(project_number: str) -> str:
    """The Compute Engine default service account, which rlctl's node pools run as."""
    return f"serviceAccount:{project_number}-compute@developer.gserviceaccount.com"


def plan(
    clients: GcpClients, spec: InfraSpec, project_number: str, via_nodes: Sequence[str] = ()
) -> list[Change]:
    """Bucket + binding(s), or nothing when the spec names no bucket. ``via_nodes``: why
    some pods reach the bucket as the nodes' service account (a backend whose pods run on
    the host network, outside Workload Identity: ``PoolRequest.bucket_via_nodes``), which
    is then bound too."""
    name = spec.bucket.name
    if not name:
        return []
    members: list[tuple[str, str, str | None]] = [(spec.principal(project_number), "", None)]
    if via_nodes:
        members.append((node_service_account(project_number), "/nodes", "; ".join(via_nodes)))
    bucket = call(clients, f"reading bucket {name}", clients.storage.lookup_bucket, name)
    want = {"location": bucket_location(spec), "uniform_access": True}
    if bucket is None:
        return [
            Change(
                kind="bucket",
                name=name,
                action="create",
                fields=want,
                body={**want, "labels": spec.labels},
            ),
            *(_iam_change(spec, m, "create", sfx, why) for m, sfx, why in members),
        ]
    labels = bucket.labels or {}
    if labels.get(MANAGED_BY) != RLCTL:
        raise AlreadyExistsError(
            f"bucket {name!r} exists and is not managed by rlctl",
            hint="choose another --bucket name, or add the label managed-by=rlctl to reuse it",
        )
    out = [
        Change(
            kind="bucket",
            name=name,
            action="unchanged",
            fields={
                "location": bucket.location,
                "uniform_access": bool(
                    bucket.iam_configuration.uniform_bucket_level_access_enabled
                ),
            },
        )
    ]
    policy = call(
        clients,
        f"reading IAM policy of bucket {name}",
        bucket.get_iam_policy,
        requested_policy_version=3,
    )
    for member, sfx, why in members:
        has = any(b.get("role") == ROLE and member in b.get("members", ()) for b in policy.bindings)
        out.append(_iam_change(spec, member, "unchanged" if has else "create", sfx, why))
    return out


def found(
    clients: GcpClients, cluster: str, keep_bucket: bool = False
) -> tuple[list[Change], list[str]]:
    """Buckets rlctl made for ``cluster`` (delete changes) and notes about kept ones."""
    changes: list[Change] = []
    notes: list[str] = []
    for b in call(clients, "listing buckets", clients.storage.list_buckets):
        labels = b.labels or {}
        if labels.get(MANAGED_BY) != RLCTL or labels.get(CLUSTER_LABEL) != cluster:
            continue
        if keep_bucket:
            notes.append(f"bucket {b.name} kept (--keep-bucket)")
            continue
        blobs = list(
            call(
                clients,
                f"listing objects in {b.name}",
                clients.storage.list_blobs,
                b.name,
                max_results=1,
            )
        )
        if blobs:
            notes.append(
                f"bucket {b.name} kept: it holds objects "
                f"(remove them with 'gcloud storage rm -r gs://{b.name}/**' and re-run)"
            )
            continue
        changes.append(
            Change(kind="bucket", name=b.name, action="delete", fields={"location": b.location})
        )
    return changes, notes


def apply(clients: GcpClients, c: Change) -> None:
    what = f"{c.action} {c.kind} {c.name}"
    st = clients.storage
    if c.kind == "bucket" and c.action == "create":
        b = st.bucket(c.name)
        b.labels = c.sent["labels"]
        b.iam_configuration.uniform_bucket_level_access_enabled = True
        call(clients, what, st.create_bucket, b, location=c.sent["location"])
    elif c.kind == "bucket" and c.action == "delete":
        call(clients, what, st.bucket(c.name).delete)
    elif c.kind == "iam" and c.action == "create":
        bucket = c.sent.get("bucket", c.name)
        b = st.bucket(bucket)
        policy = call(
            clients,
            f"reading IAM policy of bucket {bucket}",
            b.get_iam_policy,
            requested_policy_version=3,
        )
        policy.version = 3
        for binding in policy.bindings:
            if binding.get("role") == c.sent["role"]:
                binding["members"] = set(binding.get("members", ())) | {c.sent["member"]}
                break
        else:
            policy.bindings.append({"role": c.sent["role"], "members": {c.sent["member"]}})
        # The etag read above makes this a compare-and-swap (412 if someone else wrote).
        call(clients, what, b.set_iam_policy, policy)
    else:  # pragma: no cover - dispatch bug
        raise ValueError(f"storage.apply cannot handle {c.key}")
