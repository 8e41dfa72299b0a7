"""Render a run's Kubernetes objects from ``rlctl/templates``.

Templates are data: one Jinja2 Environment (PackageLoader + StrictUndefined),
fed a typed ``WorkloadView``; every value is emitted with ``tojson``, names are
DNS-1035 labels checked before rendering, and the YAML is parsed back into
dicts. Which workload template (and extra ConfigMap files) a backend renders is
its ``Backend``'s (``backends/``). The caller validates the dicts (``validate.py``)
before applying them.
No secret value is ever part of the view: the HF token is referenced by Secret
name only.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rlctl.core.config.infra import DEFAULT_KSA, DEFAULT_NAMESPACE
from rlctl.core.errors import ConfigError
from rlctl.core.k8s import backends
from rlctl.core.k8s.backends.base import RUN_LABEL, Backend
from rlctl.core.k8s.kueue import PRIORITY_LABEL, QUEUE_LABEL
from rlctl.core.k8s.shapes import SliceShape
from rlctl.core.names import validate_name
from rlctl.core.units import quantity

__all__ = ["RUN_LABEL", "WorkloadView", "make_view", "render_workload"]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")


class EnvVar(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    value: str

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _ENV_NAME.fullmatch(v):
            raise ValueError(f"{v!r} is not an environment variable name")
        return v


class WorkloadView(BaseModel):
    """Everything every backend's template may use; built by ``submit`` from the spec and
    shape. What one backend's templates need beside it (Ray's version, the Pathways head's
    pool) is that backend's own (``Backend.view_fields``: ``b`` in its templates)."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    run: str
    namespace: str = DEFAULT_NAMESPACE
    backend: Backend = Field(description="The run's backend (a name is resolved once).")
    image: str = Field(min_length=1)
    run_uri: str = Field(description="gs://BUCKET/PREFIX/RUN: where the trainer's run lives.")
    shape: SliceShape
    service_account: str = DEFAULT_KSA
    hf_secret: str | None = Field(None, description="Secret holding the HF token, by name.")
    hf_secret_key: str = "token"
    max_restarts: int = Field(3, ge=0)
    min_slices: int = Field(
        1, ge=1, description="An elastic backend's fewest slices the job may shrink to."
    )
    queue: str | None = Field(
        None, description="Kueue LocalQueue of the namespace the workload waits in."
    )
    priority: str | None = Field(None, description="Kueue WorkloadPriorityClass, by name.")
    dcn_networks: list[str] = Field(default_factory=list)
    cpu: str = Field(
        "",
        description="Per accelerator host pod; '' = the catalog's "
        "allocatable of the machine type, less headroom.",
    )
    memory: str = Field(
        "",
        description="Per accelerator host pod, requested and limited; "
        "'' = from the catalog like cpu.",
    )
    megascale_port: int = Field(
        9915,
        ge=1,
        le=65535,
        description="libtpu's DCN port (the seeds' 9915; 8080 is taken by metrics exports).",
    )
    rollout_engine: str = Field(
        "vanilla",
        pattern=r"^(auto|vanilla|vllm)$",
        description="The engine the pods' trainer samples with "
        "(runs/submit.py cluster_engine), shown on the workload.",
    )
    env: list[EnvVar] = Field(default_factory=list)
    generator: bool = Field(
        False,
        description="A pipelined run's generator in pods of its own "
        "(rollout.placement=process): one host of the run's accelerator beside the "
        "learner's (shape), for a backend that has a generator group.",
    )
    gcs_buckets: list[str] = Field(
        default_factory=list,
        description="Buckets mounted read-only at /gcs/BUCKET (GCS FUSE CSI) for gs:// inputs.",
    )

    @field_validator("run")
    @classmethod
    def _run(cls, v: str) -> str:
        return validate_name(v, "run")

    @field_validator("backend", mode="before")
    @classmethod
    def _backend(cls, v: object) -> object:
        if isinstance(v, Backend):
            return v
        found = backends.resolve(v)
        if found is None:
            raise ValueError(f"{v!r} is not a backend: one of {', '.join(backends.names())}")
        return found

    @field_validator("namespace", "service_account")
    @classmethod
    def _k8s_name(cls, v: str) -> str:
        return validate_name(v, "Kubernetes object", max_len=63)

    @field_validator("queue", "priority")
    @classmethod
    def _kueue_name(cls, v: str | None) -> str | None:
        """A LocalQueue's or a WorkloadPriorityClass's name: a DNS-1123 subdomain, and a
        label value (at most 63 characters) where it is written."""
        if v is not None and not (len(v) <= 63 and _SUBDOMAIN.fullmatch(v)):
            raise ValueError(
                f"{v!r} is not a Kueue object's name (lowercase letters, digits, '-' and "
                "'.', starting and ending with a letter or digit, at most 63 characters)"
            )
        return v

    @field_validator("hf_secret")
    @classmethod
    def _secret(cls, v: str | None) -> str | None:
        return None if v is None else validate_name(v, "secret", max_len=63)

    @field_validator("dcn_networks")
    @classmethod
    def _networks(cls, v: list[str]) -> list[str]:
        return [validate_name(n, "network", max_len=63) for n in v]

    @field_validator("gcs_buckets")
    @classmethod
    def _buckets(cls, v: list[str]) -> list[str]:
        for b in v:
            if not _BUCKET.fullmatch(b):
                raise ValueError(f"{b!r} is not a bucket name")
        return v

    @model_validator(mode="before")
    @classmethod
    def _host_resources(cls, data: Any) -> Any:
        """Unset cpu/memory: what a node of the hosts' pool offers a pod (``config.nodes``:
        allocatable after threads per core and GKE's reservations, less DaemonSets)."""
        if not isinstance(data, dict):
            return data
        from rlctl.core.config.nodes import host_pod_resources

        if data.get("cpu") and data.get("memory"):
            return data

        shape = data.get("shape")
        if isinstance(shape, dict):
            shape = SliceShape(**shape)
        found = (
            None
            if shape is None
            else host_pod_resources(shape.machine_type, shape.threads_per_core)
        )
        cpu, memory = found or ("8", "32Gi")
        return {**data, "cpu": data.get("cpu") or cpu, "memory": data.get("memory") or memory}

    @field_validator("cpu", "memory")
    @classmethod
    def _quantity(cls, v: str) -> str:
        quantity(v)  # ValueError: "'lots' is not a Kubernetes quantity"
        return v

    @field_validator("run_uri")
    @classmethod
    def _uri(cls, v: str) -> str:
        if not v.startswith("gs://") or any(c.isspace() for c in v):
            raise ValueError(f"{v!r}: a cluster run needs a gs:// run store")
        return v

    @model_validator(mode="after")
    def _fits(self) -> WorkloadView:
        if self.backend.tpu_only and self.shape.kind != "tpu":
            raise ValueError(f"the {self.backend.name} backend runs on TPU slices only")
        if self.min_slices > self.shape.num_slices:
            raise ValueError("min_slices is larger than the number of slices")
        if (self.queue or self.priority) and not self.backend.queueable:
            raise ValueError(
                f"Kueue has no integration for the {self.backend.name} backend's "
                f"{self.backend.kind}: drop --queue and --priority, or use another --backend"
            )
        return self

    @property
    def queue_labels(self) -> dict[str, str]:
        """What puts the workload in a Kueue queue, and its priority: labels on the job
        object that Kueue's job integrations read."""
        out = {}
        if self.queue:
            out[QUEUE_LABEL] = self.queue
        if self.priority:
            out[PRIORITY_LABEL] = self.priority
        return out

    # derived names, one place
    @property
    def store_root(self) -> str:
        """The run store the run is in (``gs://BUCKET/PREFIX``), as a generator opens it
        (``generate --root``)."""
        return self.run_uri.rsplit("/", 1)[0]

    @property
    def config_map(self) -> str:
        """The ConfigMap of the backend's extra files (mounted at /etc/rlctl)."""
        return f"{self.run}-config"

    @property
    def has_config_files(self) -> bool:
        return bool(self.backend.config_files)

    @property
    def gcs_mount_options(self) -> str:
        """The GCS FUSE mounts' options: the image runs as a non-root user, for whom the
        CSI driver's docs require uid/gid and file/dir modes (docs/authentication.md,
        gcs-fuse-csi-driver 5fcdc04a); the values are seed 001's."""
        from rlctl.core.image.context import IMAGE_UID

        return f"implicit-dirs,uid={IMAGE_UID},gid={IMAGE_UID},file-mode=664,dir-mode=775"

    @property
    def gcsfuse_annotations(self) -> dict[str, str]:
        """What asks GKE's GCS FUSE webhook for its sidecar (none without gs:// inputs):
        its limits lifted ("0": none), as the seed's pods do, so a large checkpoint read
        is not throttled or OOM-killed in the sidecar while the trainer has memory."""
        if not self.gcs_buckets:
            return {}
        return {
            "gke-gcsfuse/volumes": "true",
            "gke-gcsfuse/cpu-limit": "0",
            "gke-gcsfuse/memory-limit": "0",
            "gke-gcsfuse/ephemeral-storage-limit": "0",
        }

    @property
    def dcn_claim(self) -> str:
        return f"{self.run}-dcn"

    @property
    def libtpu_init_args(self) -> str | None:
        """libtpu's flags: the generation's XLA flags from the catalog (the seed's, for
        v6e), then its DCN interfaces: the DRANET NICs (eth1.. one per DCN network, eth0
        is the node's own) and loopback. None when there are neither."""
        from rlctl.core.config.catalog import libtpu_flags

        if not self.shape.strategy.libtpu:
            return None
        flags = libtpu_flags(self.shape.accelerator)
        if self.dcn_networks:
            nics = [f"eth{i + 1}" for i in range(len(self.dcn_networks))]
            flags.append(f"--megascale_grpc_interface_prefixes={','.join([*nics, 'lo'])}")
        return " ".join(flags) or None


def make_view(**fields: Any) -> WorkloadView:
    """Build a view, turning pydantic's errors into one ConfigError with field paths."""
    from pydantic import ValidationError

    try:
        return WorkloadView(**fields)
    except ValidationError as e:
        msgs = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'view'}: {err['msg']}" for err in e.errors()
        )
        raise ConfigError(f"cannot render the workload: {msgs}") from e


@functools.lru_cache(maxsize=1)
def environment():
    """The one Jinja2 Environment (built once)."""
    import jinja2

    return jinja2.Environment(
        # the package's templates, then those of backends registered from outside it
        loader=jinja2.ChoiceLoader(
            [
                jinja2.PackageLoader("rlctl", "templates"),
                jinja2.FunctionLoader(backends.template_source),
            ]
        ),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # YAML, not HTML: every value goes through tojson instead
        keep_trailing_newline=True,
    )


def _render_yaml(template: str, **ctx: Any) -> dict[str, Any]:
    import yaml

    text = environment().get_template(template).render(**ctx)
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:  # a template bug, never a value: values are JSON-escaped
        raise ConfigError(f"template {template} rendered invalid YAML: {e}") from e
    if not isinstance(doc, dict):
        raise ConfigError(f"template {template} did not render one object")
    return doc


def render_text(template: str, view: WorkloadView) -> str:
    """A template of the view's backend: ``v`` the shared view, ``b`` what the backend adds
    (``Backend.view_fields``)."""
    return environment().get_template(template).render(v=view, b=view.backend.view_fields(view))


def render_workload(view: WorkloadView) -> list[dict[str, Any]]:
    """The run's objects in apply order: ServiceAccount, [ConfigMap], [DRANET claim], workload.

    The ConfigMap holds the backend's extra files (Ray's driver script) and exists only
    for a backend that has some: the pods read the run's spec from its run store.

    The HF token Secret is not rendered: ``apply.py`` creates it from the value
    without it ever passing through a template or a printed manifest.
    """
    backend = view.backend
    extra = {name: render_text(template, view) for name, template in backend.config_files.items()}
    objs = [_render_yaml("serviceaccount.yaml.j2", v=view)]
    if extra:
        objs.append(_render_yaml("configmap.yaml.j2", v=view, extra_files=extra))
    if view.dcn_networks and backend.dcn_claim:
        objs.append(_render_yaml("resourceclaimtemplate.yaml.j2", v=view))
    objs.append(_render_yaml(backend.template, v=view, b=backend.view_fields(view)))
    return objs
