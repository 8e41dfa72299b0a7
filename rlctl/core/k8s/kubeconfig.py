"""A ``kubernetes`` client configuration from a GKE endpoint, its CA and a token.

No kubeconfig file, gcloud or auth plugin: the caller passes the cluster's
endpoint and CA certificate (from the GKE API) and an access token (from ADC),
or a callable that returns a fresh token. The token lives only in this process's
memory: it is never logged and never written to disk (only the public CA
certificate is, because urllib3 reads CA bundles from a file).
"""

from __future__ import annotations

import atexit
import base64
import binascii
import os
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING

from rlctl.core.errors import ConfigError

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, Configuration

TokenSource = str | Callable[[], str]


def _ca_file(ca_cert_b64: str) -> str:
    try:
        pem = base64.b64decode(ca_cert_b64, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ConfigError("the cluster CA certificate is not valid base64") from e
    if b"BEGIN CERTIFICATE" not in pem:
        raise ConfigError("the cluster CA certificate is not a PEM certificate")
    fd, path = tempfile.mkstemp(prefix="rlctl-ca-", suffix=".pem")
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    atexit.register(_remove, path)
    return path


def _remove(path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)


def build_configuration(
    endpoint: str, ca_cert_b64: str | None, token: TokenSource
) -> Configuration:
    """Args:
    endpoint: the GKE cluster's ``endpoint`` (an IP or host; ``https://`` is added),
        or a full URL (tests use ``http://127.0.0.1:PORT``).
    ca_cert_b64: ``masterAuth.clusterCaCertificate`` (base64 PEM); None skips TLS
        verification only for plain-http loopback URLs.
    token: an OAuth access token, or a function returning a fresh one (called
        again before each request via the client's refresh hook).
    """
    from kubernetes import client

    host = endpoint if "://" in endpoint else f"https://{endpoint}"
    cfg = client.Configuration()
    cfg.host = host.rstrip("/")
    cfg.debug = False  # http.client debug output would print the Authorization header
    cfg.logger_file = None
    if ca_cert_b64:
        cfg.ssl_ca_cert = _ca_file(ca_cert_b64)
        cfg.verify_ssl = True
    elif host.startswith("https://"):
        raise ConfigError(
            f"no CA certificate for {host}",
            hint="pass the cluster's masterAuth.clusterCaCertificate",
        )
    cfg.api_key_prefix = {"authorization": "Bearer"}
    if callable(token):
        source = token

        def refresh(c: Configuration) -> None:
            # no token (anonymous credentials: emulators and local fakes only) means no
            # Authorization header, not an empty or "None" one the client cannot send
            value = source()
            if value:
                c.api_key["authorization"] = value
            else:
                c.api_key.pop("authorization", None)

        cfg.api_key = {}
        refresh(cfg)
        # the client's Configuration sets it to None in __init__, so mypy infers None
        cfg.refresh_api_key_hook = refresh  # type: ignore[assignment]
    else:
        cfg.api_key = {"authorization": token} if token else {}
    return cfg


def api_client(cfg: Configuration) -> ApiClient:
    from kubernetes import client

    api = client.ApiClient(cfg)
    api.user_agent = "rlctl"
    return api
