"""Check rendered objects offline, as strictly as the API server would.

Custom resources (JobSet, RayJob, PathwaysJob, ...) are checked against their
CRD ``openAPIV3Schema`` made strict (see ``crds/README.md``): schema defaults
filled in first, ``additionalProperties: false`` on every object node that lists
``properties`` and neither allows extra fields nor preserves unknown ones,
``nullable`` mapped to a ``null`` type, then jsonschema (Draft 7). Core kinds,
and the pod templates (and Job templates) embedded in custom resources, are
checked with ``kubernetes-validate --strict``, which rejects unknown fields.

The CRD schemas are package data (``rlctl/data/crds/``, with their upstream
provenance in its README), loaded with ``importlib.resources``: an installed
rlctl must validate a run's manifests on its own, so nothing here reads a
folder outside the package (a ``shared/`` folder exists only beside a
developer's checkout). Both validators come with the ``k8s`` extra; without
them validation stops with ``MissingDependencyError`` naming it.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterator
from importlib import resources
from typing import TYPE_CHECKING, Any

from rlctl.core.errors import ConfigError, RlctlError, require_extra
from rlctl.core.install import extra_install_command
from rlctl.core.k8s import backends

if TYPE_CHECKING:  # pragma: no cover
    from importlib.abc import Traversable

KUBERNETES_VERSION = "1.34.0"  # GKE Standard with managed DRANET needs >= 1.34.1
CRDS_DIR = "data/crds"  # inside the rlctl package


def require_validators() -> None:
    """Both validators are in the ``k8s`` extra: say so instead of an ImportError."""
    require_extra("jsonschema", "k8s")
    require_extra("kubernetes_validate", "k8s")


class ManifestError(ConfigError):
    """A rendered object does not validate; ``errors`` are 'Kind/name: path: message'."""

    def __init__(self, errors: list[str]) -> None:
        shown = "; ".join(errors[:5]) + (f" (+{len(errors) - 5} more)" if len(errors) > 5 else "")
        super().__init__(f"invalid manifest: {shown}")
        self.errors = errors


def _path(parts: Any) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(root)"


# --- CRD schemas ---------------------------------------------------------------
def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of an openAPIV3Schema that rejects unknown fields and accepts nulls
    where the schema says ``nullable``."""

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(n) for n in node]
        if not isinstance(node, dict):
            return node
        node = {k: walk(v) for k, v in node.items()}
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        if node.get("nullable") and "type" in node:
            t = node["type"]
            node["type"] = [*t, "null"] if isinstance(t, list) else [t, "null"]
        return node

    return walk(schema)


def apply_defaults(schema: dict[str, Any], obj: Any) -> Any:
    """Fill in schema defaults the way the API server does (structural defaulting)."""
    if isinstance(obj, dict):
        props = schema.get("properties") or {}
        for key, sub in props.items():
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
            if key in obj:
                apply_defaults(sub, obj[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in obj:
                if key not in props:
                    apply_defaults(extra, obj[key])
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for item in obj:
            apply_defaults(schema["items"], item)
    return obj


class CrdSchemas:
    """The CRD schemas of a folder, keyed by (apiVersion, kind).

    ``folder`` is any ``importlib.resources`` Traversable: the package's own
    ``rlctl/data/crds`` (``find()``), or a plain ``Path`` in tests.
    """

    def __init__(self, folder: Traversable) -> None:
        self.folder = folder
        self._files: dict[tuple[str, str], Traversable] = {}
        self._cache: dict[tuple[str, str], tuple[dict[str, Any], Any]] = {}
        for f in sorted(folder.iterdir(), key=lambda t: t.name):
            if not (f.name.endswith(".json") and f.is_file()):
                continue
            # <kind>-<group>-<version>.json, e.g. jobset-jobset.x-k8s.io-v1alpha2.json
            stem, _, version = f.name[: -len(".json")].rpartition("-")
            kind_lower, _, group = stem.partition("-")
            self._files[(f"{group}/{version}", kind_lower)] = f

    @classmethod
    def find(cls) -> CrdSchemas | None:
        """The schemas shipped in the package (cached); None only if an install lost them."""
        return _packaged()

    def __len__(self) -> int:
        return len(self._files)

    def knows(self, api_version: str, kind: str) -> bool:
        return (api_version, kind.lower()) in self._files

    def _validator(self, api_version: str, kind: str) -> tuple[dict[str, Any], Any]:
        require_extra("jsonschema", "k8s")
        import jsonschema

        key = (api_version, kind.lower())
        if key not in self._cache:
            raw = json.loads(self._files[key].read_text())
            strict = strict_schema(raw)
            self._cache[key] = (raw, jsonschema.Draft7Validator(strict))
        return self._cache[key]

    def errors(self, obj: dict[str, Any]) -> list[str]:
        raw, validator = self._validator(obj["apiVersion"], obj["kind"])
        defaulted = apply_defaults(raw, copy.deepcopy(obj))
        return [
            f"{_path(e.absolute_path)}: {e.message}"
            for e in sorted(validator.iter_errors(defaulted), key=lambda e: list(e.path))
        ]


@functools.cache
def _packaged() -> CrdSchemas | None:
    folder = resources.files("rlctl").joinpath(CRDS_DIR)
    if not folder.is_dir():
        return None
    found = CrdSchemas(folder)
    return found if len(found) else None


# --- core kinds ------------------------------------------------------------------
def core_errors(obj: dict[str, Any], version: str = KUBERNETES_VERSION) -> list[str]:
    require_extra("kubernetes_validate", "k8s")
    import kubernetes_validate

    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{_path(e.path)}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError as e:
        return [f"no schema for {obj.get('apiVersion')} {obj.get('kind')}: {e}"]
    return []


def embedded_templates(obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, core object) for each pod/Job template embedded in a custom resource, as
    the backend that reads its kind lists them (none for a kind no backend reads)."""
    backend = backends.for_object(obj)
    if backend is not None:
        yield from backend.embedded_templates(obj)


def manifest_errors(obj: dict[str, Any], crds: CrdSchemas | None) -> list[str]:
    """Every problem found in one object, each as 'Kind/name: path: message'."""
    where = f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"
    api, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    if crds is not None and crds.knows(api, kind):
        errs = crds.errors(obj)
        for path, core in embedded_templates(obj):
            errs += [f"{path}.{e}" for e in core_errors(core)]
    elif "/" in api and not api.startswith(
        ("apps/", "batch/", "resource.k8s.io/", "rbac.authorization.k8s.io/", "policy/")
    ):
        if crds is None:  # the package data is part of every install: a broken one
            raise RlctlError(
                f"{where}: no CRD schemas to check a {kind} (rlctl/{CRDS_DIR} "
                "is missing from the installed package)",
                hint="reinstall rlctl: " + extra_install_command("k8s", force=True),
            )
        errs = [f"no CRD schema for {api} {kind}"]
    else:
        errs = core_errors(obj)
    return [f"{where}: {e}" for e in errs]


def validate_manifests(objs: list[dict[str, Any]], crds: CrdSchemas | None = None) -> None:
    """Raise ManifestError listing every problem in ``objs``."""
    require_validators()
    crds = crds if crds is not None else CrdSchemas.find()
    errors = [e for obj in objs for e in manifest_errors(obj, crds)]
    if errors:
        raise ManifestError(errors)
