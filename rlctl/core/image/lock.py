"""Each cluster image's lock: every package the image installs, pinned with ``==``.

``rlctl/data/image-<accelerator>.lock.txt`` is generated, never edited by hand::

    python -m rlctl.core.image.lock            # both images; or: ... tpu

It resolves, with pip against PyPI for the image's platform (CPython ``python`` of
``rlctl/data/images.yaml``, Linux x86_64, manylinux up to the base image's glibc, wheels
only), the image's inputs: the pins of ``images.yaml`` (``requirements``, ``build_tools``)
and rlctl's own dependencies with the image's extras (the installed distribution's
``Requires-Dist``, what the wheel in the build context carries), preferring the versions
of the checkout's ``constraints.txt`` (those rlctl's tests passed with). Every package
pip would install is written with its version, then ``no_deps`` as they are. The image
installs the lock with ``pip install --no-deps`` and rlctl's wheel with ``--no-deps``,
so nothing is resolved while the image builds.

Two limits of pip shape this:

* ``--platform`` resolves only wheels (``--only-binary=:all:``), and PyPI has only the
  source of a few pure-Python packages (``sdists`` of ``images.yaml``). Their wheels are
  built here first (pure Python: the same wheel on every platform) and offered to the
  resolver from a local folder; the image builds them from source, without build
  isolation, with the ``build_tools`` the lock pins.
* pip evaluates environment markers (``sys_platform``, ``python_version``, ...) against
  the interpreter that runs it, not against ``--platform``/``--python-version``, so the
  lock is generated only on Linux x86_64 by the image's CPython version.

The helpers that build commands and texts are pure; ``resolve`` and ``main`` run pip.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

from rlctl.core.errors import ConfigError
from rlctl.core.image.context import (
    canonical,
    dist_name,
    image_names,
    image_pins,
    lock_file,
    pins,
    pip_platforms,
)

PYPI = "https://pypi.org/simple"
# pip settings about how to reach an index, kept; every other PIP_* setting (another
# index, find-links, constraints) would change what resolves, so the resolver drops it
_PIP_TRANSPORT = {
    "PIP_CERT",
    "PIP_CLIENT_CERT",
    "PIP_PROXY",
    "PIP_TRUSTED_HOST",
    "PIP_DEFAULT_TIMEOUT",
    "PIP_TIMEOUT",
    "PIP_RETRIES",
}
_EXTRA_ONLY = re.compile(r"""^extra\s*==\s*["']([A-Za-z0-9._-]+)["']$""")


# --- the lock file ----------------------------------------------------------------------
def parse_lock(text: str) -> dict[str, str]:
    """``{canonical name: version}`` of a lock's ``name==version`` lines."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not version or any(c in version for c in " ;<>,[") or "[" in name:
            raise ConfigError(f"lock line {raw!r} is not NAME==VERSION")
        out[canonical(name)] = version
    return out


def recorded_inputs(text: str) -> list[str]:
    """The inputs a lock's header says it was resolved from."""
    lines = text.splitlines()
    start = lines.index("# inputs:") + 1
    return [ln[4:] for ln in lines[start:] if ln.startswith("#   ")]


# --- what is resolved ------------------------------------------------------------------
def rlctl_requirements(requires_dist: list[str], extras: list[str]) -> list[str]:
    """rlctl's ``Requires-Dist`` lines that an install with ``extras`` needs, with their
    ``extra == "..."`` markers resolved. Any other marker is kept for pip to evaluate;
    one that mixes ``extra`` with other terms, or a requirement on rlctl itself, is
    refused rather than guessed."""
    out = []
    for line in requires_dist:
        req, _, marker = (p.strip() for p in line.partition(";"))
        if m := _EXTRA_ONLY.match(marker):
            if m.group(1) not in extras:
                continue
            keep = req
        elif "extra" in marker:
            raise ConfigError(f"cannot tell whether {line!r} applies to the image's extras")
        else:
            keep = f"{req}; {marker}" if marker else req
        if dist_name(req) == "rlctl":
            raise ConfigError(
                f"rlctl's requirement {line!r} names rlctl itself: list the "
                "extras it stands for in images.yaml instead"
            )
        out.append(keep)
    return out


def installed_requires_dist() -> list[str]:
    """``Requires-Dist`` of the installed rlctl: what its wheel in the build context
    declares (``context._metadata`` copies them)."""
    import importlib.metadata as im

    return list(im.metadata("rlctl").get_all("Requires-Dist") or [])


def inputs(accelerator: str, requires_dist: list[str]) -> list[str]:
    """What the image's lock is resolved from, in order: the pins of images.yaml, the
    build tools, rlctl's own requirements (extras resolved), the source-only packages."""
    p = image_pins(accelerator)
    return [
        *p.requirements,
        *pins().build_tools,
        *rlctl_requirements(requires_dist, p.extras),
        *pins().sdists,
    ]


def header_inputs(accelerator: str, reqs: list[str]) -> list[str]:
    """The inputs as a lock's header records them: what was resolved, then ``no_deps``."""
    return [*reqs, *(f"{n} (--no-deps)" for n in image_pins(accelerator).no_deps)]


def platform_args() -> list[str]:
    """pip's options for the image's platform: its manylinux tags, CPython version."""
    return [
        *(a for tag in pip_platforms() for a in ("--platform", tag)),
        "--implementation",
        "cp",
        "--python-version",
        pins().python,
    ]


def resolve_command(
    reqs: list[str],
    *,
    report: Path,
    target: Path,
    wheelhouse: Path,
    constraints: list[Path],
    index_url: str = PYPI,
) -> list[str]:
    """The pip command that resolves ``reqs`` for the image's platform and writes its
    report (nothing is installed: ``--dry-run`` into an empty ``--target``)."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--quiet",
        "--ignore-installed",
        "--target",
        str(target),
        "--report",
        str(report),
        *platform_args(),
        "--only-binary=:all:",
        "--index-url",
        index_url,
        "--find-links",
        str(wheelhouse),
    ]
    for c in constraints:
        cmd += ["-c", str(c)]
    return [*cmd, *reqs]


def pip_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment pip runs in here: no pip configuration file and no ``PIP_*``
    setting but how to reach the index, so this machine's mirrors, find-links or
    constraints never reach the lock; the image resolves nothing, and PyPI is its index."""
    env = {k: v for k, v in environ.items() if not k.startswith("PIP_") or k in _PIP_TRANSPORT}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def versions(report: dict) -> dict[str, str]:
    """``{canonical name: version}`` of what a pip ``--report`` would install."""
    return {canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]}


def render_lock(accelerator: str, report: dict, reqs: list[str], constraints_note: str) -> str:
    """The lock text: a header naming how it was made and from what, every package
    of pip's report sorted by name, then images.yaml's ``no_deps``."""
    p, f = image_pins(accelerator), pins()
    got = versions(report)
    lines = [
        f"# The {accelerator} image of 'rlctl image build': every package it installs, pinned",
        "# (pip install --no-deps -r; then rlctl's own wheel, --no-deps).",
        "# Generated by 'python -m rlctl.core.image.lock'; do not edit.",
        f"# Resolved by pip from PyPI for CPython {f.python}, Linux x86_64, manylinux up to "
        f"glibc {f.glibc}, wheels only",
        *(
            [f"# but {', '.join(dist_name(s) for s in f.sdists)} (built from source in the image)"]
            if f.sdists
            else []
        ),
        *([f"# preferring the versions of {constraints_note}"] if constraints_note else []),
        "# inputs:",
        *(f"#   {r}" for r in header_inputs(accelerator, reqs)),
        *(f"{name}=={got[name]}" for name in sorted(got)),
    ]
    if p.no_deps:
        lines += ["# installed without their dependencies (images.yaml no_deps)", *p.no_deps]
    return "\n".join(lines) + "\n"


# --- running pip ------------------------------------------------------------------------
def check_host() -> None:
    """Refuse a host whose markers differ from the image's (pip evaluates them here)."""
    import platform

    want = tuple(int(x) for x in pins().python.split("."))
    if not (
        sys.platform == "linux"
        and platform.machine() == "x86_64"
        and sys.implementation.name == "cpython"
        and sys.version_info[:2] == want
    ):
        raise ConfigError(
            f"the image locks are resolved on Linux x86_64 by CPython {pins().python} "
            f"(pip evaluates environment markers against its own interpreter), not "
            f"{sys.platform} {platform.machine()} {sys.implementation.name} "
            f"{sys.version_info[0]}.{sys.version_info[1]}",
            hint=f"run it in {pins().base}",
        )


def _run(cmd: list[str], what: str, timeout: float) -> None:
    import subprocess

    r = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=pip_env(os.environ)
    )
    if r.returncode != 0:
        raise ConfigError(
            f"{what} failed (pip exit {r.returncode}):\n{(r.stderr or r.stdout)[-3000:]}"
        )


def build_sdist_wheels(wheelhouse: Path, index_url: str = PYPI) -> None:
    """Wheels of images.yaml's source-only packages, built from PyPI's sdists."""
    if pins().sdists:
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--quiet",
                "--no-deps",
                "--no-binary=:all:",
                "--index-url",
                index_url,
                "--wheel-dir",
                str(wheelhouse),
                *pins().sdists,
            ],
            "building wheels of " + " ".join(pins().sdists),
            600,
        )


def resolve(reqs: list[str], workdir: Path, constraints: list[Path], index_url: str = PYPI) -> dict:
    """pip's report of resolving ``reqs`` for the image's platform (network)."""
    wheelhouse, report = workdir / "wheelhouse", workdir / "report.json"
    wheelhouse.mkdir(parents=True, exist_ok=True)
    build_sdist_wheels(wheelhouse, index_url)
    _run(
        resolve_command(
            reqs,
            report=report,
            target=workdir / "target",
            wheelhouse=wheelhouse,
            constraints=constraints,
            index_url=index_url,
        ),
        "resolving " + " ".join(reqs),
        900,
    )
    return json.loads(report.read_text())


def default_constraints() -> Path | None:
    """The checkout's constraints.txt (beside the package), if there is one."""
    here = Path(str(resources.files("rlctl"))).parent / "constraints.txt"
    return here if here.is_file() else None


def preferred(constraints: Path, unpreferred: list[str], workdir: Path) -> Path:
    """``constraints`` without the packages an image cannot take at their version
    (images.yaml ``unpreferred``), as a file in ``workdir``."""
    drop = {canonical(n) for n in unpreferred}
    keep = [
        ln
        for ln in constraints.read_text().splitlines()
        if canonical(ln.split("#", 1)[0].strip().split("==")[0] or "#") not in drop
    ]
    out = workdir / f"preferred-{constraints.name}"
    workdir.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(keep) + "\n")
    return out


def generate(accelerator: str, constraints: Path | None, workdir: Path) -> str:
    """The image's lock text, resolved now (network)."""
    check_host()
    reqs = inputs(accelerator, installed_requires_dist())
    unpreferred = image_pins(accelerator).unpreferred
    used = (
        preferred(constraints, unpreferred, workdir) if constraints and unpreferred else constraints
    )
    report = resolve(reqs, workdir, [used] if used else [])
    note = ""
    if constraints:
        note = constraints.name + (f" but {', '.join(unpreferred)}" if unpreferred else "")
    return render_lock(accelerator, report, reqs, note)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(
        prog="python -m rlctl.core.image.lock",
        description="Regenerate rlctl/data/image-*.lock.txt.",
    )
    ap.add_argument(
        "accelerators",
        nargs="*",
        metavar="IMAGE",
        help=f"the images to lock: {', '.join(image_names())} (default: all)",
    )
    ap.add_argument(
        "--constraints",
        type=Path,
        default=default_constraints(),
        help="versions to prefer (default: the checkout's constraints.txt)",
    )
    ap.add_argument("--no-constraints", action="store_true", help="prefer none")
    args = ap.parse_args(argv)
    if bad := [a for a in args.accelerators if a not in image_names()]:
        ap.error(f"not an image: {' '.join(bad)} ({', '.join(image_names())})")
    data = Path(str(resources.files("rlctl"))) / "data"
    for acc in args.accelerators or image_names():
        with tempfile.TemporaryDirectory(prefix="rlctl-lock-") as tmp:
            text = generate(acc, None if args.no_constraints else args.constraints, Path(tmp))
        (data / lock_file(acc)).write_text(text)
        print(f"{data / lock_file(acc)}: {len(parse_lock(text))} packages", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
