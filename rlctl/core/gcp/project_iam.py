"""Project roles the cluster's nodes and the image builds run with, granted in the plan.

rlctl's node pools and Cloud Build run as the Compute Engine default service account
(``NUMBER-compute@developer.gserviceaccount.com``). On projects created since 2024
that account no longer gets the Editor role automatically (organization policy
``iam.automaticIamGrantsForDefaultServiceAccounts``), and Cloud Build uses it instead
of its legacy account (Cloud Build docs, "Cloud Build service account" changes of
2024), so on a new project nodes cannot pull the trainer image and builds cannot
push it. ``plan_grants`` reads the project's IAM policy and plans a grant of each role
the account lacks (Editor or Owner covers them all), so ``cluster create`` and
``image build`` show them before applying; re-runs see them granted and plan nothing.
Roles, as GKE and Cloud Build document them:

- nodes: ``roles/container.defaultNodeServiceAccount`` (GKE, "Use least privilege
  service accounts for your nodes") and ``roles/artifactregistry.reader`` (pull images);
- builds: ``roles/cloudbuild.builds.builder`` (run builds, write their logs, push to
  Artifact Registry, read the context from Cloud Storage).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlctl.core.errors import PermissionDeniedError
from rlctl.core.gcp.api import GcpClients
from rlctl.core.gcp.operations import call
from rlctl.core.plan import Change

KIND = "project-role"
NODE_ROLES = {
    "roles/container.defaultNodeServiceAccount": "nodes write logs and metrics",
    "roles/artifactregistry.reader": "nodes pull the trainer image",
}
BUILD_ROLES = {
    "roles/cloudbuild.builds.builder": "Cloud Build builds and pushes the trainer image",
}
COVERING = frozenset({"roles/editor", "roles/owner"})


def default_service_account(project_number: str) -> str:
    return f"serviceAccount:{project_number}-compute@developer.gserviceaccount.com"


def _policy(clients: GcpClients, project: str) -> Any:
    return call(
        clients,
        f"reading the IAM policy of project {project}",
        clients.resource_manager.get_iam_policy,
        request={"resource": f"projects/{project}"},
    )


def plan_grants(
    clients: GcpClients,
    project: str,
    member: str,
    roles: Mapping[str, str],
    after: list[str] | None = None,
) -> tuple[list[Change], list[str]]:
    """(changes, notes): a grant per role ``member`` lacks on the project, chained one
    after the other (each is a read-modify-write of one policy, guarded by its etag).
    A policy the caller may not read is a note saying what to check, not a failure."""
    try:
        policy = _policy(clients, project)
    except PermissionDeniedError:
        need = ", ".join(roles)
        return [], [f"cannot read project {project}'s IAM policy: make sure {member} has {need}"]
    have = {b.role for b in policy.bindings if member in b.members}
    covered = bool(have & COVERING)
    out: list[Change] = []
    prev = list(after or [])
    for role, why in roles.items():
        granted = covered or role in have
        c = Change(
            kind=KIND,
            name=f"{role} {member.split(':', 1)[-1]}",
            action="unchanged" if granted else "create",
            depends_on=prev,
            fields={"member": member, "role": role, "why": why},
            body={"project": project, "member": member, "role": role},
        )
        out.append(c)
        prev = [c.key]
    return out, []


def apply(clients: GcpClients, c: Change) -> None:
    """Add the member to the role's binding (the etag read makes it compare-and-swap)."""
    assert c.body is not None
    project, member, role = c.body["project"], c.body["member"], c.body["role"]
    policy = _policy(clients, project)
    for b in policy.bindings:
        if b.role == role and not b.condition.expression:
            if member not in b.members:
                b.members.append(member)
            break
    else:
        policy.bindings.add(role=role, members=[member])
    call(
        clients,
        f"granting {role} to {member} on project {project}",
        clients.resource_manager.set_iam_policy,
        request={"resource": f"projects/{project}", "policy": policy},
    )
