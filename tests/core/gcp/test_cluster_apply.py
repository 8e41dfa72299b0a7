"""cluster create/delete against the wire-level fake, with the real client libraries."""

from __future__ import annotations

import json

import pytest

from rlctl.core.errors import PermissionDeniedError, QuotaExceededError
from rlctl.core.gcp import cluster
from rlctl.core.k8s import backends

# the backends' CPU pools, as runs/readiness.py hands them to the plan (Pathways' head)
POOLS = backends.cluster_needs()


def create(clients, spec, events=None):
    plan = cluster.plan_create(clients, spec, POOLS)
    return plan, cluster.apply_plan(clients, plan, events)


def _typed(cls, body):
    return cls.from_json(json.dumps(body), ignore_unknown_fields=False)


class TestCreateRequests:
    def test_two_slice_v6e16_with_dcn_sends_what_the_seeds_ask_for(self, fake, clients, spec):
        from google.cloud import compute_v1, container_v1

        create(clients, spec)
        muts = fake.mutations()
        # networks: custom subnet mode, MTU 8896 (gcloud compute networks create --mtu=8896
        # --subnet-mode=custom --bgp-routing-mode=regional)
        nets = [r for r in muts if r.path.endswith("/global/networks")]
        assert sorted(r.body["name"] for r in nets) == ["rl-dcn-0", "rl-dcn-1"]
        for r in nets:
            n = _typed(compute_v1.Network, r.body)
            assert n.mtu == 8896 and n.auto_create_subnetworks is False
            assert n.routing_config.routing_mode == "REGIONAL"
            assert "managed-by=rlctl" in n.description
            assert r.query.get("requestId")
        # subnets in the region: 10.50.0.0/16 and 10.60.0.0/16
        subs = {
            r.body["name"]: r.body
            for r in muts
            if r.path.endswith("/regions/us-central1/subnetworks")
        }
        assert subs["rl-dcn-0-sub"]["ipCidrRange"] == "10.50.0.0/16"
        assert subs["rl-dcn-1-sub"]["ipCidrRange"] == "10.60.0.0/16"
        assert subs["rl-dcn-0-sub"]["network"].endswith("/global/networks/rl-dcn-0")
        # firewall: traffic inside each network
        fws = {r.body["name"]: r.body for r in muts if r.path.endswith("/global/firewalls")}
        assert fws["rl-dcn-1-internal"]["sourceRanges"] == ["10.60.0.0/16"]
        assert {a["IPProtocol"] for a in fws["rl-dcn-1-internal"]["allowed"]} == {
            "tcp",
            "udp",
            "icmp",
        }
        # cluster: Ray operator, GCS FUSE CSI, dataplane v2, Workload Identity, multi-networking
        (creq,) = [r for r in muts if r.path == "/v1/projects/p/locations/us-central1/clusters"]
        c = _typed(container_v1.Cluster, creq.body["cluster"])
        assert c.name == "rl"
        assert c.addons_config.ray_operator_config.enabled
        assert c.addons_config.gcs_fuse_csi_driver_config.enabled
        assert c.network_config.datapath_provider == container_v1.DatapathProvider.ADVANCED_DATAPATH
        assert c.network_config.enable_multi_networking
        assert c.ip_allocation_policy.use_ip_aliases
        assert c.workload_identity_config.workload_pool == "p.svc.id.goog"
        assert c.release_channel.channel == container_v1.ReleaseChannel.Channel.RAPID
        assert dict(c.resource_labels) == {
            "managed-by": "rlctl",
            "rlctl-cluster": "rl",
            "rlctl-namespace": "train",
            "rlctl-ksa": "trainer",
        }
        assert [p.name for p in c.node_pools] == ["cpu"]  # the CPU default pool
        assert c.node_pools[0].config.machine_type == "e2-standard-8"
        # one TPU pool per slice: ct6e-standard-4t, 4x4, 4 nodes, gVNIC, 2 networks, DRANET
        preqs = [r for r in muts if r.path.endswith("/clusters/rl/nodePools")]
        pools = {
            p.name: p for p in (_typed(container_v1.NodePool, r.body["nodePool"]) for r in preqs)
        }
        assert sorted(pools) == ["pathways", "v6e-16-0", "v6e-16-1"]
        # the Pathways heads' pool (issue 24 point 4): XPK's cpu-np machine, tainted for
        # the heads alone, empty until one asks (autoscaled 0..1)
        pw = pools.pop("pathways")
        assert pw.config.machine_type == "n2-standard-64" and pw.initial_node_count == 0
        assert (
            pw.autoscaling.enabled,
            pw.autoscaling.min_node_count,
            pw.autoscaling.max_node_count,
        ) == (True, 0, 1)
        assert [(t.key, t.value, t.effect.name) for t in pw.config.taints] == [
            ("rlctl.dev/pool", "pathways", "NO_SCHEDULE")
        ]
        for p in pools.values():
            assert p.config.machine_type == "ct6e-standard-4t"
            assert p.placement_policy.tpu_topology == "4x4"
            assert p.placement_policy.type_ == container_v1.NodePool.PlacementPolicy.Type.COMPACT
            assert p.initial_node_count == 4
            assert list(p.locations) == ["us-central1-b"]
            assert p.config.gvnic.enabled
            assert dict(p.config.labels) == {"cloud.google.com/gke-networking-dra-driver": "true"}
            assert [
                (n.network, n.subnetwork) for n in p.network_config.additional_node_network_configs
            ] == [("rl-dcn-0", "rl-dcn-0-sub"), ("rl-dcn-1", "rl-dcn-1-sub")]
            assert p.config.resource_labels["managed-by"] == "rlctl"
            assert not p.config.spot
            # the seeds' --threads-per-core=1 and cloud-platform scope
            assert p.config.advanced_machine_features.threads_per_core == 1
            assert list(p.config.oauth_scopes) == ["https://www.googleapis.com/auth/cloud-platform"]
        # bucket in the region, uniform access, labelled; objectUser for the KSA principal
        (breq,) = [r for r in muts if r.method == "POST" and r.path == "/storage/v1/b"]
        assert breq.body["location"] == "US-CENTRAL1"
        assert breq.body["iamConfiguration"]["uniformBucketLevelAccess"]["enabled"] is True
        assert breq.body["labels"]["managed-by"] == "rlctl"
        # the KSA's Workload Identity principal, then (one write after the other) the
        # nodes' account: Pathways pods run on the host network, outside Workload Identity
        (iam, iam_nodes) = [r for r in muts if r.method == "PUT" and r.path.endswith("/iam")]
        ksa = (
            "principal://iam.googleapis.com/projects/123456789012/locations/global/"
            "workloadIdentityPools/p.svc.id.goog/subject/ns/train/sa/trainer"
        )
        assert iam.body["bindings"] == [{"role": "roles/storage.objectUser", "members": [ksa]}]
        (b,) = iam_nodes.body["bindings"]
        assert sorted(b["members"]) == [
            ksa,
            "serviceAccount:123456789012-compute@developer.gserviceaccount.com",
        ]
        assert len(muts) == 2 + 2 + 2 + 1 + 3 + 1 + 2

    def test_order_follows_dependencies(self, fake, clients, spec):
        create(clients, spec)
        paths = [r.path for r in fake.mutations()]
        first_pool = next(i for i, p in enumerate(paths) if p.endswith("/nodePools"))
        cl = paths.index("/v1/projects/p/locations/us-central1/clusters")
        assert max(i for i, p in enumerate(paths) if "subnetworks" in p) < cl < first_pool

    def test_operations_go_pending_running_done(self, fake, clients, spec):
        events = []
        create(clients, spec, lambda k, s, i: events.append((k, s, i)))
        polls = [i for k, s, i in events if k == "cluster/rl" and s == "poll"]
        assert polls == ["PENDING", "RUNNING", "DONE"]
        assert all(op.state == "DONE" for op in fake.ops.values())

    def test_spot_and_reservation(self, fake, clients, spec):
        from google.cloud import container_v1

        spec.capacity = {"kind": "reservation", "reservation": "my-res"}
        create(clients, spec)
        # every slice pool takes the reservation, the CPU-only Pathways pool none; the
        # pools are created concurrently, so the order of their POSTs is not fixed
        pools = {
            r.body["nodePool"]["name"]: _typed(container_v1.NodePool, r.body["nodePool"])
            for r in fake.find("POST", r"/nodePools$")
        }
        assert {
            n for n, p in pools.items() if p.config.reservation_affinity.values == ["my-res"]
        } == {"v6e-16-0", "v6e-16-1"}, pools
        assert not pools["pathways"].config.reservation_affinity.values


class TestIdempotence:
    def test_second_create_sends_no_mutation(self, fake, clients, spec):
        create(clients, spec)
        n = len(fake.mutations())
        plan, result = create(clients, spec)
        assert plan.noop and result["applied"] == []
        assert len(fake.mutations()) == n

    def test_injected_503_is_retried_and_apply_completes(self, fake, clients, spec):
        fake.fail("POST", r"/clusters/rl/nodePools$", 503, "backend unavailable")
        fake.fail("GET", r"/global/networks/rl-dcn-0$", 503, "try again")
        create(clients, spec)
        # 1 refused + 2 slice pools + the Pathways pool
        assert len(fake.find("POST", r"/clusters/rl/nodePools$")) == 4
        assert {np["name"] for np in fake.clusters[("us-central1", "rl")]["nodePools"]} == {
            "cpu",
            "pathways",
            "v6e-16-0",
            "v6e-16-1",
        }

    def test_failure_mid_apply_then_rerun_converges(self, fake, clients, spec):
        fake.fail_operation(r"/clusters/rl/nodePools$", 13, "internal error while creating")
        with pytest.raises(Exception, match="internal error"):
            create(clients, spec)
        pools = {np["name"] for np in fake.clusters[("us-central1", "rl")]["nodePools"]}
        assert len(pools) == 3  # cpu + two of the three new pools
        plan, _ = create(clients, spec)
        assert plan.counts() == {"unchanged": 14, "create": 1}  # 2 roles the nodes have
        pools = {np["name"] for np in fake.clusters[("us-central1", "rl")]["nodePools"]}
        assert pools == {"cpu", "pathways", "v6e-16-0", "v6e-16-1"}
        assert cluster.plan_create(clients, spec, POOLS).noop

    def test_interrupted_while_cluster_provisioning_waits_on_rerun(self, fake, clients, spec):
        from rlctl.core.gcp import network

        plan = cluster.plan_create(clients, spec, POOLS)
        # simulate an apply killed right after the cluster create was accepted
        for c in plan.changes:
            if c.kind in ("network", "subnet", "firewall"):
                network.apply(clients, c, "us-central1", lambda s: None)
        gke = clients.container
        gke.create_cluster(
            parent="projects/p/locations/us-central1",
            cluster=clients.container_types.Cluster(
                next(c for c in plan.changes if c.kind == "cluster").body
            ),
        )
        plan2 = cluster.plan_create(clients, spec, POOLS)
        assert next(c for c in plan2.changes if c.kind == "cluster").action == "wait"
        cluster.apply_plan(clients, plan2)
        assert fake.clusters[("us-central1", "rl")]["status"] == "RUNNING"
        assert cluster.plan_create(clients, spec, POOLS).noop


class TestDelete:
    def test_delete_after_create_leaves_the_fake_empty(self, fake, clients, spec):
        create(clients, spec)
        plan = cluster.plan_delete(clients, "p", "us-central1", "rl")
        assert sorted(c.key for c in plan.changes) == sorted(
            [
                "nodepool/v6e-16-0",
                "nodepool/v6e-16-1",
                "nodepool/pathways",
                "cluster/rl",
                "firewall/rl-dcn-0-internal",
                "firewall/rl-dcn-1-internal",
                "subnet/rl-dcn-0-sub",
                "subnet/rl-dcn-1-sub",
                "network/rl-dcn-0",
                "network/rl-dcn-1",
                "bucket/rl-runs",
            ]
        )
        cluster.apply_plan(clients, plan)
        assert fake.is_empty()
        # dependency order: pools, cluster, firewalls, subnets, networks
        dels = [r.path for r in fake.mutations() if r.method == "DELETE"]
        idx = {
            k: max(i for i, p in enumerate(dels) if k in p)
            for k in ("nodePools", "firewalls", "subnetworks", "networks")
        }
        cl = dels.index("/v1/projects/p/locations/us-central1/clusters/rl")
        assert idx["nodePools"] < cl < min(i for i, p in enumerate(dels) if "firewalls" in p)
        assert cl < min(i for i, p in enumerate(dels) if "subnetworks" in p)
        assert max(idx["firewalls"], idx["subnetworks"]) < min(
            i for i, p in enumerate(dels) if "/global/networks/" in p
        )
        assert cluster.plan_delete(clients, "p", "us-central1", "rl").noop

    def test_delete_ignores_what_is_not_ours(self, fake, clients, spec):
        create(clients, spec)
        fake.networks["other"] = {
            "name": "other",
            "description": "someone else's",
            "selfLink": "x/other",
        }
        plan = cluster.plan_delete(clients, "p", "us-central1", "rl")
        assert "network/other" not in {c.key for c in plan.changes}
        cluster.apply_plan(clients, plan)
        assert list(fake.networks) == ["other"]

    def test_non_empty_bucket_is_kept_with_a_note(self, fake, clients, spec):
        create(clients, spec)
        clients.storage.bucket("rl-runs").blob("ckpt/1").upload_from_string(b"x")
        plan = cluster.plan_delete(clients, "p", "us-central1", "rl")
        assert "bucket/rl-runs" not in {c.key for c in plan.changes}
        assert any("rl-runs kept" in n for n in plan.notes)
        clients.storage.bucket("rl-runs").blob("ckpt/1").delete()


class TestErrors:
    def test_quota_error_on_operation(self, fake, clients, spec):
        fake.fail_operation(
            r"/nodePools$", 8, "Insufficient quota: TPUV6E chips, limit 16, requested 32"
        )
        with pytest.raises(QuotaExceededError, match="quota exceeded"):
            create(clients, spec)

    def test_quota_error_on_call_is_not_retried(self, fake, clients, spec):
        fake.fail("POST", r"/clusters$", 429, "Quota 'CPUS' exceeded. Limit: 8.0", times=5)
        with pytest.raises(QuotaExceededError):
            create(clients, spec)
        assert len(fake.find("POST", r"/clusters$")) == 1

    def test_stockout(self, fake, clients, spec):
        fake.fail_operation(
            r"/nodePools$",
            8,
            "GCE_STOCKOUT: zone does not have enough resources available to fulfill the request",
        )
        with pytest.raises(QuotaExceededError, match="stockout"):
            create(clients, spec)

    def test_permission_denied(self, fake, clients, spec):
        fake.fail(
            "POST",
            r"/global/networks$",
            403,
            "Required 'compute.networks.create' permission for 'projects/p'",
            reason="forbidden",
            times=2,
        )
        with pytest.raises(PermissionDeniedError, match="permission denied"):
            create(clients, spec)
