"""``cluster create`` leaves a cluster a run can start on: the JobSet and PathwaysJob
controllers (pinned, in the plan), the namespace and KSA; ``cluster delete`` removes the
controllers. The real google-cloud and kubernetes clients talk to the fakes."""

from __future__ import annotations

import json

from rlctl.core.k8s import backends
from tests.cli.test_cluster import BASE, CREATE

CTL = "rlctl.dev/controller"


def _controller_objects(kube) -> list[tuple]:
    return [
        k for k, o in kube.objects.items() if CTL in ((o.get("metadata") or {}).get("labels") or {})
    ]


class TestPlan:
    def test_dry_run_lists_controllers_with_versions_and_changes_nothing(self, cli, fake, kube):
        r = cli(
            *CREATE,
            "--namespace",
            "train",
            "--service-account",
            "trainer",
            "--dry-run",
            "-o",
            "json",
        )
        assert r.exit_code == 0, r.stderr
        changes = {(c["kind"], c["name"]): c for c in json.loads(r.stdout)["changes"]}
        js = changes[("controller", "jobset")]
        assert js["action"] == "create" and js["fields"]["version"] == "v0.12.0"
        assert js["fields"]["crds"] == ["jobsets.jobset.x-k8s.io"]
        assert js["depends_on"] == ["cluster/rl"]
        pw = changes[("controller", "pathways-job")]
        assert pw["fields"]["version"] == "v0.1.4"
        assert pw["depends_on"] == ["cluster/rl", "controller/jobset"]
        assert changes[("namespace", "train")]["action"] == "create"
        ksa = changes[("serviceaccount", "train/trainer")]
        assert ksa["depends_on"] == ["cluster/rl", "namespace/train"]
        assert fake.mutations() == [] and kube.mutations() == []

    def test_table_shows_the_versions(self, cli):
        r = cli(*CREATE, "--dry-run")
        assert r.exit_code == 0, r.stderr
        lines = r.stdout.splitlines()  # at 80 columns: the change, then its details
        i = next(
            i for i, ln in enumerate(lines) if ln.split()[:3] == ["create", "controller", "jobset"]
        )
        assert "version=v0.12.0" in lines[i + 1]

    def test_autopilot_is_refused_in_one_line_before_anything(self, cli, fake, kube):
        r = cli("cluster", "create", "rl", *BASE, "-a", "v6e-16", "--autopilot", "--dry-run")
        assert r.exit_code == 2
        err = [x for x in r.stderr.splitlines() if x.startswith("error:")]
        assert err == [
            "error: Autopilot clusters are not supported: rlctl runs on TPU/GPU "
            "node pools of a Standard cluster"
        ]
        assert "Traceback" not in r.stderr and fake.requests == []


class TestApply:
    def test_create_installs_controllers_namespace_and_ksa(self, cli, fake, kube):
        r = cli(
            *CREATE, "--namespace", "train", "--service-account", "trainer", "--yes", "-o", "json"
        )
        assert r.exit_code == 0, r.stderr
        crds = [n for n in kube.names("customresourcedefinitions", cluster=True)]
        assert crds == [
            "CustomResourceDefinition/jobsets.jobset.x-k8s.io",
            "CustomResourceDefinition/pathwaysjobs.pathways-job.pathways.domain",
        ]
        for name in ("jobsets.jobset.x-k8s.io", "pathwaysjobs.pathways-job.pathways.domain"):
            crd = kube.objects[("apiextensions.k8s.io/v1", "customresourcedefinitions", "", name)]
            assert crd["status"]["conditions"][0]["type"] == "Established"
        ns = kube.objects[("v1", "namespaces", "", "train")]
        assert ns["metadata"]["labels"]["managed-by"] == "rlctl"
        sa = kube.objects[("v1", "serviceaccounts", "train", "trainer")]
        assert sa["metadata"]["labels"]["managed-by"] == "rlctl"
        assert "annotations" not in sa["metadata"]
        # each controller object was applied exactly once, server-side
        patches = [x for x in kube.requests if x["method"] == "PATCH"]
        assert len(patches) == len({x["path"] for x in patches}) == len(_controller_objects(kube))
        # the cluster is ready for a run of every backend rlctl installs a controller for
        from rlctl.core.k8s.apply import KubeApi
        from rlctl.core.k8s.controllers import missing_for_run
        from rlctl.core.k8s.kubeconfig import api_client, build_configuration

        api = KubeApi(api_client(build_configuration(kube.url, None, "")), "train")
        assert missing_for_run(api, "rl", backends.get("jobset"), "train", "trainer") == []
        assert missing_for_run(api, "rl", backends.get("pathways"), "train", "trainer") == []

    def test_a_controller_of_another_version_is_updated(self, cli, kube):
        assert cli(*CREATE, "--yes").exit_code == 0
        key = (
            "apiextensions.k8s.io/v1",
            "customresourcedefinitions",
            "",
            "jobsets.jobset.x-k8s.io",
        )
        kube.objects[key]["metadata"]["labels"]["rlctl.dev/controller-version"] = "v0.11.0"
        r = cli(*CREATE, "--dry-run", "-o", "json")
        js = next(c for c in json.loads(r.stdout)["changes"] if c["name"] == "jobset")
        assert js["action"] == "update" and js["diff"] == {"version": ["v0.11.0", "v0.12.0"]}

    def test_delete_removes_the_controllers_first(self, cli, fake, kube):
        assert cli(*CREATE, "--yes").exit_code == 0
        assert _controller_objects(kube)
        r = cli("cluster", "delete", "rl", *BASE[:4], "--dry-run", "-o", "json")
        plan = json.loads(r.stdout)
        cl = next(c for c in plan["changes"] if c["kind"] == "cluster")
        assert {"controller/jobset", "controller/pathways-job"} <= set(cl["depends_on"])
        r = cli("cluster", "delete", "rl", *BASE[:4], "--yes")
        assert r.exit_code == 0, r.stderr
        assert _controller_objects(kube) == []
        assert fake.is_empty()

    def test_delete_does_not_hinge_on_the_kubernetes_api(self, cli, fake, kube):
        assert cli(*CREATE, "--yes").exit_code == 0
        fake.clusters[("us-central1", "rl")]["endpoint"] = "http://127.0.0.1:9"  # closed
        r = cli("cluster", "delete", "rl", *BASE[:4], "--yes", "-o", "json")
        assert r.exit_code == 0, r.stderr
        doc = json.loads(r.stdout)
        assert any("controllers are deleted with the cluster" in n for n in doc["plan"]["notes"])
        assert fake.is_empty()
