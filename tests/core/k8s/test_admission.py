"""What the controllers make of rlctl's workloads, checked against their upstream sources.

Each expectation quotes the upstream file and version it comes from (the same ones
``rlctl/core/k8s/admission.py`` and each backend's folder cite), so a change of the
model that leaves upstream behind fails here, and the fake Kubernetes API (which
admits pods through the model) cannot drift from it silently.
"""

from __future__ import annotations

import pytest

from rlctl.core.k8s.admission import pod_requests
from rlctl.core.k8s.backends import pod_groups
from rlctl.core.k8s.backends.jobset import EXCLUSIVE_KEY
from rlctl.core.k8s.backends.pathways import pathways_jobset
from rlctl.core.k8s.backends.ray import ray_probes
from rlctl.core.k8s.render import render_workload
from rlctl.core.units import quantity
from tests.core.k8s.test_render import view

GB = 1e9


class TestQuantities:
    @pytest.mark.parametrize(
        ("text", "value"),
        [
            ("500m", 0.5),
            ("8", 8.0),
            ("32G", 32e9),
            ("100G", 100e9),
            ("16Gi", 16 * 2**30),
            ("200Mi", 200 * 2**20),
        ],
    )
    def test_parse(self, text, value):
        assert quantity(text) == pytest.approx(value)

    def test_a_limit_without_a_request_is_requested_at_the_limit(self):
        """k8s pkg/apis/core/v1/defaults.go: requests default to limits."""
        spec = {"containers": [{"resources": {"limits": {"cpu": "16", "memory": "100G"}}}]}
        r = pod_requests(spec)
        assert (r.cpu, r.memory) == (16, 100 * GB)

    def test_native_sidecars_add_plain_init_containers_peak(self):
        """KEP-753: sidecars (restartPolicy Always) add up with the containers; a plain init
        container counts only where it is larger than all of them."""
        spec = {
            "containers": [{"resources": {"requests": {"cpu": "1"}}}],
            "initContainers": [
                {"restartPolicy": "Always", "resources": {"requests": {"cpu": "2"}}},
                {"resources": {"requests": {"cpu": "2.5"}}},
            ],
        }
        assert pod_requests(spec).cpu == 3.0
        spec["initContainers"][1]["resources"]["requests"]["cpu"] = "5"
        assert pod_requests(spec).cpu == 5.0


class TestJobSet:
    def test_one_group_per_replicated_job_with_its_exclusive_topology(self):
        """jobset v0.12.0 jobset_controller.go: replicas Jobs of parallelism pods; the
        exclusive-topology annotation reaches the pods (pod_webhook.go pins each job's
        followers to the leader's domain)."""
        objs = render_workload(view("jobset", "tpu", 2))
        (g,) = pod_groups(objs)
        assert (g.jobs, g.pods, g.pinned) == (2, 4, "cloud.google.com/gke-nodepool")
        assert g.requests.extended == {"google.com/tpu": 4}
        # ExtendedResourceToleration: a TPU request tolerates the TPU nodes' taint
        assert {
            "key": "google.com/tpu",
            "operator": "Exists",
            "effect": "NoSchedule",
        } in g.tolerations

    def test_gpu_jobs_are_never_pinned_to_one_host(self):
        """Issue 24 point 5: with kubernetes.io/hostname, JobSet's webhook gives every
        follower nodeSelector[hostname] = the leader's node; N whole-node pods hang."""
        objs = render_workload(view("jobset", "gpu", 2))
        assert objs[-1]["metadata"]["annotations"][EXCLUSIVE_KEY] == "cloud.google.com/gke-nodepool"
        (g,) = pod_groups(objs)
        assert (g.jobs, g.pods, g.requests.extended) == (1, 4, {"nvidia.com/gpu": 8})


class TestPathwaysJob:
    def test_head_gets_the_controllers_sidecars_host_network_and_hostname_exclusivity(self):
        """pathways-job v0.1.4 pathwaysjob_controller.go: MakePathwaysHeadPodSpec appends
        pathways-rm (limits cpu 8, memory 32000000000) and pathways-proxy (cpu 16, memory
        100000000000) as native sidecars, sets HostNetwork and ClusterFirstWithHostNet;
        MakePathwaysHeadReplicatedJob in default mode: exclusive on kubernetes.io/hostname."""
        objs = render_workload(view("pathways", "tpu", 2))
        js = pathways_jobset(objs[-1])
        head = js["spec"]["replicatedJobs"][0]
        pod = head["template"]["spec"]["template"]
        assert pod["metadata"]["annotations"][EXCLUSIVE_KEY] == "kubernetes.io/hostname"
        assert pod["spec"]["hostNetwork"] is True
        assert pod["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
        sidecars = {c["name"]: c for c in pod["spec"]["initContainers"]}
        assert sidecars["pathways-rm"]["resources"]["limits"] == {
            "cpu": "8",
            "memory": "32000000000",
        }
        assert sidecars["pathways-proxy"]["resources"]["limits"] == {
            "cpu": "16",
            "memory": "100000000000",
        }
        assert all(c["restartPolicy"] == "Always" for c in sidecars.values())
        (hg, _) = pod_groups(objs)
        trainer = pod_requests({"containers": pod["spec"]["containers"]})
        assert hg.requests.cpu == trainer.cpu + 24
        assert hg.requests.memory == pytest.approx(trainer.memory + 132 * GB)

    def test_workers_one_job_per_slice_with_host_network_and_no_service_account(self):
        """MakeWorkerJob: replicas = numSlices, prod(topology) / 4 pods, limits
        google.com/tpu 4, the TPU node selector, exclusive on the node pool, no
        serviceAccountName (the namespace's default)."""
        objs = render_workload(view("pathways", "tpu", 2))
        (_, wg) = pod_groups(objs)
        assert (wg.jobs, wg.pods, wg.pinned) == (2, 4, "cloud.google.com/gke-nodepool")
        assert wg.requests.extended == {"google.com/tpu": 4}
        assert wg.host_network and wg.service_account is None
        assert wg.node_selector == {
            "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
            "cloud.google.com/gke-tpu-topology": "4x4",
        }

    @pytest.mark.parametrize(
        ("machine", "topology", "pods"),
        [
            ("ct6e-standard-4t", "4x4", 4),
            ("ct6e-standard-8t", "2x4", 1),
            ("ct5p-hightpu-4t", "2x2x2", 2),
        ],
    )
    def test_vms_per_slice(self, machine, topology, pods):
        pw = {
            "kind": "PathwaysJob",
            "metadata": {"name": "x"},
            "spec": {"workers": [{"type": machine, "topology": topology, "numSlices": 1}]},
        }
        (_, wg) = pod_groups([pw])
        assert wg.pods == pods


class TestKubeRayProbes:
    """kuberay ray-operator controllers/ray/common/pod.go, utils/constant.go."""

    def test_missing_probes_are_exec_wget_before_1_6(self):
        c = ray_probes(
            {"name": "ray-worker"}, head=False, ray_version="2.60.0", kuberay_version=(1, 5, 2)
        )
        cmd = c["readinessProbe"]["exec"]["command"]
        assert cmd[:2] == ["bash", "-c"] and cmd[2].startswith("wget --tries 1 -T 2 ")
        assert "52365/api/local_raylet_healthz | grep success" in cmd[2]
        head = ray_probes(
            {"name": "ray-head"}, head=True, ray_version=None, kuberay_version=(1, 3, 2)
        )
        assert "8265/api/gcs_healthz" in head["livenessProbe"]["exec"]["command"][2]
        assert "--tries" not in head["livenessProbe"]["exec"]["command"][2]

    def test_http_from_1_6_only_with_a_ray_version_of_2_53_or_later(self):
        c = ray_probes({}, head=False, ray_version="2.60.0", kuberay_version=(1, 6, 0))
        assert c["livenessProbe"]["httpGet"] == {"path": "/api/healthz", "port": 52365}
        for rv in (None, "", "2.52.1"):  # empty or older: wget again
            c = ray_probes({}, head=False, ray_version=rv, kuberay_version=(1, 7, 0))
            assert "exec" in c["livenessProbe"]

    def test_a_probe_the_container_has_is_kept(self):
        mine = {"httpGet": {"path": "/x", "port": 1}}
        c = ray_probes(
            {"readinessProbe": mine}, head=False, ray_version=None, kuberay_version=(1, 5, 2)
        )
        assert c["readinessProbe"] == mine and "exec" in c["livenessProbe"]

    @pytest.mark.parametrize("kuberay", [(1, 3, 2), (1, 5, 2), (1, 7, 0)])
    def test_rlctls_ray_pods_need_no_wget_with_any_kuberay(self, kuberay):
        """Issue 24 point 3: c255c2d set no rayVersion and no liveness probe, so KubeRay
        injected `wget` probes and the slim image has no wget."""
        objs = render_workload(view("ray", "tpu", 2))
        rc = objs[-1]["spec"]["rayClusterSpec"]
        assert rc["rayVersion"] == "2.60.0"
        groups = pod_groups(objs, versions={"ray": kuberay})
        for g in groups:
            if g.role in ("ray-head", "ray-worker"):
                c = g.pod["containers"][0]
                for probe in ("readinessProbe", "livenessProbe"):
                    assert "exec" not in c[probe], (g.name, probe)
                    assert c[probe]["httpGet"]["port"] in (8265, 52365)

    def test_submitter_is_the_default_k8s_job_pod(self):
        """common/job.go: the head's image, requests cpu 500m / memory 200Mi."""
        objs = render_workload(view("ray", "tpu", 1))
        sub = pod_groups(objs)[-1]
        assert sub.role == "ray-submitter"
        assert (sub.requests.cpu, sub.requests.memory) == (0.5, 200 * 2**20)
        assert (
            sub.pod["containers"][0]["image"]
            == objs[-1]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"][
                "containers"
            ][0]["image"]
        )


def test_gcs_fuse_sidecar_is_added_to_annotated_pods():
    """GKE's GCS FUSE webhook: a native sidecar requesting 250m CPU and 256Mi."""
    plain = pod_groups(render_workload(view("jobset", "tpu", 1)))[0].requests
    mounted = pod_groups(render_workload(view("jobset", "tpu", 1, gcs_buckets=["data-b"])))[
        0
    ].requests
    assert mounted.cpu - plain.cpu == pytest.approx(0.25)
    assert mounted.memory - plain.memory == 256 * 2**20
