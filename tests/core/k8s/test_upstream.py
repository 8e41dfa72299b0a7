# ruff: noqa: E501  (the upstream lines below are quoted verbatim, however long)
"""rlctl's model of the controllers (``rlctl.core.k8s.admission`` and the backends' folders) against their sources.

The fit check and the Kubernetes fake both use that model, so a wrong model makes both
wrong together and nothing fails (the Pathways head's labels, issue #43, were exactly
that). Here the model is held to lines quoted verbatim from the upstream files at the
versions ``cluster create`` installs or GKE runs, each with its file and line: the
numbers are parsed out of the quotes, so changing the model alone fails, and changing
a quote is changing a citation.
"""

from __future__ import annotations

import re

import pytest

from rlctl.core.k8s import backends
from rlctl.core.k8s.backends import pathways as pathways_backend
from rlctl.core.k8s.backends import ray as ray_backend
from rlctl.core.units import quantity

# google/pathways-job v0.1.4 (c0cc7594), internal/controller/pathwaysjob_controller.go
PW_RM_605 = (
    'Resources:       corev1.ResourceRequirements{Limits: corev1.ResourceList{"cpu": '
    '*resource.NewQuantity(8, resource.DecimalSI), "memory": *resource.NewQuantity('
    "32000000000, resource.DecimalSI)}}, // 32GB"
)
PW_PROXY_647 = (
    "Resources:       corev1.ResourceRequirements{Limits: corev1.ResourceList{"
    '"cpu": *resource.NewQuantity(16, resource.DecimalSI), "memory": '
    "*resource.NewQuantity(100000000000, resource.DecimalSI)}}, //100GiB"
)
PW_HEAD_909_940 = """\
func MakePathwaysHeadReplicatedJob(pw *pathwaysjob.PathwaysJob, pathwaysHeadPodSpec corev1.PodSpec) jobsetv1alpha2.ReplicatedJob {
	var annotations map[string]string
	// Start with annotations from the PathwaysJob.
	annotations = make(map[string]string)
	for k, v := range pw.GetObjectMeta().GetAnnotations() {
		annotations[k] = v
	}

	if pw.Spec.Controller.DeploymentMode == pathwaysjob.Default {
		// needed so that head pods are placed exclusively on CPU nodes.
		annotations["alpha.jobset.sigs.k8s.io/exclusive-topology"] = "kubernetes.io/hostname"
	}
	pathwaysHeadJob := jobsetv1alpha2.ReplicatedJob{
		Name:     PathwaysHeadJobName,
		Replicas: 1,
		Template: batchv1.JobTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{
				Annotations: annotations,
			},
			Spec: batchv1.JobSpec{
				BackoffLimit: ptr.To(int32(0)),
				Completions:  ptr.To(int32(1)),
				Parallelism:  ptr.To(int32(1)),
				Template: corev1.PodTemplateSpec{
					Spec: pathwaysHeadPodSpec,
					ObjectMeta: metav1.ObjectMeta{
						Annotations: annotations,
					},"""
PW_VMS_469_472 = """\
	ChipsPerVM = 4
	if (machineType == pathwaysjob.Ct6e_standard_8t) || (machineType == pathwaysjob.Ct5lp_hightpu_8t) {
		ChipsPerVM = 8
	}"""
PW_HOSTNET_863_865 = """\
		pathwaysHeadPodSpec = pw.Spec.Controller.UserPodTemplate.Spec.DeepCopy()
		pathwaysHeadPodSpec.HostNetwork = true
		pathwaysHeadPodSpec.DNSPolicy = corev1.DNSClusterFirstWithHostNet"""

# ray-project/kuberay ray-operator/v1.6.1, ray-operator/controllers/ray/common/job.go
KR_SUBMITTER_217_229 = """\
		Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{
				corev1.ResourceCPU:    resource.MustParse("1"),
				corev1.ResourceMemory: resource.MustParse("1Gi"),
			},
			Requests: corev1.ResourceList{
				corev1.ResourceCPU:    resource.MustParse("500m"),
				corev1.ResourceMemory: resource.MustParse("200Mi"),
			},
		},"""
# ... and common/pod.go (supportsUnifiedHealthCheck, 467-476; the action, 489-496)
KR_UNIFIED_473 = '	minVersion := version.MustParseGeneric("2.53.0")'
KR_ACTION_490_492 = """\
	httpHealthCheckAction := &corev1.HTTPGetAction{
		Path: utils.RayNodeHealthPath,"""
KR_CONSTANTS = {  # utils/constant.go
    "DefaultDashboardAgentListenPort = 52365": 105,
    'RayNodeHealthPath       = "/api/healthz"': 260,
}

# kubernetes-sigs/jobset v0.12.0, pkg/controllers/jobset_controller.go 1014-1034
JS_LABELS = """\
	labels := make(map[string]string)
	maps.Copy(labels, obj.GetLabels())
	labels[jobset.JobSetNameKey] = js.Name"""


def _quantities(line: str) -> list[int]:
    return [int(n) for n in re.findall(r"NewQuantity\((\d+),", line)]


def _must_parse(text: str) -> list[str]:
    return re.findall(r'MustParse\("([^"]+)"\)', text)


def _pathways(annotations=None, template_meta=None, machine="ct6e-standard-4t", topology="4x4"):
    return {
        "kind": "PathwaysJob",
        "metadata": {"name": "r1", "namespace": "default", "annotations": annotations or {}},
        "spec": {
            "workers": [{"type": machine, "topology": topology, "numSlices": 2}],
            "controller": {
                "deploymentMode": "default",
                "template": {
                    "metadata": template_meta or {},
                    "spec": {"containers": [{"name": "trainer"}]},
                },
            },
        },
    }


class TestPathwaysJob:
    def test_the_sidecars_limits_are_the_controllers(self):
        from rlctl.core.k8s.backends.pathways import HEAD_SIDECARS

        for name, line in (("pathways-rm", PW_RM_605), ("pathways-proxy", PW_PROXY_647)):
            cpu, memory = _quantities(line)
            assert quantity(HEAD_SIDECARS[name]["cpu"]) == cpu
            assert quantity(HEAD_SIDECARS[name]["memory"]) == memory
        head = pathways_backend.pathways_jobset(_pathways())["spec"]["replicatedJobs"][0]
        side = {
            c["name"]: c["resources"]["limits"]
            for c in head["template"]["spec"]["template"]["spec"]["initContainers"]
        }
        assert {n: (quantity(x["cpu"]), quantity(x["memory"])) for n, x in side.items()} == {
            "pathways-rm": tuple(_quantities(PW_RM_605)),
            "pathways-proxy": tuple(_quantities(PW_PROXY_647)),
        }

    def test_the_heads_metadata_is_the_pathwaysjobs_annotations_only(self):
        """MakePathwaysHeadReplicatedJob: the pod template's ObjectMeta is ``annotations``,
        built from the PathwaysJob's own; no labels, nothing of the user's template."""
        assert (
            "ObjectMeta: metav1.ObjectMeta{\n\t\t\t\t\t\tAnnotations: annotations,"
            in PW_HEAD_909_940
            and "Labels" not in PW_HEAD_909_940
        )
        pw = _pathways(
            annotations={"a": "from-the-pathwaysjob"},
            template_meta={
                "labels": {"rlctl.dev/run": "r1"},
                "annotations": {"gke-gcsfuse/volumes": "true"},
            },
        )
        head = pathways_backend.pathways_jobset(pw)["spec"]["replicatedJobs"][0]
        meta = head["template"]["spec"]["template"]["metadata"]
        assert meta == {
            "annotations": {
                "a": "from-the-pathwaysjob",
                "alpha.jobset.sigs.k8s.io/exclusive-topology": "kubernetes.io/hostname",
            }
        }
        # so a GCS FUSE annotation on the template gets no sidecar; on the PathwaysJob it does
        (g_template, _) = backends.pod_groups([pw])
        assert not any(
            c["name"] == "gke-gcsfuse-sidecar" for c in g_template.pod.get("initContainers") or []
        )
        (g_job, _) = backends.pod_groups([_pathways(annotations={"gke-gcsfuse/volumes": "true"})])
        assert any(c["name"] == "gke-gcsfuse-sidecar" for c in g_job.pod["initContainers"])

    def test_the_head_runs_on_the_host_network(self):
        assert "HostNetwork = true" in PW_HOSTNET_863_865
        (head, _) = backends.pod_groups([_pathways()])
        assert head.host_network and head.pod["dnsPolicy"] == "ClusterFirstWithHostNet"

    @pytest.mark.parametrize(
        ("machine", "topology"),
        [
            ("ct6e-standard-4t", "4x4"),
            ("ct6e-standard-8t", "2x4"),
            ("ct5lp-hightpu-8t", "2x4"),
            ("ct5p-hightpu-4t", "2x2x4"),
        ],
    )
    def test_vms_per_slice_are_chips_over_the_controllers_chips_per_vm(self, machine, topology):
        per_vm = 8 if machine.replace("-", "_").capitalize() in PW_VMS_469_472 else 4
        chips = 1
        for d in topology.split("x"):
            chips *= int(d)
        (_, workers) = backends.pod_groups([_pathways(machine=machine, topology=topology)])
        assert workers.pods == chips // per_vm


class TestKubeRay:
    def test_the_default_submitter_is_kuberays(self):
        limits_cpu, limits_mem, req_cpu, req_mem = _must_parse(KR_SUBMITTER_217_229)
        quoted = {
            "requests": {"cpu": req_cpu, "memory": req_mem},
            "limits": {"cpu": limits_cpu, "memory": limits_mem},
        }
        assert quoted == ray_backend.RAY_SUBMITTER

    def test_the_rendered_submitter_is_the_default_plus_the_runs_labels(self):
        from rlctl.core.k8s.render import render_workload
        from tests.core.k8s.test_render import view

        rj = render_workload(view("ray", "tpu", 1))[-1]
        tmpl = rj["spec"]["submitterPodTemplate"]
        (c,) = tmpl["spec"]["containers"]
        assert c["resources"] == ray_backend.RAY_SUBMITTER
        assert c["name"] == "ray-job-submitter" and "command" not in c  # KubeRay's line
        assert tmpl["metadata"]["labels"]["rlctl.dev/run"] == rj["metadata"]["name"]

    def test_http_probes_from_ray_2_53_on_the_agent_port(self):
        minimum = re.search(r'"([\d.]+)"', KR_UNIFIED_473).group(1)
        assert tuple(int(x) for x in minimum.split(".")) == ray_backend.RAY_HTTP_PROBES
        assert "RayNodeHealthPath" in KR_ACTION_490_492
        port = int(next(k for k in KR_CONSTANTS if "ListenPort" in k).split("=")[1])
        path = next(k for k in KR_CONSTANTS if "HealthPath" in k).split('"')[1]
        out = ray_backend.ray_probes({"name": "ray-head"}, True, minimum, (1, 6, 1))
        assert out["readinessProbe"]["httpGet"] == {"path": path, "port": port}
        assert port == ray_backend.RAY_AGENT_PORT


class TestJobSet:
    def test_pods_carry_the_templates_labels_not_the_jobsets(self):
        """labelAndAnnotateObject copies the object's (the pod template's) labels and adds
        JobSet's: what rlctl selects its JobSet pods by must be on the template."""
        from rlctl.core.k8s.render import render_workload
        from tests.core.k8s.test_render import view

        assert "maps.Copy(labels, obj.GetLabels())" in JS_LABELS
        js = render_workload(view("jobset", "tpu", 2))[-1]
        for rjob in js["spec"]["replicatedJobs"]:
            labels = rjob["template"]["spec"]["template"]["metadata"]["labels"]
            assert labels["rlctl.dev/run"] == js["metadata"]["name"]
