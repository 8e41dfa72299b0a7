"""Calling Google APIs: retries, error translation, waiting on operations, and the executor.

* ``call`` runs one API method with google-api-core's Retry and translates errors.
* ``wait_compute`` / ``wait_gke`` await long-running operations on the injected
  endpoint (Compute's ExtendedOperation.result() would poll the default one).
* ``execute`` applies a plan's changes concurrently along its dependency edges.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from rlctl.core.errors import RlctlError
from rlctl.core.gcp.api import GcpClients
from rlctl.core.gcp.errors import operation_error, translate
from rlctl.core.plan import Change

Event = Callable[[str, str, str], None]  # (change key, state, info)


def _noop(key: str, state: str, info: str) -> None:
    pass


def call(clients: GcpClients, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, retry=clients.retry, **kwargs)`` with errors translated."""
    try:
        return fn(*args, retry=clients.retry, **kwargs)
    except RlctlError:
        raise
    except Exception as e:
        raise translate(e, what) from e


def _sleep_schedule(clients: GcpClients):
    delay = clients.poll_interval
    while True:
        yield delay
        delay = min(delay * 1.5, clients.poll_interval * 10)


def wait_compute(
    clients: GcpClients,
    op: Any,
    what: str,
    region: str | None = None,
    on_poll: Callable[[str], None] = lambda s: None,
) -> None:
    """Block until a Compute operation is DONE; raise its error if it failed."""
    Status = clients.compute_types.Operation.Status
    sleeps = _sleep_schedule(clients)
    while True:
        on_poll(Status(op.status).name if op.status else "PENDING")
        if op.status == Status.DONE:
            break
        # operations.wait returns when DONE or after ~2 minutes, whichever is first.
        if region:
            op = call(
                clients,
                what,
                clients.region_operations.wait,
                project=clients.project,
                region=region,
                operation=op.name,
            )
        else:
            op = call(
                clients,
                what,
                clients.global_operations.wait,
                project=clients.project,
                operation=op.name,
            )
        if op.status != Status.DONE:
            time.sleep(next(sleeps))
    if op.error and op.error.errors:
        first = op.error.errors[0]
        raise operation_error(what, first.code, first.message)


def wait_gke(
    clients: GcpClients,
    op: Any,
    location: str,
    what: str,
    on_poll: Callable[[str], None] = lambda s: None,
) -> None:
    """Poll a GKE operation (PENDING -> RUNNING -> DONE) and raise its error, if any."""
    Status = clients.container_types.Operation.Status
    name = f"projects/{clients.project}/locations/{location}/operations/{op.name}"
    sleeps = _sleep_schedule(clients)
    while True:
        on_poll(Status(op.status).name)
        if op.status in (Status.DONE, Status.ABORTING):
            break
        time.sleep(next(sleeps))
        op = call(clients, what, clients.container.get_operation, name=name)
    err = op.error
    if (err and (err.code or err.message)) or op.status == Status.ABORTING:
        raise operation_error(
            what,
            err.code if err else None,
            (err.message if err else "") or op.status_message or "aborted",
        )
    if op.status_message and op.status_message.lower().startswith("error"):
        raise operation_error(what, None, op.status_message)


Handler = Callable[[Change, Callable[[str], None]], None]


def execute(
    changes: list[Change],
    handler: Handler,
    on_event: Event = _noop,
    max_workers: int = 8,
) -> list[str]:
    """Run ``handler`` for each change once its dependencies are done; return keys done.

    Independent changes run concurrently. On the first failure nothing new is
    started, running ones finish, and the original (translated) error is raised,
    so a re-run of the same command resumes from what exists.
    """
    pending = {c.key: c for c in changes}
    done: list[str] = []
    failed: list[BaseException] = []
    running: dict[Future, str] = {}

    def ready(c: Change) -> bool:
        return all(d not in pending or d in done for d in c.depends_on)

    def run(c: Change) -> None:
        on_event(c.key, "start", c.action)
        handler(c, lambda info: on_event(c.key, "poll", info))

    with ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="rlctl-apply") as pool:
        waiting = [c for c in changes]
        while waiting or running:
            if not failed:
                for c in [c for c in waiting if ready(c)]:
                    waiting.remove(c)
                    running[pool.submit(run, c)] = c.key
            if not running:
                break  # blocked by a failure (or a dependency cycle, which topo_order rejects)
            finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for f in finished:
                key = running.pop(f)
                exc = f.exception()
                if exc is None:
                    done.append(key)
                    on_event(key, "done", "")
                else:
                    failed.append(exc)
                    on_event(key, "error", str(getattr(exc, "message", exc)))
    if failed:
        e = failed[0]
        if isinstance(e, RlctlError):
            raise e
        raise translate(e, "apply") from e
    return done
