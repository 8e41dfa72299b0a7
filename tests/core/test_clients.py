"""The client factory reads per-service endpoint overrides and anonymous mode from
the environment, as gcloud's ``api_endpoint_overrides`` and
``auth/disable_credentials`` properties do, for users behind private or regional
endpoints and for scripts against local fakes."""

from __future__ import annotations

import pytest

from rlctl.core.clients import (
    Clients,
    credentials_disabled,
    endpoints_from_env,
)
from rlctl.core.errors import ConfigError

URL = "http://127.0.0.1:8123"


class TestEndpointsFromEnv:
    def test_each_service_is_read_and_normalised(self):
        env = {
            "RLCTL_API_ENDPOINT_OVERRIDES_CONTAINER": URL + "/",
            "RLCTL_API_ENDPOINT_OVERRIDES_COMPUTE": " https://compute-psc.p.googleapis.com ",
            "RLCTL_API_ENDPOINT_OVERRIDES_TPU": "",  # empty: unset
            "PATH": "/bin",
        }
        assert endpoints_from_env(env) == {
            "container": URL,
            "compute": "https://compute-psc.p.googleapis.com",
        }

    @pytest.mark.parametrize(
        ("variable", "value", "says"),
        [
            ("RLCTL_API_ENDPOINT_OVERRIDES_COMPUTEE", URL, "unknown service 'computee'"),
            ("RLCTL_API_ENDPOINT_OVERRIDES_STORAGE", "127.0.0.1:9", "not an endpoint URL"),
            ("RLCTL_API_ENDPOINT_OVERRIDES_STORAGE", "ftp://h", "not an endpoint URL"),
            ("RLCTL_API_ENDPOINT_OVERRIDES_COMPUTE", "https://h/compute/v1/", "without a path"),
        ],
    )
    def test_a_bad_override_is_a_config_error_not_a_call_to_production(self, variable, value, says):
        with pytest.raises(ConfigError, match=says) as e:
            endpoints_from_env({variable: value})
        assert e.value.hint

    def test_disable_credentials_is_a_boolean(self):
        assert credentials_disabled({"RLCTL_AUTH_DISABLE_CREDENTIALS": "True"})
        assert not credentials_disabled({"RLCTL_AUTH_DISABLE_CREDENTIALS": "0"})
        assert not credentials_disabled({})
        with pytest.raises(ConfigError, match="not a boolean"):
            credentials_disabled({"RLCTL_AUTH_DISABLE_CREDENTIALS": "maybe"})


class TestClientsFromEnv:
    def test_overrides_apply_and_explicit_endpoints_win(self, monkeypatch):
        monkeypatch.setenv("RLCTL_API_ENDPOINT_OVERRIDES_CONTAINER", URL)
        monkeypatch.setenv("RLCTL_API_ENDPOINT_OVERRIDES_COMPUTE", URL)
        c = Clients("p", "r", endpoints={"compute": "http://127.0.0.1:9"})
        assert c.endpoints == {"container": URL, "compute": "http://127.0.0.1:9"}
        assert not c.anonymous

    def test_anonymous_mode_never_asks_for_default_credentials(self, monkeypatch):
        from google.auth.credentials import AnonymousCredentials

        monkeypatch.setenv("RLCTL_AUTH_DISABLE_CREDENTIALS", "true")
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/key.json")
        assert isinstance(Clients("p", "r").credentials, AnonymousCredentials)

    def test_the_real_client_calls_the_overridden_endpoint(self, fake, monkeypatch):
        """The GKE client, built by the production factory from the environment alone,
        lists the fake's clusters (an empty list, not a call to Google)."""
        monkeypatch.setenv("RLCTL_API_ENDPOINT_OVERRIDES_CONTAINER", fake.url)
        monkeypatch.setenv("RLCTL_AUTH_DISABLE_CREDENTIALS", "true")
        c = Clients("p", "us-central1", retry_deadline=5.0)
        listed = c.container.list_clusters(parent="projects/p/locations/us-central1")
        assert list(listed.clusters) == []
        assert fake.find("GET", r"^/v1/projects/p/locations/us-central1/clusters")
