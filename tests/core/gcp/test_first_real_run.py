"""What a first real run on a new project needs, checked or granted before anything runs.

A project created since 2024 gives the Compute Engine default service account no role
(organization policy iam.automaticIamGrantsForDefaultServiceAccounts), and Cloud Build
runs as that account there: nodes could not pull the trainer image and builds could not
push it. ``cluster create`` and ``image build`` plan the grants (``project_iam.py``);
APIs and accelerator quota are pre-flight lines naming the command that fixes them.
"""

from __future__ import annotations

import pytest

from rlctl.core.errors import PreflightError
from rlctl.core.gcp import cluster, image, preflight, project_iam

NODE_SA = "serviceAccount:123456789012-compute@developer.gserviceaccount.com"


@pytest.fixture
def new_project(fake):
    fake.project_iam["bindings"] = []  # no automatic Editor grant
    return fake


def _roles_of(fake, member: str) -> set[str]:
    return {b["role"] for b in fake.project_iam["bindings"] if member in b["members"]}


class TestNodeRoles:
    def test_cluster_create_grants_the_nodes_their_roles_on_a_new_project(
        self, new_project, clients, spec
    ):
        plan = cluster.plan_create(clients, spec)
        grants = [c for c in plan.changes if c.kind == project_iam.KIND]
        assert [(c.fields["role"], c.action) for c in grants] == [
            ("roles/container.defaultNodeServiceAccount", "create"),
            ("roles/artifactregistry.reader", "create"),
        ]
        assert grants[1].depends_on == [grants[0].key]  # one policy, one write at a time
        cluster.apply_plan(clients, plan)
        assert _roles_of(new_project, NODE_SA) == set(project_iam.NODE_ROLES)
        again = [
            c for c in cluster.plan_create(clients, spec).changes if c.kind == project_iam.KIND
        ]
        assert {c.action for c in again} == {"unchanged"}

    def test_editor_covers_them(self, fake, clients, spec):
        plan = cluster.plan_create(clients, spec)
        assert {c.action for c in plan.changes if c.kind == project_iam.KIND} == {"unchanged"}

    def test_an_unreadable_policy_is_a_note(self, fake, clients, spec):
        fake.fail("POST", r":getIamPolicy$", 403, "caller lacks getIamPolicy")
        plan = cluster.plan_create(clients, spec)
        assert not [c for c in plan.changes if c.kind == project_iam.KIND]
        assert any(
            "cannot read project p's IAM policy" in n and "artifactregistry.reader" in n
            for n in plan.notes
        )


class TestImageBuild:
    def test_the_build_account_gets_the_builder_role_on_a_new_project(
        self, new_project, clients, cluster_bucket
    ):
        target, ctx, plan = image.prepare(
            clients, "p", "us-central1", bucket=cluster_bucket, accelerator="tpu"
        )
        (grant,) = [c for c in plan.changes if c.kind == project_iam.KIND]
        assert grant.fields["role"] == "roles/cloudbuild.builds.builder"
        img = next(c for c in plan.changes if c.kind == "image")
        assert grant.key in img.depends_on  # granted before the build starts
        image.apply_build(clients, plan, target, ctx)
        assert "roles/cloudbuild.builds.builder" in _roles_of(new_project, NODE_SA)

    def test_a_legacy_build_account_needs_nothing(self, new_project, clients, cluster_bucket):
        new_project.project_iam["bindings"] = [
            {
                "role": "roles/cloudbuild.builds.builder",
                "members": ["serviceAccount:123456789012@cloudbuild.gserviceaccount.com"],
            }
        ]
        _, _, plan = image.prepare(
            clients, "p", "us-central1", bucket=cluster_bucket, accelerator="tpu"
        )
        assert not [c for c in plan.changes if c.kind == project_iam.KIND]

    def test_disabled_cloud_build_is_one_line(self, fake, clients, cluster_bucket):
        fake.enabled.discard("cloudbuild.googleapis.com")
        before = len(fake.mutations())
        with pytest.raises(PreflightError) as e:
            image.prepare(clients, "p", "us-central1", bucket=cluster_bucket, accelerator="tpu")
        (line,) = e.value.lines
        assert "gcloud services enable cloudbuild.googleapis.com --project p" in line
        assert len(fake.mutations()) == before


class TestQuota:
    def test_gpu_quota_short(self, fake, clients, spec):
        spec.accelerators = ["a3-highgpu-8g x2"]
        spec.dcn = {"count": 0}
        fake.quotas["us-central1"] = {"NVIDIA_H100_GPUS": (16, 8)}
        with pytest.raises(PreflightError) as e:
            cluster.plan_create(clients, spec)
        (line,) = e.value.lines
        assert "quota NVIDIA_H100_GPUS in us-central1 has 8 free" in line
        assert "need 16" in line and "--quota-id=NVIDIA_H100_GPUS" in line

    def test_spot_draws_on_the_preemptible_quota(self, fake, clients, spec):
        spec.accelerators = ["a3-highgpu-8g"]
        spec.dcn = {"count": 0}
        spec.capacity = {"kind": "spot"}
        fake.quotas["us-central1"] = {
            "NVIDIA_H100_GPUS": (0, 0),
            "PREEMPTIBLE_NVIDIA_H100_GPUS": (8, 0),
        }
        cluster.plan_create(clients, spec)  # fits the spot quota

    def test_tpu_v6e_quota_without_a_value_for_the_region_is_named_as_unchecked(
        self, fake, clients, spec
    ):
        plan = cluster.plan_create(clients, spec)
        (note,) = [n for n in plan.notes if "TPU v6e quota" in n]
        assert "('TPUs per TPU family', tpu_family=CT6E) has no value for us-central1" in note
        assert "not checked" in note

    def test_tpu_v6e_family_quota_below_the_slices_fails_naming_its_id(self, fake, clients, spec):
        """v6e's on-demand quota is Compute Engine's 'TPUs per TPU family' with
        tpu_family=CT6E, found by its documented name in Cloud Quotas; its id is the
        project's own (read, never assumed)."""
        from tests.fakes.gcp_server import quota_info

        fake.quota_infos["compute.googleapis.com"] = [
            quota_info(
                "TPUS-PER-TPU-FAMILY-per-project-region",
                "TPUs per TPU family",
                {
                    (("region", "us-central1"), ("tpu_family", "CT6E")): 16,
                    (("region", "us-central1"), ("tpu_family", "CT5P")): 4096,  # not v6e's
                    (("region", "us-east5"), ("tpu_family", "CT6E")): 4096,
                },  # not this region
                dimensions=("region", "tpu_family"),
            )
        ]
        before = len(fake.mutations())
        with pytest.raises(PreflightError) as e:
            cluster.plan_create(clients, spec)
        (line,) = e.value.lines
        assert (
            "quota 'TPUs per TPU family', tpu_family=CT6E in us-central1 is 16 TPU "
            "chips; the node pools need 32" in line
        )
        assert "--quota-id=TPUS-PER-TPU-FAMILY-per-project-region" in line
        assert "--dimensions=region=us-central1,tpu_family=CT6E" in line
        assert len(fake.mutations()) == before

    def test_tpu_v5p_quota_that_fits_is_a_note_with_its_limit(self, fake, clients, spec):
        from tests.fakes.gcp_server import quota_info

        spec.accelerators = ["v5p-128"]
        fake.default_tpu_types = [*fake.default_tpu_types, "v5p-128"]
        fake.quota_infos["compute.googleapis.com"] = [
            quota_info(
                "TPU-V5P-per-project-region", "TPU v5p chips", {(("region", "us-central1"),): 64}
            )
        ]
        plan = cluster.plan_create(clients, spec)
        assert any(
            "TPU v5p quota in us-central1: limit 64 chips, 64 asked" in n for n in plan.notes
        )

    def test_spot_tpu_quota_is_named_as_unchecked(self, fake, clients, spec):
        spec.capacity = {"kind": "spot"}
        plan = cluster.plan_create(clients, spec)
        assert any("TPU v6e spot capacity: its quota is not checked" in n for n in plan.notes)

    def test_the_pathways_heads_n2_vcpus(self, fake, clients, spec):
        """The Pathways pool's one n2-standard-64 is made when a Pathways run asks: 64 N2
        vCPUs of regional quota, or the head stays Pending while the slices wait."""
        from rlctl.core.k8s import backends

        fake.quotas["us-central1"] = {"N2_CPUS": (24, 0)}
        with pytest.raises(PreflightError) as e:
            cluster.plan_create(clients, spec, backends.cluster_needs())
        (line,) = e.value.lines
        assert "quota N2_CPUS in us-central1 has 24 free" in line
        assert "the node pool for Pathways heads (--backend pathways) needs 64" in line
        assert "'--set pools.pathways=false'" in line
        spec.pools = {"pathways": False}
        cluster.plan_create(clients, spec, backends.cluster_needs())  # no pool, no N2 vCPUs

    def test_v5e_quota(self, fake, clients, spec):
        spec.accelerators = ["v5litepod-16 x2"]
        spec.dcn = {"count": 0}
        fake.quotas["us-central1"] = {"TPU_LITE_PODSLICE_V5": (16, 0)}
        with pytest.raises(PreflightError, match="TPU_LITE_PODSLICE_V5 .* need 32"):
            cluster.plan_create(clients, spec)


def test_train_apis(fake, clients):
    fake.enabled.discard("storage.googleapis.com")
    with pytest.raises(PreflightError) as e:
        preflight.require_apis(clients, "p", preflight.TRAIN_APIS)
    (line,) = e.value.lines
    assert "storage.googleapis.com is not enabled" in line


def test_an_endpoint_nobody_answers_on_fails_at_once_naming_it():
    """A connection refused (no server on the port, an override pointing nowhere) is
    not a transient error: it was retried for the whole retry deadline (minutes of
    silence), then called 'Google Cloud may be degraded'."""
    import socket
    import time

    from rlctl.core.clients import Clients
    from rlctl.core.config.infra import build_infra_spec
    from rlctl.core.errors import CloudError
    from rlctl.core.gcp import network

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free again once closed: nobody listens there
    clients = Clients.local(f"http://127.0.0.1:{port}", retry_deadline=300)
    spec = build_infra_spec(
        flags={
            "project": "p",
            "region": "us-central1",
            "cluster": "rl",
            "accelerators": ["v6e-16 x2"],
            "dcn": {"count": 1},
        },
        env={},
    )
    t0 = time.monotonic()
    with pytest.raises(CloudError) as e:
        network.plan(clients, spec)
    assert time.monotonic() - t0 < 10
    assert e.value.message.startswith(f"cannot reach 127.0.0.1:{port} (connection refused)")
    assert "RLCTL_API_ENDPOINT_OVERRIDES_" in e.value.hint
