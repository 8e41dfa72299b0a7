"""The controllers ``cluster create`` installs, against the fake Kubernetes API with the
real ``kubernetes`` client: shipped manifests, labels, apply once, wait for the CRDs,
remove only what is rlctl's, and the pre-submit check of a run."""

from __future__ import annotations

import hashlib
from importlib import resources

import pytest

from rlctl.core.errors import CloudError, NotFoundError
from rlctl.core.k8s import apply as apply_mod
from rlctl.core.k8s import backends, controllers
from rlctl.core.k8s.controllers import CONTROLLERS, by_name, manifests

JOBSET, PATHWAYS = by_name("jobset"), by_name("pathways-job")


class TestShippedManifests:
    def test_pinned_versions_and_files_in_the_package(self):
        assert [(c.name, c.version) for c in CONTROLLERS] == [
            ("jobset", "v0.12.0"),
            ("pathways-job", "v0.1.4"),
        ]
        readme = resources.files("rlctl").joinpath("data/controllers/README.md").read_text()
        for c in CONTROLLERS:
            data = resources.files("rlctl").joinpath("data/controllers", c.manifest)
            assert data.is_file()
            # the README's provenance table names the file's exact content
            assert hashlib.sha256(data.read_bytes()).hexdigest() in readme
            assert c.version in c.manifest

    @pytest.mark.parametrize("c", CONTROLLERS, ids=lambda c: c.name)
    def test_every_object_is_labelled_and_addressable(self, c):
        objs = manifests(c)
        kinds = [o["kind"] for o in objs]
        assert kinds[0] == "Namespace" and "CustomResourceDefinition" in kinds
        assert "Deployment" in kinds
        for o in objs:
            labels = o["metadata"]["labels"]
            assert labels["managed-by"] == "rlctl"
            assert labels[controllers.CONTROLLER_LABEL] == c.name
            assert labels[controllers.VERSION_LABEL] == c.version
            # KubeApi knows the REST path of every kind (else apply would refuse it)
            apply_mod._collection(o["apiVersion"], o["kind"], "x")
        crds = [o["metadata"]["name"] for o in objs if o["kind"] == "CustomResourceDefinition"]
        assert list(c.crds) == crds
        # fresh copies: a caller's change does not leak into the next install
        objs[0]["metadata"]["labels"]["x"] = "y"
        assert "x" not in manifests(c)[0]["metadata"]["labels"]

    def test_images_are_the_release_images(self):
        def images(c):
            return [
                ct["image"]
                for o in manifests(c)
                if o["kind"] == "Deployment"
                for ct in o["spec"]["template"]["spec"]["containers"]
            ]

        assert images(JOBSET) == ["registry.k8s.io/jobset/jobset:v0.12.0"]
        assert images(PATHWAYS) == [
            "us-docker.pkg.dev/cloud-tpu-v2-images/pathways-job/pathwaysjob-controller:v0.1.4"
        ]

    @pytest.mark.parametrize(
        ("c", "backend", "kind"),
        [(JOBSET, "jobset", "JobSet"), (PATHWAYS, "pathways", "PathwaysJob")],
        ids=["jobset", "pathways"],
    )
    def test_rendered_workloads_validate_against_the_installed_crd(
        self, c, backend, kind, tmp_path, crds
    ):
        """What rlctl renders must be accepted by the CRD it installs, not only by the
        schema it validates with (rlctl/data/crds may be of another version)."""
        import json

        from rlctl.core.k8s.render import render_workload
        from rlctl.core.k8s.validate import CrdSchemas, validate_manifests
        from tests.core.k8s.test_render import view

        crd = next(o for o in manifests(c) if o["kind"] == "CustomResourceDefinition")
        (version,) = [v for v in crd["spec"]["versions"] if v.get("served") and v.get("storage")]
        group = crd["spec"]["group"]
        (tmp_path / f"{kind.lower()}-{group}-{version['name']}.json").write_text(
            json.dumps(version["schema"]["openAPIV3Schema"])
        )
        objs = render_workload(view(backend, "tpu", 2))
        validate_manifests(objs, CrdSchemas(tmp_path))


class TestInstall:
    def test_applies_every_object_once_then_waits_for_the_crd(self, api, kube):
        kube.crd_delay = 2  # the API server takes a moment to serve the new kind
        sleeps = []
        done = controllers.install(api, JOBSET, interval=0.5, sleep=sleeps.append)
        assert len(done) == len(manifests(JOBSET))
        patches = [r for r in kube.requests if r["method"] == "PATCH"]
        assert len(patches) == len(done)
        assert {r["query"]["fieldManager"] for r in patches} == {"rlctl"}
        assert {r["content_type"] for r in patches} == {"application/apply-patch+yaml"}
        assert sleeps == [0.5, 0.5]  # polled until Established
        assert (
            "apiextensions.k8s.io/v1",
            "customresourcedefinitions",
            "",
            "jobsets.jobset.x-k8s.io",
        ) in kube.objects
        assert (
            "apps/v1",
            "deployments",
            "jobset-system",
            "jobset-controller-manager",
        ) in kube.objects
        assert "Namespace/jobset-system" in kube.names(cluster=True)
        have = controllers.installed(api, JOBSET)
        assert have == controllers.Installed(version="v0.12.0", ours=True)

    def test_a_crd_that_never_establishes_is_one_clear_error(self, api, kube):
        kube.crd_delay = 10**6
        with pytest.raises(CloudError, match="not Established after 0s"):
            controllers.install(api, JOBSET, interval=0.0, timeout=0.0, sleep=lambda s: None)

    def test_uninstall_removes_only_rlctl_labelled_objects(self, api, kube):
        controllers.install(api, PATHWAYS, interval=0.0)
        # someone else's ClusterRole of the same name must stay
        key = ("rbac.authorization.k8s.io/v1", "clusterroles", "", "pathways-job-metrics-reader")
        kube.objects[key]["metadata"]["labels"] = {"owner": "platform-team"}
        removed = controllers.uninstall(api, PATHWAYS)
        assert "ClusterRole/pathways-job-metrics-reader" not in removed
        assert len(removed) == len(manifests(PATHWAYS)) - 1
        assert [k for k in kube.objects] == [key]
        # the CRD goes last: webhooks and the Deployment first
        deletes = [r["path"] for r in kube.requests if r["method"] == "DELETE"]
        assert deletes[-1].endswith("/namespaces/pathways-job-system")
        assert deletes.index(next(d for d in deletes if "deployments" in d)) < deletes.index(
            next(d for d in deletes if "customresourcedefinitions" in d)
        )
        assert controllers.installed(api, PATHWAYS) is None

    def test_a_foreign_install_is_reported_not_ours(self, api, kube):
        kube.put(
            "apiextensions.k8s.io/v1",
            "customresourcedefinitions",
            {"metadata": {"name": "jobsets.jobset.x-k8s.io", "namespace": ""}},
        )
        assert controllers.installed(api, JOBSET) == controllers.Installed(None, ours=False)


class TestRunChecks:
    def test_ready_cluster_has_nothing_missing(self, api, kube):
        kube.seed_ready()
        for backend in ("jobset", "pathways", "ray"):  # lws: no controller rlctl installs
            assert (
                controllers.missing_for_run(api, "c", backends.get(backend), "default", "rlctl")
                == []
            )

    def test_each_missing_piece_is_one_line_naming_its_fix(self, api, kube):
        lines = controllers.missing_for_run(
            api, "c", backends.get("jobset"), "ml", "trainer", "us-east5"
        )
        assert lines == [
            "the cluster has no jobsets.jobset.x-k8s.io CRD (JobSet controller v0.12.0 is "
            "not installed): run 'rlctl cluster create c --region us-east5', which installs it",
            "namespace 'ml' does not exist: run 'rlctl cluster create c --region us-east5 "
            "--namespace ml --service-account trainer'",
        ]
        (ray,) = controllers.missing_for_run(api, "c", backends.get("ray"), "ml", "trainer")[:1]
        assert "RayOperator=ENABLED" in ray and "gcloud container clusters update c" in ray
        kube.seed_ready("ml", "other")
        (ksa,) = controllers.missing_for_run(api, "c", backends.get("pathways"), "ml", "trainer")
        assert ksa.startswith("service account ml/trainer does not exist")

    def test_a_workload_whose_kind_is_not_served_names_the_missing_controller(self, api, kube):
        """The API server answers 'the server could not find the requested resource' for
        a kind no CRD defines; that is not "RayJob/x not found"."""
        kube.served_only = True
        with pytest.raises(NotFoundError) as e:
            api.apply(
                {
                    "apiVersion": "jobset.x-k8s.io/v1alpha2",
                    "kind": "JobSet",
                    "metadata": {"name": "x"},
                    "spec": {},
                }
            )
        assert "does not serve the kind of JobSet/x: its CRD is not installed" in e.value.message
        assert "rlctl cluster create" in (e.value.hint or "")
        controllers.install(api, JOBSET, interval=0.0)
        api.apply(
            {
                "apiVersion": "jobset.x-k8s.io/v1alpha2",
                "kind": "JobSet",
                "metadata": {"name": "x"},
                "spec": {},
            }
        )


def test_an_unreachable_api_is_a_cloud_error_not_a_traceback():
    """urllib3 gives up with MaxRetryError (not an OSError): still one rlctl error."""
    from rlctl.core.k8s.apply import KubeApi
    from rlctl.core.k8s.kubeconfig import api_client, build_configuration

    api = KubeApi(api_client(build_configuration("http://127.0.0.1:9", None, "")))
    with pytest.raises(
        CloudError,
        match="cannot reach the cluster API for CustomResourceDefinition/jobsets.jobset.x-k8s.io",
    ):
        controllers.installed(api, JOBSET)
