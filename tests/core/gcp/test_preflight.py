"""Pre-flight checks fail before any mutation, one line each naming the fix."""

from __future__ import annotations

import pytest

from rlctl.core.errors import PreflightError
from rlctl.core.gcp import cluster, preflight


def _fails(fake, clients, spec) -> list[str]:
    with pytest.raises(PreflightError) as e:
        cluster.plan_create(clients, spec)
    assert fake.mutations() == []
    return e.value.lines


class TestPreflight:
    def test_disabled_api(self, fake, clients, spec):
        fake.enabled.discard("tpu.googleapis.com")
        (line,) = _fails(fake, clients, spec)
        assert line.startswith("API tpu.googleapis.com is not enabled")
        assert "gcloud services enable tpu.googleapis.com --project p" in line

    def test_accelerator_not_offered_in_zone(self, fake, clients, spec):
        fake.tpu_types["us-central1-b"] = ["v5litepod-16", "v6e-8"]
        (line,) = _fails(fake, clients, spec)
        assert "v6e-16 is not offered in zone us-central1-b" in line and "--zone" in line

    def test_gpu_machine_not_offered(self, fake, clients, spec):
        spec.accelerators = ["a3-highgpu-8g"]
        fake.machine_types["us-central1-b"] = {"e2-standard-8"}
        (line,) = _fails(fake, clients, spec)
        assert "a3-highgpu-8g is not offered" in line

    def test_bucket_in_another_region(self, fake, clients, spec):
        b = clients.storage.bucket("rl-runs")
        b.labels = {"managed-by": "rlctl"}
        clients.storage.create_bucket(b, location="europe-west4")
        fake.requests.clear()
        (line,) = _fails(fake, clients, spec)
        assert "is in EUROPE-WEST4, not in the cluster region us-central1" in line
        clients.storage.bucket("rl-runs").delete()

    def test_bucket_location_flag_in_another_region(self, fake, clients, spec):
        spec.bucket = {"name": "rl-runs", "location": "us-east1"}
        (line,) = _fails(fake, clients, spec)
        assert "--bucket-location us-central1" in line

    def test_invalid_names_and_versions_are_listed_together(self, fake, clients, spec):
        spec.namespace = "Bad_NS"
        spec.bucket = {"name": "goog-bucket"}
        spec.version = "1.20.0-gke.1"
        lines = _fails(fake, clients, spec)
        assert len(lines) == 3
        assert any("namespace" in x for x in lines) and any("goog" in x for x in lines)
        assert any("GKE version 1.20.0-gke.1 is not offered" in x for x in lines)

    def test_dranet_needs_a_recent_gke(self, fake, clients, spec):
        spec.release_channel = "stable"  # fake's stable default is 1.33
        (line,) = _fails(fake, clients, spec)
        assert "too old for managed DRANET" in line

    def test_versions_compare_numerically(self):
        v = preflight.parse_gke_version
        assert v("1.34.10-gke.1") > v("1.34.9-gke.99999")
        assert v("1.34.1-gke.1829001") >= v(preflight.DRANET_MIN["standard"])
