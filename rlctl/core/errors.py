"""One exception tree for everything a user can cause or fix.

The CLI maps each branch to one line on stderr and a documented exit code
(see README "Exit codes"); nothing below the CLI prints or exits. Library
exceptions are translated at the edge that calls the library, ``from e``.
"""

from __future__ import annotations


class RlctlError(Exception):
    """Root of user-facing errors. ``hint`` is the next thing to try."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class ConfigError(RlctlError):
    """Bad input: a flag, a YAML field, a name, a path."""

    exit_code = 2


class NotFoundError(RlctlError):
    exit_code = 3


class AlreadyExistsError(RlctlError):
    """Exists and is not ours (or a run name is taken)."""

    exit_code = 4


class ConflictError(RlctlError):
    """The state does not allow it now (run still running, no checkpoint to resume)."""

    exit_code = 4


class RunInUseError(ConflictError):
    """Another process holds the run's writer lock or lease (a pod restarted before
    its predecessor's lease expired waits on this one instead of failing)."""


class PermissionDeniedError(RlctlError):
    exit_code = 5


class QuotaExceededError(RlctlError):
    """Quota or capacity (stockout): retrying later or elsewhere may work."""

    exit_code = 6


class CloudError(RlctlError):
    """A Google Cloud or Kubernetes call failed for a reason not covered above."""

    exit_code = 7


class MissingDependencyError(RlctlError):
    """An optional extra (train, gcp, k8s) is not installed."""

    exit_code = 8


class DiskFullError(RlctlError):
    """Not enough free space for the next checkpoint (checked before a save)."""

    exit_code = 1


class NonFiniteError(RlctlError):
    """A step's loss or gradient norm is not a finite number: the run stopped at that
    step, before saving it, its last finite checkpoint kept."""

    exit_code = 1


class OutOfMemoryError(RlctlError):
    """A step needs more memory than the device (or this machine) has free."""

    exit_code = 1


class InterruptedRun(RlctlError):
    """Ctrl-C or SIGTERM: the run stopped cleanly and can be resumed."""

    exit_code = 130


def require_extra(module: str, extra: str) -> None:
    """Fail with the install command instead of an ImportError traceback."""
    import importlib.util

    from rlctl.core.install import extra_install_command

    if importlib.util.find_spec(module) is None:
        raise MissingDependencyError(
            f"this command needs the '{extra}' extra ({module} is not installed)",
            hint=extra_install_command(extra, constrained=True),
        )


# What a cloud command imports, by extra (pyproject.toml): the Google Cloud client
# libraries every cluster, network and image command reaches, and the Kubernetes client
# and manifest validators of the commands that touch a cluster.
CLOUD_MODULES: dict[str, tuple[str, ...]] = {
    "gcp": (
        "google.auth",
        "google.api_core",
        "google.cloud.compute_v1",
        "google.cloud.container_v1",
        "google.cloud.storage",
        "google.cloud.tpu_v2",
        "google.cloud.service_usage_v1",
        "google.cloud.devtools.cloudbuild_v1",
        "google.cloud.artifactregistry_v1",
        "google.cloud.resourcemanager_v3",
        "google.cloud.cloudquotas_v1",
    ),
    "k8s": ("kubernetes", "jsonschema", "kubernetes_validate"),
}
CLOUD_EXTRA = "all"  # the README's one line for the cloud half: pip install '.[all]'


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported, parents first (a missing ``google.cloud``
    makes a lookup of ``google.cloud.storage`` raise rather than answer), importing at
    most the namespace packages above it."""
    import importlib.util

    parts = module.split(".")
    try:
        return all(
            importlib.util.find_spec(".".join(parts[:i])) is not None
            for i in range(1, len(parts) + 1)
        )
    except (ImportError, ValueError):  # a parent that is not a package, or half there
        return False


def require_cloud(*extras: str) -> None:
    """The one dependency check at the top of every cloud command: every module the
    command's extras provide, or one error (exit 8) naming what is missing and the
    install line of the README's cluster half, with the checkout's recorded versions.
    Without it a dry run got as far as its first API call, then failed with a
    ModuleNotFoundError (#53)."""
    from rlctl.core.install import extra_install_command

    wanted = extras or tuple(CLOUD_MODULES)
    missing = [m for x in wanted for m in CLOUD_MODULES[x] if not _installed(m)]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise MissingDependencyError(
            f"this command needs the cloud extras ({', '.join(wanted)}; "
            f"{', '.join(missing[:3])}{more} not installed)",
            hint=extra_install_command(CLOUD_EXTRA, constrained=True),
        )


class PreflightError(ConfigError):
    """One or more pre-flight checks failed; nothing was changed.

    ``lines`` holds one line per failed check, each naming the fix.
    """

    def __init__(self, lines: list[str]) -> None:
        self.lines = list(lines)
        if len(lines) == 1:
            msg = f"pre-flight check failed: {lines[0]}"
        else:
            msg = f"{len(lines)} pre-flight checks failed:\n" + "\n".join(f"  - {x}" for x in lines)
        super().__init__(msg, hint="nothing was changed; fix the above and re-run")


class UnschedulableError(PreflightError):
    """Pods of the workload would stay Pending on the cluster (``core/k8s/fit.py``);
    nothing was applied. ``lines``: one per pod group, with the flag that fixes it."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__(lines)
        n = len(lines)
        head = (
            f"{'a pod group' if n == 1 else f'{n} pod groups'} of this run would stay "
            "Pending on the cluster"
        )
        self.message = (
            f"{head}: {lines[0]}" if n == 1 else head + ":\n" + "\n".join(f"  - {x}" for x in lines)
        )
