"""``rlctl image build --local``: the same context, built and pushed by a local engine.

Docker or Podman, whichever is on PATH (``RLCTL_CONTAINER_ENGINE`` picks one), run
as subprocesses with the context unpacked in a temporary folder. Pushing to
Artifact Registry uses the engine's own credentials (``gcloud auth
configure-docker REGION-docker.pkg.dev``), never rlctl's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Mapping

from rlctl.core.errors import CloudError, ConfigError
from rlctl.core.image.context import BuildContext, pins

ENGINES = ("docker", "podman")
ENGINE_ENV = "RLCTL_CONTAINER_ENGINE"


def find_engine(
    env: Mapping[str, str] | None = None, which: Callable[[str], str | None] = shutil.which
) -> str:
    """The path of the container engine to use; a clear error when there is none."""
    env = os.environ if env is None else env
    wanted = env.get(ENGINE_ENV, "").strip()
    if wanted:
        if wanted not in ENGINES:
            raise ConfigError(f"{ENGINE_ENV}={wanted!r}: use docker or podman")
        found = which(wanted)
        if not found:
            raise ConfigError(
                f"{ENGINE_ENV}={wanted} but {wanted} is not on PATH",
                hint=f"install {wanted}, or unset {ENGINE_ENV}",
            )
        return found
    for name in ENGINES:
        found = which(name)
        if found:
            return found
    raise ConfigError(
        "--local needs Docker or Podman, and neither is on PATH",
        hint="install one, or leave out --local to build with Cloud Build",
    )


def commands(engine: str, uris: list[str]) -> list[list[str]]:
    """The engine's build command (every tag at once), then one push per tag."""
    build = [engine, "build", "--platform", pins().platform]
    for u in uris:
        build += ["-t", u]
    return [[*build, "."], *([engine, "push", u] for u in uris)]


def build_local(
    ctx: BuildContext, uris: list[str], engine: str, on_line: Callable[[str], None] = lambda s: None
) -> list[list[str]]:
    """Unpack the context, build and push; the commands run. A failing command is one
    error naming it (its output went to ``on_line``)."""
    import io

    ran = []
    with tempfile.TemporaryDirectory(prefix="rlctl-image-") as tmp:
        with tarfile.open(fileobj=io.BytesIO(ctx.archive), mode="r:gz") as tar:
            tar.extractall(tmp, filter="data")
        for cmd in commands(engine, uris):
            on_line("$ " + " ".join(cmd))
            proc = subprocess.Popen(
                cmd, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            assert proc.stdout is not None
            last = ""
            for line in proc.stdout:
                last = line.rstrip() or last
                on_line(last)
            if proc.wait() != 0:
                hint = (
                    (
                        "log the engine in to Artifact Registry: gcloud auth configure-docker "
                        f"{uris[0].split('/', 1)[0]}"
                    )
                    if cmd[1] == "push"
                    else f"check that the engine runs ('{cmd[0]} info'), or leave out --local "
                    "to build with Cloud Build"
                )
                raise CloudError(
                    f"'{' '.join(cmd[:2])}' failed with exit code {proc.returncode}: {last}",
                    hint=hint,
                )
            ran.append(cmd)
    return ran
