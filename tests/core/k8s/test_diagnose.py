"""Pure diagnosis and schema helpers (no server)."""

from __future__ import annotations

import json
import shutil

from rlctl.core.k8s.diagnose import diagnose
from rlctl.core.k8s.validate import CrdSchemas, apply_defaults, strict_schema


def gpu_pod(**status) -> dict:
    return {
        "metadata": {"name": "r1-gpu-0-0"},
        "spec": {
            "nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
            "containers": [{"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": 8}}}],
        },
        "status": {"phase": "Pending", **status},
    }


class TestDiagnose:
    def test_insufficient_gpu(self):
        d = diagnose(
            {"kind": "JobSet", "status": {}},
            [
                gpu_pod(
                    conditions=[
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",
                        }
                    ]
                )
            ],
            [],
        )
        assert d.reason == (
            "unschedulable: insufficient nvidia.com/gpu (8 per pod) on nodes "
            "with gke-accelerator=nvidia-h100-80gb"
        )

    def test_missing_secret_is_a_config_error(self):
        d = diagnose(
            None,
            [
                gpu_pod(
                    containerStatuses=[
                        {
                            "name": "trainer",
                            "state": {
                                "waiting": {
                                    "reason": "CreateContainerConfigError",
                                    "message": 'secret "r1-hf-token" not found',
                                }
                            },
                        }
                    ]
                )
            ],
            [],
        )
        assert d.reason == 'container config error in r1-gpu-0-0: secret "r1-hf-token" not found'

    def test_ray_job_states(self):
        def ray(**status):
            return {"kind": "RayJob", "status": status}

        assert diagnose(ray(jobDeploymentStatus="Initializing"), [], []).phase == "pending"
        assert diagnose(ray(jobStatus="RUNNING"), [], []).phase == "running"
        failed = diagnose(
            ray(jobDeploymentStatus="Failed", jobStatus="FAILED", message="driver exited 1"), [], []
        )
        assert (failed.phase, failed.reason) == ("failed", "driver exited 1")

    def test_some_pods_pending(self):
        running = {"metadata": {"name": "a"}, "status": {"phase": "Running"}}
        waiting = {"metadata": {"name": "b"}, "status": {"phase": "Pending"}}
        d = diagnose({"kind": "JobSet"}, [running, waiting], [])
        assert (d.phase, d.reason, d.pods) == (
            "pending",
            "1 of 2 pods pending",
            {"Running": 1, "Pending": 1},
        )


class TestSchemaHelpers:
    def test_strict_schema_closes_objects_and_maps_nullable(self):
        s = strict_schema(
            {
                "type": "object",
                "properties": {
                    "a": {"type": "string", "nullable": True},
                    "free": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                        "properties": {"x": {"type": "string"}},
                    },
                    "map": {"type": "object", "additionalProperties": {"type": "string"}},
                },
            }
        )
        assert s["additionalProperties"] is False
        assert s["properties"]["a"]["type"] == ["string", "null"]
        assert "additionalProperties" not in s["properties"]["free"]
        assert s["properties"]["map"]["additionalProperties"] == {"type": "string"}

    def test_defaults_are_filled_like_the_server(self):
        schema = {
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "properties": {
                        "mode": {"type": "string", "default": "K8sJobMode"},
                        "items": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {"n": {"type": "integer", "default": 1}},
                            },
                        },
                    },
                }
            },
        }
        obj = apply_defaults(schema, {"spec": {"items": [{}, {"n": 3}]}})
        assert obj == {"spec": {"mode": "K8sJobMode", "items": [{"n": 1}, {"n": 3}]}}

    def test_a_folder_of_schemas_is_keyed_by_api_version_and_kind(self, crds, tmp_path):
        shutil.copy(crds.folder / "rayjob-ray.io-v1.json", tmp_path)
        (tmp_path / "README.md").write_text("not a schema")
        found = CrdSchemas(tmp_path)
        assert len(found) == 1 and found.folder == tmp_path
        assert found.knows("ray.io/v1", "RayJob") and not found.knows(
            "jobset.x-k8s.io/v1alpha2", "JobSet"
        )
        assert json.loads((tmp_path / "rayjob-ray.io-v1.json").read_text())["type"] == "object"
