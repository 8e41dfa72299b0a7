"""The fit check: each pod group placed on a pool, or one reason it would stay Pending.

The four refusals of issue 24 each have a case, on the manifests c255c2d rendered
(rebuilt here) or a cluster that lacks what they need; and every accelerator of the
catalog, on a cluster as ``cluster create`` makes it, fits with every backend.
"""

from __future__ import annotations

import copy

import pytest

from rlctl.core.config import catalog, nodes
from rlctl.core.k8s import backends
from rlctl.core.k8s.backends import pod_groups
from rlctl.core.k8s.backends.jobset import EXCLUSIVE_KEY
from rlctl.core.k8s.backends.pathways import HEAD_POOL
from rlctl.core.k8s.fit import check
from rlctl.core.k8s.render import make_view, render_workload
from rlctl.core.k8s.shapes import slice_shape


def cluster_pools(
    accelerator: str,
    count: int,
    pathways: bool = True,
    threads_per_core: int | None = -1,
) -> list[nodes.NodePool]:
    """The pools 'cluster create -a "ACC xCOUNT"' makes (gcp/cluster.py), as nodes
    (threads per core -1: as it makes them, one on v6e, the machine's default else)."""
    acc = catalog.lookup(accelerator)
    if threads_per_core == -1:
        threads_per_core = acc.strategy.threads(acc)
    out = [nodes.node_pool("cpu", "e2-standard-8", 1)]
    if acc.kind == "tpu":
        out += [
            nodes.node_pool(
                f"{acc.name}-{i}",
                acc.machine_type,
                acc.hosts,
                threads_per_core=threads_per_core,
                accelerator=acc,
            )
            for i in range(count)
        ]
        if pathways:  # every backend's own pool (the Pathways head's), as it declares it
            for p in backends.node_pools():
                pw = nodes.node_pool(p.name, p.machine_type, p.max_nodes, autoscaled=True)
                key, value = p.taint
                out.append(pw.model_copy(update={"taints": [nodes.Taint(key=key, value=value)]}))
    else:
        out.append(nodes.node_pool(f"{acc.name}-0", acc.machine_type, count, accelerator=acc))
    return out


def objs_for(backend: str, accelerator: str, count: int, **kw) -> list[dict]:
    shape = slice_shape(catalog.lookup(accelerator), count)
    view = make_view(
        run="r1", backend=backend, image="img:1", run_uri="gs://b/runs/r1", shape=shape, **kw
    )
    return render_workload(view)


TPUS = [a.name for a in catalog.all_types() if a.kind == "tpu"]
GPUS = [a.name for a in catalog.all_types() if a.kind == "gpu"]


class TestEverythingCatalogedFits:
    @pytest.mark.parametrize("backend", ["jobset", "lws", "pathways", "ray"])
    @pytest.mark.parametrize("accelerator", TPUS)
    def test_tpu(self, backend, accelerator):
        # with a bucket mounted: GKE's GCS FUSE sidecar rides along on every pod
        report = check(
            pod_groups(objs_for(backend, accelerator, 2, gcs_buckets=["data-b"])),
            cluster_pools(accelerator, 2),
        )
        if backend == "pathways" and catalog.lookup(accelerator).chips_per_host == 1:
            # pathways-job v0.1.4 asks 4 chips of every worker (8 on -8t machines:
            # ChipsPerVM in pathwaysjob_controller.go), more than a 1-chip host has
            (bad,) = report.misfits
            assert bad.role == "pathways-worker" and bad.reason == "accelerator"
            return
        assert report.fits, report.misfits

    @pytest.mark.parametrize("backend", ["jobset", "lws", "ray"])
    @pytest.mark.parametrize("accelerator", GPUS)
    def test_gpu(self, backend, accelerator):
        report = check(
            pod_groups(objs_for(backend, accelerator, 2, gcs_buckets=["data-b"])),
            cluster_pools(accelerator, 2),
        )
        assert report.fits, report.misfits

    def test_placements_name_the_pools(self):
        report = check(
            pod_groups(objs_for("pathways", "v6e-16", 2, gcs_buckets=["data-b"])),
            cluster_pools("v6e-16", 2),
        )
        assert [(p.role, p.pools) for p in report.placements] == [
            ("pathways-head", ["pathways"]),
            ("pathways-worker", ["v6e-16-0", "v6e-16-1"]),
        ]


class TestRefusals:
    """One line each, naming what the pod asks and what the nodes have."""

    @pytest.mark.parametrize("accelerator", ["v6e-16", "v6e-4"])
    def test_a_pod_over_a_nodes_cpu_after_threads_per_core(self, accelerator):
        """Issue 24 point 1: c255c2d sized the pod from the listed vCPUs (two threads per
        core) on pools made with one: v6e asked 161 of 90. (Only v6e pools are made with
        one thread per core: issue 55 point 3.)"""
        objs = objs_for("jobset", accelerator, 2)
        shape = slice_shape(catalog.lookup(accelerator), 2, threads_per_core=None)
        old = render_workload(
            make_view(
                run="r1", backend="jobset", image="img:1", run_uri="gs://b/runs/r1", shape=shape
            )
        )
        pools = cluster_pools(accelerator, 2)
        assert check(pod_groups(objs), pools).fits
        (bad,) = check(pod_groups(old), pools).misfits
        assert bad.reason == "cpu" and "one thread per core" in bad.detail
        assert "\n" not in bad.detail

    def test_a_pathways_head_on_a_too_small_cpu_pool(self):
        """Issue 24 point 4: the head carries 24 CPU and 132 GB of sidecars; a cluster
        whose only CPU pool is an e2-standard-8 cannot take it."""
        objs = objs_for("pathways", "v6e-16", 2)
        key, value = HEAD_POOL.taint
        small = nodes.node_pool(HEAD_POOL.name, "e2-standard-8", 1)
        small = small.model_copy(update={"taints": [nodes.Taint(key=key, value=value)]})
        pools = [*cluster_pools("v6e-16", 2, pathways=False), small]
        (bad,) = check(pod_groups(objs), pools).misfits
        assert bad.role == "pathways-head" and bad.reason == "cpu"
        assert "e2-standard-8" in bad.detail
        # and without the pool at all: the selector names it
        (bad,) = check(pod_groups(objs), cluster_pools("v6e-16", 2, pathways=False)).misfits
        assert bad.reason == "selector" and "gke-nodepool=pathways" in bad.detail

    def test_n_whole_node_gpu_pods_pinned_to_one_host(self):
        """Issue 24 point 5: c255c2d's GPU JobSet was exclusive on kubernetes.io/hostname,
        which JobSet's webhook turns into every pod on the leader's node."""
        objs = objs_for("jobset", "a3-highgpu-8g", 2)
        old = copy.deepcopy(objs)
        old[-1]["metadata"]["annotations"][EXCLUSIVE_KEY] = "kubernetes.io/hostname"
        pools = cluster_pools("a3-highgpu-8g", 2)
        assert check(pod_groups(objs), pools).fits
        (bad,) = check(pod_groups(old), pools).misfits
        assert bad.reason == "pinned" and "a node takes 1 of them" in bad.detail

    @pytest.mark.parametrize(("run_on", "have"), [("v6e-32", "v6e-16"), ("v5p-16", "v6e-16")])
    def test_a_pod_selecting_a_topology_or_machine_no_pool_has(self, run_on, have):
        objs = objs_for("jobset", run_on, 1)
        (bad,) = check(pod_groups(objs), cluster_pools(have, 1)).misfits
        assert bad.reason == "selector" and "no node pool has" in bad.detail

    def test_too_few_nodes(self):
        objs = objs_for("ray", "v6e-16", 2)
        (bad,) = check(pod_groups(objs), cluster_pools("v6e-16", 1)).misfits
        assert bad.reason == "nodes" and "room for 4" in bad.detail

    def test_an_untolerated_taint(self):
        objs = objs_for("jobset", "v6e-16", 1)
        js = objs[-1]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        for c in js["containers"]:  # a CPU-only pod aimed at the TPU nodes
            c["resources"] = {"requests": {"cpu": "1"}}
        (bad,) = check(pod_groups(objs), cluster_pools("v6e-16", 1)).misfits
        assert bad.reason == "taint" and "google.com/tpu=present:NoSchedule" in bad.detail

    def test_groups_share_the_nodes_they_land_on(self):
        """The Ray head and the submitter go to the one CPU node; two heads' worth of CPU
        does not fit there."""
        objs = objs_for("ray", "v6e-16", 1)
        head = objs[-1]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
        head["containers"][0]["resources"]["requests"]["cpu"] = "6.9"
        (bad,) = check(pod_groups(objs), cluster_pools("v6e-16", 1)).misfits
        assert bad.role == "ray-submitter" and bad.reason == "nodes"
