"""The controllers a cluster's workloads need, and the namespace and KSA its runs use.

GKE ships neither the JobSet controller (the default backend's workload, and what a
PathwaysJob becomes) nor the PathwaysJob controller, so ``rlctl cluster create``
installs both from manifests shipped in the package at pinned versions
(``rlctl/data/controllers``, provenance in its README): nothing is fetched from the
internet at run time, and the version a cluster gets is the one rlctl was tested
with. The Ray operator is GKE's own add-on, enabled with the cluster.

Every object is labelled ``managed-by=rlctl`` plus the controller's name and
version, server-side applied (field manager ``rlctl``), and removed by label by
``uninstall``; an object not carrying rlctl's labels (a controller someone else
installed) is never touched. ``missing_for_run`` is the pre-submit check of
``train --cluster``: one line per missing piece, each naming the command that
fixes it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

from rlctl.core.errors import CloudError
from rlctl.core.k8s import backends
from rlctl.core.k8s.apply import KubeApi
from rlctl.core.k8s.backends.base import Backend, Controller

CONTROLLERS_DIR = "data/controllers"  # inside the rlctl package
CONTROLLER_LABEL = "rlctl.dev/controller"
VERSION_LABEL = "rlctl.dev/controller-version"
CRD_API = ("apiextensions.k8s.io/v1", "CustomResourceDefinition")


# Every controller the registered backends need, each once, in install order (JobSet's
# before pathways-job's, which makes JobSets). A backend's folder names its own.
CONTROLLERS: tuple[Controller, ...] = tuple(
    dict.fromkeys(c for b in backends.registered() for c in b.controllers)
)


def by_name(name: str) -> Controller:
    return next(c for c in CONTROLLERS if c.name == name)


def provider(crd: str) -> Controller | None:
    """The controller rlctl installs for ``crd`` (None: GKE's Ray add-on, or foreign)."""
    return next((c for c in CONTROLLERS if crd in c.crds), None)


# --- manifests (pure) ---------------------------------------------------------------
@functools.cache
def _raw(manifest: str) -> tuple[dict[str, Any], ...]:
    import yaml

    text = resources.files("rlctl").joinpath(CONTROLLERS_DIR, manifest).read_text()
    return tuple(d for d in yaml.safe_load_all(text) if d)


def manifests(c: Controller) -> list[dict[str, Any]]:
    """The controller's objects in apply order, each labelled as rlctl's (fresh copies)."""
    import copy

    out = []
    for obj in _raw(c.manifest):
        obj = copy.deepcopy(obj)
        labels = obj.setdefault("metadata", {}).setdefault("labels", {}) or {}
        labels.update(
            {
                "managed-by": "rlctl",
                "app.kubernetes.io/managed-by": "rlctl",
                CONTROLLER_LABEL: c.name,
                VERSION_LABEL: c.version,
            }
        )
        obj["metadata"]["labels"] = labels
        out.append(obj)
    return out


def _ours(obj: dict[str, Any] | None, c: Controller) -> bool:
    labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
    return labels.get("managed-by") == "rlctl" and labels.get(CONTROLLER_LABEL) == c.name


# --- observe --------------------------------------------------------------------------
@dataclass(frozen=True)
class Installed:
    """What the cluster has of a controller: None = absent; ``ours`` = rlctl's labels."""

    version: str | None
    ours: bool


def installed(api: KubeApi, c: Controller) -> Installed | None:
    """The controller's state, read from its (first) CRD's labels."""
    crd = api.get(*CRD_API, c.crds[0])
    if crd is None:
        return None
    labels = (crd.get("metadata") or {}).get("labels") or {}
    return Installed(version=labels.get(VERSION_LABEL), ours=_ours(crd, c))


def established(crd: dict[str, Any] | None) -> bool:
    conditions = ((crd or {}).get("status") or {}).get("conditions") or []
    return any(x.get("type") == "Established" and x.get("status") == "True" for x in conditions)


# --- act --------------------------------------------------------------------------------
def install(
    api: KubeApi,
    c: Controller,
    on_poll: Callable[[str], None] | None = None,
    interval: float = 2.0,
    timeout: float = 300.0,
    sleep: Callable[[float], None] = time.sleep,
) -> list[str]:
    """Server-side apply every object, then wait until its CRDs are Established
    (the API server serves the kind only then; a workload applied earlier gets 404).
    Returns 'Kind/name' of what was applied."""
    notify = on_poll or (lambda _s: None)
    done = []
    for obj in manifests(c):
        api.apply(obj)
        done.append(f"{obj['kind']}/{obj['metadata']['name']}")
    notify(f"applied {len(done)} objects, waiting for CRDs")
    deadline = time.monotonic() + timeout
    for crd in c.crds:
        while not established(api.get(*CRD_API, crd)):
            if time.monotonic() > deadline:
                raise CloudError(
                    f"{c.title} {c.version}: CRD {crd} not Established after {timeout:.0f}s",
                    hint="see 'kubectl get crd " + crd + " -o yaml'; re-running "
                    "'rlctl cluster create' resumes",
                )
            sleep(interval)
    notify("CRDs established")
    return done


def uninstall(api: KubeApi, c: Controller) -> list[str]:
    """Delete the controller's objects that carry rlctl's labels, in reverse order
    (webhooks and the Deployment before the CRD, so nothing acts on half of it)."""
    removed = []
    for obj in reversed(manifests(c)):
        md = obj["metadata"]
        have = api.get(obj["apiVersion"], obj["kind"], md["name"], md.get("namespace"))
        if (
            have is not None
            and _ours(have, c)
            and api.delete(obj["apiVersion"], obj["kind"], md["name"], md.get("namespace"))
        ):
            removed.append(f"{obj['kind']}/{md['name']}")
    return removed


# --- the namespace and KSA of runs -------------------------------------------------------
def _labels() -> dict[str, str]:
    return {"managed-by": "rlctl", "app.kubernetes.io/managed-by": "rlctl"}


def namespace_object(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": _labels()},
    }


def service_account_object(namespace: str, name: str) -> dict[str, Any]:
    """The KSA runs use; its bucket access is the IAM binding on its Workload Identity
    principal, so it needs no annotation (see serviceaccount.yaml.j2)."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": name, "namespace": namespace, "labels": _labels()},
    }


def has_namespace(api: KubeApi, namespace: str) -> bool:
    return api.get("v1", "Namespace", namespace) is not None


def has_service_account(api: KubeApi, namespace: str, name: str) -> bool:
    return api.get("v1", "ServiceAccount", name, namespace) is not None


def ensure_namespace(api: KubeApi, namespace: str) -> bool:
    """Create the namespace unless it exists (never updated: it may be someone else's)."""
    return api.create_if_missing(namespace_object(namespace))


def ensure_service_account(api: KubeApi, namespace: str, name: str) -> bool:
    return api.create_if_missing(service_account_object(namespace, name))


# --- the pre-submit check of a run --------------------------------------------------------
def missing_for_run(
    api: KubeApi,
    cluster: str,
    backend: Backend,
    namespace: str,
    service_account: str,
    region: str | None = None,
) -> list[str]:
    """One line per thing the run's workload needs and the cluster lacks, each naming
    the command that fixes it (empty: ready)."""
    lines = []
    crd = backend.crd
    where = f" --region {region}" if region else ""
    if crd is not None and not established(api.get(*CRD_API, crd)):
        lines.append(f"the cluster has no {crd} CRD {backend.crd_fix(cluster, where)}")
    create = (
        f"rlctl cluster create {cluster}{where} --namespace {namespace} "
        f"--service-account {service_account}"
    )
    if not has_namespace(api, namespace):
        lines.append(f"namespace {namespace!r} does not exist: run '{create}'")
    elif not has_service_account(api, namespace, service_account):
        lines.append(
            f"service account {namespace}/{service_account} does not exist "
            f"(it is the one bound to the run bucket): run '{create}'"
        )
    return lines
