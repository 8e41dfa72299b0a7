"""google.api_core exceptions (and failed operations) -> rlctl's error tree.

One table, subclasses before parents. Each message is one line naming what
failed; the hint names the fix. Transient errors (429 rate limits, 5xx) are not
translated here: ``is_transient`` tells google-api-core's Retry to retry them.
"""

from __future__ import annotations

import re

from rlctl.core.errors import (
    AlreadyExistsError,
    CloudError,
    ConfigError,
    NotFoundError,
    PermissionDeniedError,
    QuotaExceededError,
    RlctlError,
)

_STOCKOUT = re.compile(
    r"stockout|ZONE_RESOURCE_POOL_EXHAUSTED|does not have enough resources|"
    r"resource pool exhausted|no capacity",
    re.IGNORECASE,
)
_QUOTA = re.compile(r"quota", re.IGNORECASE)


def _text(e: BaseException) -> str:
    msg = getattr(e, "message", None) or str(e)
    return " ".join(str(msg).split())


def is_stockout(text: str) -> bool:
    return bool(_STOCKOUT.search(text))


_RATE = re.compile(r"\brate\b|ratelimit|per minute|per second", re.IGNORECASE)


def is_quota(text: str) -> bool:
    """Quota exhaustion (not a per-minute rate limit, which is transient)."""
    return bool(_QUOTA.search(text)) and not _RATE.search(text)


# a connection that cannot be made at all: no server on the port, no such host, no
# route. Retrying for minutes (the retry's deadline) would only hide it; a reset during
# a server's restart stays transient.
_UNREACHABLE = re.compile(
    r"Connection refused|Failed to resolve|Name or service not known|"
    r"nodename nor servname|Temporary failure in name resolution|"
    r"No route to host|Network is unreachable"
)
_HOST = re.compile(r"host='([^']+)', port=(\d+)")


def unreachable(e: BaseException) -> str | None:
    """``host:port (why)`` when ``e`` is a connection that could not be made, else None."""
    if type(e).__name__ not in ("ConnectionError", "NewConnectionError", "MaxRetryError"):
        return None
    text = str(e)
    why = _UNREACHABLE.search(text)
    if not why:
        return None
    host = _HOST.search(text)
    return (
        f"{host.group(1)}:{host.group(2)} ({why.group(0).lower()})"
        if host
        else why.group(0).lower()
    )


def is_transient(e: BaseException) -> bool:
    """429 and 5xx, except quota/stockout, which waiting seconds will not fix."""
    from google.api_core import exceptions as gx

    transient = (
        gx.TooManyRequests,
        gx.InternalServerError,
        gx.BadGateway,
        gx.ServiceUnavailable,
        gx.GatewayTimeout,
    )
    if isinstance(e, transient):
        text = _text(e)
        return not (is_stockout(text) or is_quota(text))
    # requests' connection errors during a server restart; not one never made
    return (
        type(e).__name__ in ("ConnectionError", "ChunkedEncodingError") and unreachable(e) is None
    )


def stockout(what: str, detail: str) -> QuotaExceededError:
    return QuotaExceededError(
        f"no capacity (stockout) for {what}: {detail}",
        hint="try another zone (--zone), --spot, or a reservation (--reservation NAME)",
    )


def quota(what: str, detail: str) -> QuotaExceededError:
    return QuotaExceededError(
        f"quota exceeded for {what}: {detail}",
        hint="request more quota at https://console.cloud.google.com/iam-admin/quotas "
        "or ask for fewer/smaller slices",
    )


def translate(e: BaseException, what: str) -> RlctlError:
    """Map one exception raised while doing ``what`` to a user-facing error."""
    if isinstance(e, RlctlError):
        return e
    if where := unreachable(e):
        return CloudError(
            f"cannot reach {where} for {what}",
            hint="check this machine's network and proxy; if an "
            "RLCTL_API_ENDPOINT_OVERRIDES_* variable is set, check that "
            "endpoint is up",
        )
    text = _text(e)
    try:
        from google.api_core import exceptions as gx
    except ImportError:  # pragma: no cover - gcp extra missing
        return CloudError(f"{what} failed: {text}")

    if type(e).__name__ == "DefaultCredentialsError":  # google.auth, matched by name
        import os

        gac = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
        if gac:  # the one place ADC looked: say so, not "none found"
            why = "no such file" if not os.path.isfile(gac) else "not a credentials file"
            return PermissionDeniedError(
                f"GOOGLE_APPLICATION_CREDENTIALS={gac}: {why}",
                hint="point it at a credentials JSON file, or unset it and run "
                "'gcloud auth application-default login'",
            )
        return PermissionDeniedError(
            "no Google Cloud credentials found",
            hint="run 'gcloud auth application-default login'",
        )
    if isinstance(e, gx.GoogleAPICallError):
        if is_stockout(text):
            return stockout(what, text)
        if is_quota(text) or isinstance(e, gx.ResourceExhausted):
            return quota(what, text)
        if isinstance(e, (gx.PermissionDenied, gx.Forbidden, gx.Unauthorized, gx.Unauthenticated)):
            return PermissionDeniedError(
                f"permission denied for {what}: {text}",
                hint="grant your account roles/container.admin, roles/compute.networkAdmin and "
                "roles/storage.admin on the project, or run "
                "'gcloud auth application-default login'",
            )
        if isinstance(e, (gx.AlreadyExists, gx.Conflict)):
            return AlreadyExistsError(
                f"{what}: already exists and is not managed by rlctl ({text})",
                hint="choose another name, or delete the existing resource yourself",
            )
        if isinstance(e, gx.NotFound):
            return NotFoundError(f"{what}: not found ({text})")
        if isinstance(e, (gx.InvalidArgument, gx.BadRequest, gx.FailedPrecondition)):
            return ConfigError(
                f"Google Cloud rejected {what}: {text}",
                hint="check the spec values named in the message (--dry-run shows the plan)",
            )
        if isinstance(e, gx.RetryError) or is_transient(e):
            return CloudError(
                f"{what} kept failing with a transient error: {text}",
                hint="Google Cloud may be degraded; re-run the command later",
            )
        return CloudError(f"{what} failed: {text}")
    if isinstance(e, gx.RetryError):
        return CloudError(
            f"{what} kept failing with a transient error: {text}",
            hint="Google Cloud may be degraded; re-run the command later",
        )
    return CloudError(f"{what} failed: {type(e).__name__}: {text}")


def operation_error(what: str, code: str | int | None, message: str) -> RlctlError:
    """Map a long-running operation that finished with an error."""
    text = f"{code}: {message}" if code not in (None, "", 0) else message
    if is_stockout(text):
        return stockout(what, message)
    if is_quota(text):
        return quota(what, message)
    c = str(code or "").upper()
    if c in ("7", "PERMISSION_DENIED", "403") or "permission" in message.lower():
        return PermissionDeniedError(f"permission denied for {what}: {message}")
    if c in ("3", "INVALID_ARGUMENT", "400"):
        return ConfigError(f"Google Cloud rejected {what}: {message}")
    if c in ("6", "ALREADY_EXISTS", "409"):
        return AlreadyExistsError(f"{what}: already exists and is not managed by rlctl")
    return CloudError(f"{what} failed: {text}", hint="re-run the same command; it resumes")
