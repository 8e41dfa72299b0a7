"""``train --cluster`` says where every pod goes, or refuses before applying anything.

Clusters are seeded as ``rlctl cluster create`` makes them (``tests/fakes/seed.py``:
the production request bodies), for the v6e, v5p and GPU shapes; every backend's
dry run fits them, and the manifests it prints are placed again by the test from the
pools GKE returns.
"""

from __future__ import annotations

import json

import pytest

from rlctl.core.k8s.backends import pod_groups
from rlctl.core.k8s.fit import check
from tests.fakes.k8s import nodes_of_cluster
from tests.fakes.seed import seed_cluster

IMAGE = "us-docker.pkg.dev/p/r/rlctl:1"
WHERE = [
    "--cluster",
    "rl",
    "--project",
    "p",
    "--region",
    "us-central1",
    "--runs-dir",
    "gs://rl-runs/runs",
    "--image",
    IMAGE,
    "--name",
    "r1",
]
SHAPES = {"v6e-16 x2": 2, "v5p-16 x2": 0, "a3-highgpu-8g x2": 0}  # -> DCN networks


def _train(cli, *extra: str):
    return cli("train", "grpo", *WHERE, *extra)


@pytest.mark.parametrize("backend", ["jobset", "lws", "pathways", "ray"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_dry_run_on_a_cluster_as_cluster_create_makes_it_fits(cli, fake, shape, backend):
    seed_cluster(fake, "rl", [shape], dcn_networks=SHAPES[shape])
    r = _train(cli, "--backend", backend, "--dry-run", "-o", "json")
    if backend == "pathways" and shape.startswith("a3"):
        assert r.exit_code == 2 and "TPU slices only" in r.stderr
        return
    assert r.exit_code == 0, r.stderr
    objs = json.loads(r.stdout)
    report = check(pod_groups(objs), nodes_of_cluster(fake, "rl"))
    assert report.fits, report.misfits
    # stderr says where each pod group goes
    for p in report.placements:
        assert f"{p.group}: {p.pods} pod" in r.stderr and ", ".join(p.pools) in r.stderr


class TestRefusedBeforeAnythingIsApplied:
    def test_cpu_over_the_node(self, cli, fake, kube):
        seed_cluster(fake, "rl", ["v6e-16 x2"])
        r = _train(cli, "--cpu", "100", "--dry-run", "-o", "json")
        assert r.exit_code == 2 and json.loads(r.stdout)["exit_code"] == 2  # the error only
        (line,) = [x for x in r.stderr.splitlines() if x.startswith("error:")]
        assert "would stay Pending" in line and "each pod asks 100 CPU" in line
        assert "90 vCPUs with one thread per core" in line and "pass --cpu 80" in line
        assert "Traceback" not in r.stderr
        r = _train(cli, "--cpu", "100")  # a real submit: nothing written, nothing applied
        assert r.exit_code == 2 and kube.mutations() == []

    def test_pathways_without_its_pool(self, cli, fake):
        doc = seed_cluster(fake, "rl", ["v6e-16 x2"])
        doc["nodePools"] = [p for p in doc["nodePools"] if p["name"] != "pathways"]
        r = _train(cli, "--backend", "pathways", "--dry-run")
        assert r.exit_code == 2
        assert (
            "pathways-head (1 pod): no node pool has cloud.google.com/gke-nodepool="
            "pathways" in r.stderr
        )
        assert (
            "re-run 'rlctl cluster create rl --region us-central1 -a v6e-16' to add "
            "the 'pathways' pool" in r.stderr
        )

    def test_pools_made_with_two_threads_per_core_size_pods_by_those(self, cli, fake):
        doc = seed_cluster(fake, "rl", ["v6e-16 x2"])
        for p in doc["nodePools"]:  # pools made by hand with two threads per core
            p["config"].pop("advancedMachineFeatures", None)
        r = _train(cli, "--cpu", "100", "--dry-run")
        assert r.exit_code == 0, r.stderr  # 100 of 180 vCPUs: fits there
        assert "-> v6e-16-0, v6e-16-1" in r.stderr


def test_a_disabled_api_stops_a_submit_with_one_line(cli, fake, kube):
    seed_cluster(fake, "rl", ["v6e-16 x2"])
    fake.enabled.discard("storage.googleapis.com")
    r = _train(cli)
    assert r.exit_code == 2 and kube.mutations() == []
    assert "gcloud services enable storage.googleapis.com --project p" in r.stderr


class TestGeneratorPods:
    """rollout.placement=process on a cluster (issue 54): the generator in pods of its
    own, one host of the accelerator; the learner on the other, one process for now."""

    @pytest.mark.parametrize(
        ("backend", "shape", "roles"),
        [
            ("jobset", "a3-highgpu-8g x2", ["trainer", "generator"]),
            ("jobset", "a3-highgpu-8g x3", ["trainer", "generator"]),
            (
                "ray",
                "a3-highgpu-8g x2",
                ["ray-head", "ray-worker", "ray-generator", "ray-submitter"],
            ),
        ],
    )
    def test_dry_run_renders_both_groups_and_places_them(self, cli, fake, backend, shape, roles):
        seed_cluster(fake, "rl", [shape])
        if shape.endswith("x3"):  # two of its three hosts: one learns, one generates
            shape = "a3-highgpu-8g x2"
            sets_a = ["-a", shape]
        else:
            sets_a = []
        sets = ["--set", "rollout.placement=process", "--set", "rollout.max_staleness=1"]
        r = _train(cli, "--backend", backend, *sets, *sets_a, "--dry-run", "-o", "json")
        assert r.exit_code == 0, r.stderr
        objs = json.loads(r.stdout)
        groups = pod_groups(objs)
        assert [(g.role, g.total) for g in groups] == [(role, 1) for role in roles]
        assert check(groups, nodes_of_cluster(fake, "rl")).fits
        acc = shape.split()[0]
        assert (
            f"rollout: process, the learner on one {acc} host and the generator on another "
            "(the workload's generator pods)" in r.stderr
        )
        (gen,) = [g for g in groups if "generator" in g.role]
        assert f"{gen.name}: 1 pod -> a3-highgpu-8g-0" in r.stderr  # one pool, 2 machines

    def test_a_cluster_of_one_host_has_none_for_the_generator(self, cli, fake, kube):
        seed_cluster(fake, "rl", ["a3-highgpu-8g x1"])
        r = _train(cli, "--set", "rollout.placement=process")
        assert r.exit_code == 2 and kube.mutations() == []
        assert "needs a machine for the generator beside the learner's" in r.stderr
        assert "a cluster of a3-highgpu-8g x2" in r.stderr and "Traceback" not in r.stderr

    def test_a_learner_of_several_hosts_is_refused_with_the_shape_that_runs(self, cli, fake):
        seed_cluster(fake, "rl", ["a3-highgpu-8g x3"])
        r = _train(cli, "--set", "rollout.placement=process", "--dry-run")
        assert r.exit_code == 2
        assert "needs a learner of one process for now; a3-highgpu-8g x3 leaves 2" in r.stderr
        assert "learner hosts" in r.stderr
        assert "-a 'a3-highgpu-8g x2'" in r.stderr

    def test_a_backend_without_generator_pods_names_those_with_them(self, cli, fake):
        seed_cluster(fake, "rl", ["a3-highgpu-8g x2"])
        r = _train(cli, "--backend", "lws", "--set", "rollout.placement=process", "--dry-run")
        assert r.exit_code == 2
        assert "which the lws backend does not render yet" in r.stderr
        assert "--backend jobset or ray" in r.stderr


class TestVllmOnAGpuCluster:
    """rollout.engine=vllm on a GPU cluster (issue 55 point 3): train picks rlctl's vLLM
    image flavour (rlctl-gpu-vllm, whose lock pins vLLM's CUDA wheel) unless --image names
    another, renders and validates the run with it, and applies it to the cluster, here
    with the generator in pods of their own (seed 004: vLLM generation on its own GPU
    node). Applied to a cluster: tests/cli/test_cluster_runs.py."""

    ARGS = (
        "train",
        "grpo",
        "--cluster",
        "rl",
        "--project",
        "p",
        "--region",
        "us-central1",
        "--name",
        "r1",
        "--set",
        "rollout.engine=vllm",
        "--set",
        "rollout.placement=process",
        "--set",
        "rollout.max_staleness=1",
    )

    def test_the_vllm_image_is_picked_rendered_and_applied(self, cli, fake, kube, cluster_bucket):
        from rlctl.core.gcp.image import default_tag

        seed_cluster(fake, "rl", ["a3-highgpu-8g x2"])
        kube.seed_ready()
        kube.nodes = nodes_of_cluster(fake, "rl")
        tag = default_tag("gpu-vllm")
        image = f"us-central1-docker.pkg.dev/p/rlctl/rlctl-gpu-vllm:{tag}"
        r = cli(*self.ARGS, "--dry-run", "-o", "json")
        assert r.exit_code == 0, r.stderr
        objs = json.loads(r.stdout)
        (workload,) = [o for o in objs if o["kind"] == "JobSet"]
        pods = [
            rj["template"]["spec"]["template"]["spec"] for rj in workload["spec"]["replicatedJobs"]
        ]
        assert {c["image"] for p in pods for c in p["containers"]} == {image}
        assert workload["metadata"]["annotations"]["rlctl.dev/rollout-engine"] == "vllm"
        assert "rollout engine: rollout.engine=vllm (vLLM 0.30.0 on gpu)" in r.stderr

    def test_the_plain_gpu_image_says_to_build_the_vllm_one(self, cli, fake):
        seed_cluster(fake, "rl", ["a3-highgpu-8g x2"])
        plain = "us-central1-docker.pkg.dev/p/rlctl/rlctl-gpu:0.1.0-abc"
        r = cli(*self.ARGS, "--image", plain, "--runs-dir", "gs://rl-runs/runs", "--dry-run")
        assert r.exit_code == 2
        assert "rlctl's gpu image carries no vLLM" in r.stderr
        assert "rlctl image build -a gpu --with vllm" in r.stderr and "Traceback" not in r.stderr
