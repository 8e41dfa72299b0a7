"""The run store on ``gs://bucket/prefix``: the local layout, object for file.

Reads and writes of whole objects go straight to Cloud Storage. An object write
is atomic in GCS (a reader sees the old or the new object, never a torn one), so
"commit" objects need only a guard against lost updates:

* ``spec.yaml``, ``status.json`` and the checkpoint markers
  ``checkpoints/<step>/COMMITTED`` are written with ``if_generation_match``: the
  generation this process last read or wrote, or 0 ("must not exist yet"). A
  concurrent writer therefore gets HTTP 412, raised as ``ConflictError``, instead
  of silently overwriting the other writer's state.
* Everything else (metrics.jsonl, TensorBoard files, eval JSON, checkpoint
  files) belongs to the one trainer of the run and is overwritten plainly.

The trainer writes files it appends to or that a library writes (metrics.jsonl,
TensorBoard, Orbax checkpoints) into a local *staging* folder, ``path_for(rel)``,
and the run dir uploads them: ``push(rel)`` after each step, and
``publish_checkpoint(step)`` after each complete save, which uploads the step's
files and then writes the marker last. Only steps with a marker count as
checkpoints, so a save killed half-way through its upload is never restored.

One writer per run: a run on gs:// may be trained from several machines or pods
(a laptop, then a cluster; a restarted pod), where no file lock reaches, so
``lock()`` holds a *lease*, the object ``<run>/.lease``. It is created only if
absent (``if_generation_match=0``), renewed every ttl/3 seconds by a daemon
thread, and deleted on exit, each time only at the generation this process wrote.
A holder that is killed cannot delete it, so a lease whose object GCS has not
updated for ttl seconds (``RLCTL_LEASE_TTL_S``, default 120) counts as expired and
may be taken over; a holder on this very machine whose pid is gone counts as
expired at once (what the kernel does for a local run's lock). A holder that finds
its lease taken over stops writing (``ConflictError``) and leaves the new one be.
"""

from __future__ import annotations

import builtins  # annotations below a method named list
import contextlib
import datetime as dt
import json
import os
import shutil
import socket
import tempfile
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rlctl.core.errors import CloudError, ConfigError, ConflictError, NotFoundError, RunInUseError
from rlctl.core.names import validate_name
from rlctl.core.store.base import (
    CHECKPOINTS,
    RUN_MARKERS,
    SPEC,
    STATUS,
    LockState,
    existing_run,
    step_number,
)
from rlctl.core.store.holder import machine as _machine  # one notion, the local lock's too

if TYPE_CHECKING:  # google.cloud.* is imported only by core/clients.py
    from rlctl.core.clients import StorageBucket as Bucket
    from rlctl.core.clients import StorageClient as Client

COMMITTED = "COMMITTED"
_COMMIT_NAMES = {SPEC, STATUS}
LEASE = ".lease"  # a gs:// run's writer lease (see GcsRunDir.lock)
DEFAULT_LEASE_TTL_S = 120.0


def _is_commit_object(rel: str) -> bool:
    return rel in _COMMIT_NAMES or rel.endswith(f"/{COMMITTED}")


def parse_gs_uri(uri: str) -> tuple[str, str]:
    """``gs://bucket/a/b/`` -> ("bucket", "a/b") with no leading/trailing slashes."""
    if not uri.startswith("gs://"):
        raise ConfigError(f"{uri!r} is not a gs:// URI", hint="use gs://BUCKET/PREFIX")
    bucket, _, prefix = uri[len("gs://") :].partition("/")
    if not bucket:
        raise ConfigError(f"{uri!r} names no bucket", hint="use gs://BUCKET/PREFIX")
    return bucket, prefix.strip("/")


# (connect, read) seconds of the store's first request: a closed or wrong endpoint
# fails within 10 s, naming it (#47)
PROBE_TIMEOUT = (3.0, 5.0)


def _first_line(e: BaseException, limit: int = 200) -> str:
    line = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _unreachable(e: BaseException) -> bool:
    """A transport failure (refused, timed out, unresolved), as requests or
    google-auth raise it, not an answer from the service."""
    import requests

    # google-auth's TransportError by name: only core/clients.py imports google
    auth_transport = type(e).__name__ == "TransportError" and type(e).__module__.startswith(
        "google.auth"
    )
    return auth_transport or isinstance(
        e, (requests.ConnectionError, requests.Timeout, ConnectionError, TimeoutError)
    )


def _why_unreachable(e: BaseException) -> str:
    """A transport failure in a few words (requests' own text runs to 300 characters
    of pool and URL before it says why)."""
    text = str(e)
    for needle, said in (
        ("Connection refused", "connection refused"),
        ("Name or service not known", "the host name does not resolve"),
        ("Temporary failure in name resolution", "the host name does not resolve"),
        ("timed out", "no answer in time"),
        ("Timeout", "no answer in time"),
        ("No route to host", "no route to the host"),
        ("Network is unreachable", "the network is unreachable"),
    ):
        if needle in text:
            return said
    return _first_line(e, 120)


def probe_bucket(client: Client, bucket: Bucket, prefix: str) -> None:
    """One request, without retries and within ``PROBE_TIMEOUT`` seconds, before a
    bucket is first used: the client's own retries spent two minutes in silence on a
    closed endpoint, and a bucket that does not exist read as a missing object
    (#47). Raises one line naming the endpoint or the bucket. It lists at most one
    object (``storage.objects.list``, which roles/storage.objectUser grants; reading
    the bucket's metadata would need more)."""
    from google.api_core import exceptions as gexc

    endpoint = getattr(
        getattr(client, "_connection", None), "API_BASE_URL", "https://storage.googleapis.com"
    )
    name = bucket.name
    try:
        list(
            client.list_blobs(
                bucket,
                prefix=f"{prefix}/" if prefix else None,
                max_results=1,
                timeout=PROBE_TIMEOUT,
                retry=None,
            )
        )
    except gexc.NotFound as e:
        raise NotFoundError(
            f"bucket {name!r} does not exist (Cloud Storage at {endpoint})",
            hint="check the bucket's name in gs://BUCKET/PREFIX",
        ) from e
    except (gexc.Forbidden, gexc.Unauthorized) as e:
        from rlctl.core.errors import PermissionDeniedError

        raise PermissionDeniedError(
            f"no access to bucket {name!r} (Cloud Storage at {endpoint}): {_first_line(e)}",
            hint="check the bucket's name, and that these credentials hold "
            "roles/storage.objectUser on it",
        ) from e
    except gexc.GoogleAPICallError as e:
        raise CloudError(f"Cloud Storage at {endpoint}: {_first_line(e)}") from e
    except Exception as e:  # a refused or silent endpoint, a name that does not resolve
        if not _unreachable(e):
            raise
        raise CloudError(
            f"cannot reach Cloud Storage at {endpoint} (bucket {name!r}): {_why_unreachable(e)}",
            hint="check the network, or the endpoint set by "
            "STORAGE_EMULATOR_HOST or RLCTL_API_ENDPOINT_OVERRIDES_STORAGE",
        ) from e


def _translate(e: Exception, what: str) -> Exception:
    from google.api_core import exceptions as gexc

    if isinstance(e, gexc.PreconditionFailed):
        return ConflictError(
            f"{what} was changed by another writer",
            hint="another process is writing this run; stop it before retrying",
        )
    if isinstance(e, gexc.NotFound):
        return NotFoundError(f"{what} not found")
    if isinstance(e, gexc.Forbidden):
        from rlctl.core.errors import PermissionDeniedError

        return PermissionDeniedError(
            f"no access to {what}", hint="grant roles/storage.objectUser on the bucket"
        )
    return CloudError(f"{what}: {e}")


def lease_ttl_s(value: float | None = None) -> float:
    """``value``, else ``$RLCTL_LEASE_TTL_S``, else 120 s: how long a lease outlives
    its holder's last renewal (tests use a second or so)."""
    raw = os.environ.get("RLCTL_LEASE_TTL_S", "").strip() if value is None else str(value)
    if not raw:
        return DEFAULT_LEASE_TTL_S
    try:
        ttl = float(raw)
    except ValueError:
        ttl = 0.0
    if not 0 < ttl < float("inf"):  # nan too
        raise ConfigError(
            f"lease ttl {raw!r} is not a positive number of seconds",
            hint="set RLCTL_LEASE_TTL_S to e.g. 120",
        )
    return ttl


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _holder_is_dead(info: dict[str, Any]) -> bool:
    """The holder ran on this machine and its pid is gone (SIGKILL, OOM, a crash).
    Any other holder may be alive: only its lease's expiry tells."""
    pid = info.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or pid == os.getpid():
        return False
    if info.get("host") != socket.gethostname() or info.get("machine", "") != _machine():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # EPERM: alive, another user's
        return False
    return False


def _describe(info: dict[str, Any]) -> str:
    """The holder as local.py names it: ``pid P on HOST since T``."""
    try:
        return f"pid {info['pid']} on {info['host']} since {info['since']}"
    except KeyError:
        return "another process"


class _Lease:
    """This process's hold on one run's lease object (see ``GcsRunDir.lock``).

    ``token`` is unique to this hold, so a write whose reply was lost and that the
    client retried (getting 412 for its own new generation) is recognised as ours.
    """

    def __init__(self, bucket: Bucket, key: str, run: str, uri: str, ttl_s: float) -> None:
        self.bucket, self.key, self.run, self.uri, self.ttl_s = bucket, key, run, uri, ttl_s
        self.token = uuid.uuid4().hex
        self.since = _now().isoformat(timespec="seconds")
        self.generation = 0
        self.lost = False  # set by the renewer when another process took the lease
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _body(self) -> bytes:
        return json.dumps(
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "since": self.since,
                "renewed": _now().isoformat(timespec="seconds"),
                "ttl_s": self.ttl_s,
                "machine": _machine(),
                "token": self.token,
            }
        ).encode()

    def _read(self) -> tuple[Any, dict[str, Any]] | None:
        """The lease object and its content ({} if damaged); None if there is none
        or it changed while being read."""
        from google.api_core import exceptions as gexc

        try:
            blob = self.bucket.get_blob(self.key)
            if blob is None:
                return None
            data = blob.download_as_bytes(if_generation_match=blob.generation)
        except (gexc.NotFound, gexc.PreconditionFailed):
            return None
        try:
            info = json.loads(data)
        except ValueError:
            info = None
        return blob, info if isinstance(info, dict) else {}

    def _write(self, expected: int, timeout: float | None = None) -> bool:
        """Write our lease over generation ``expected`` (0: none may exist); False
        if the object is someone else's. Errors other than 412 propagate."""
        from google.api_core import exceptions as gexc

        blob = self.bucket.blob(self.key)
        kw: dict[str, Any] = {} if timeout is None else {"retry": None, "timeout": timeout}
        try:
            blob.upload_from_string(
                self._body(), content_type="application/json", if_generation_match=expected, **kw
            )
        except gexc.PreconditionFailed:
            held = self._read()
            if held is None or held[1].get("token") != self.token:
                return False
            blob = held[0]  # our own write, retried by the client after a lost reply
        self.generation = int(blob.generation)
        return True

    def _ttl_of(self, info: dict[str, Any]) -> float:
        """The holder's own renewal promise; ours for a damaged lease."""
        ttl = info.get("ttl_s")
        if isinstance(ttl, (int, float)) and not isinstance(ttl, bool) and 0 < ttl < 1e9:
            return float(ttl)
        return self.ttl_s

    def _expired(self, blob: Any, info: dict[str, Any]) -> bool:
        """Judged by GCS's own ``updated`` time of the object (its last renewal),
        not by the holder's clock; a damaged lease gets our ttl."""
        if _holder_is_dead(info):
            return True
        updated = blob.updated
        return updated is not None and _now() > updated + dt.timedelta(seconds=self._ttl_of(info))

    def acquire(self) -> None:
        expected = 0  # first: create it, only if there is none
        try:
            for _ in range(4):
                if self._write(expected):
                    break
                held = self._read()
                if held is None:  # released meanwhile: create it again
                    expected = 0
                    continue
                blob, info = held
                if not self._expired(blob, info):
                    raise RunInUseError(
                        f"run {self.run!r} is in use by {_describe(info)}",
                        hint="wait for it to finish, or stop that process first; a holder "
                        "that died without releasing the run loses its lease "
                        f"{self._ttl_of(info):g} s after its last renewal",
                    )
                expected = int(blob.generation)  # take it over, unless another did first
            else:
                raise RunInUseError(
                    f"run {self.run!r} is in use by another process",
                    hint="wait for it to finish, or stop that process first",
                )
        except ConflictError:
            raise
        except Exception as e:
            raise _translate(e, self.uri) from e
        self._thread = threading.Thread(
            target=self._renew_loop, daemon=True, name=f"rlctl-lease-{self.run}"
        )
        self._thread.start()

    def _renew_loop(self) -> None:
        """Every ttl/3 s. One failed renewal (a network blip) is retried at the next
        tick, bounded so release() never waits long; a 412 means the lease lapsed
        and another process took it."""
        while not self._stop.wait(self.ttl_s / 3):
            try:
                timeout = min(max(self.ttl_s / 3, 2.0), 10.0)
                if not self._write(self.generation, timeout=timeout):
                    self.lost = True
                    return
            except Exception:  # transient: the next tick tries again
                continue

    def release(self) -> None:
        """Stop renewing and delete the lease if it is still ours. Best effort, never
        raises: a lease left behind expires after ttl_s anyway."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.lost:
            return
        with contextlib.suppress(Exception):
            # the read first only for emulators that ignore ifGenerationMatch on
            # delete (fake-gcs-server); on GCS the precondition alone is enough
            blob = self.bucket.get_blob(self.key)
            if blob is not None and int(blob.generation) == self.generation:
                blob.delete(if_generation_match=self.generation)


class GcsRunDir:
    """One run's objects under ``gs://bucket/prefix/<name>/`` (same methods as LocalRunDir)."""

    def __init__(
        self,
        bucket: Bucket,
        prefix: str,
        name: str,
        staging_root: str | None = None,
        lease_ttl: float | None = None,
        reach: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        # the store's probe (GcsRunStore.reachable), run before the first request: a
        # run made but never read or written (a dry run's) asks nothing of the bucket
        self._reach = reach or (lambda: None)
        self.bucket = bucket
        self.prefix = f"{prefix}/{name}" if prefix else name
        self.uri = f"gs://{bucket.name}/{self.prefix}"
        self._generations: dict[str, int] = {}
        self._uploaded: dict[str, tuple[int, int]] = {}  # local file -> (size, mtime_ns)
        self._staging_root = staging_root
        self._staging: Path | None = None
        self._lease_ttl = lease_ttl
        self._lease: _Lease | None = None

    # --- objects -------------------------------------------------------------
    def _key(self, rel: str) -> str:
        """The object name of ``rel``; every request starts here, so the bucket is
        probed first (``reachable``)."""
        self._reach()
        rel = rel.strip("/")
        return f"{self.prefix}/{rel}" if rel else self.prefix

    def exists(self, rel: str = "") -> bool:
        key = self._key(rel)
        try:
            if self.bucket.blob(key).exists():
                return True
            # a "folder": any object below it
            return any(
                True
                for _ in self.bucket.client.list_blobs(self.bucket, prefix=f"{key}/", max_results=1)
            )
        except Exception as e:
            raise _translate(e, f"{self.uri}/{rel}") from e

    def read_text(self, rel: str) -> str:
        """The object's content, pinned to one generation (recorded for a later
        commit); replaced while being read -> read the new one."""
        from google.api_core import exceptions as gexc

        for attempt in range(5):
            try:
                blob = self.bucket.get_blob(self._key(rel))
                if blob is None:
                    raise NotFoundError(f"{self.uri}/{rel} not found")
                data = blob.download_as_bytes(if_generation_match=blob.generation)
            except NotFoundError:
                raise
            except (gexc.PreconditionFailed, gexc.NotFound) as e:
                if attempt == 4:
                    raise _translate(e, f"{self.uri}/{rel}") from e
                continue
            except Exception as e:
                raise _translate(e, f"{self.uri}/{rel}") from e
            self._generations[rel] = int(blob.generation)
            return data.decode()
        raise AssertionError("unreachable")

    def _check_lease(self) -> None:
        """A writer whose lease lapsed and was taken over stops writing: the run has
        another writer now."""
        if self._lease is not None and self._lease.lost:
            raise ConflictError(
                f"run {self.name!r} was taken over by another process: this process's "
                f"lease on it ({self.uri}/{LEASE}) expired",
                hint="the lease could not be renewed in time (a stall or a network "
                "outage); check who trains the run now with 'rlctl status'",
            )

    def write_text(self, rel: str, text: str) -> None:
        self._check_lease()
        blob = self.bucket.blob(self._key(rel))
        kw: dict[str, Any] = {}
        if _is_commit_object(rel):
            kw["if_generation_match"] = self._generations.get(rel, 0)
        try:
            blob.upload_from_string(text.encode(), content_type=_content_type(rel), **kw)
        except Exception as e:
            raise _translate(e, f"{self.uri}/{rel}") from e
        if blob.generation is not None:
            self._generations[rel] = int(blob.generation)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive for the life of the process that trains this run, across hosts:
        a run on gs:// may be trained from several machines or pods, which share no
        file lock, so this holds the lease object ``<run>/.lease`` (see the module
        docstring). A second train/resume anywhere gets a ConflictError naming the
        holder. The lease expires ttl_s after its last renewal, so a killed holder
        does not block the run forever (on the holder's own machine, at once)."""
        lease = _Lease(
            self.bucket,
            self._key(LEASE),
            self.name,
            f"{self.uri}/{LEASE}",
            lease_ttl_s(self._lease_ttl),
        )
        lease.acquire()
        self._lease = lease
        try:
            yield
        finally:
            self._lease = None
            lease.release()

    def lock_state(self) -> LockState:
        """Unknown: a lease left by a killed holder looks held until it expires, so
        whether its writer lives is the recorded pid's question (status.py)."""
        return LockState(None)

    def read_json(self, rel: str) -> Any:
        return json.loads(self.read_text(rel))

    def write_json(self, rel: str, data: Any) -> None:
        self.write_text(rel, json.dumps(data, indent=2, default=str) + "\n")

    def list(self, rel: str) -> list[str]:
        """Names directly below ``rel`` (objects and "folders"), like os.listdir."""
        base = f"{self._key(rel)}/"
        try:
            it = self.bucket.client.list_blobs(self.bucket, prefix=base, delimiter="/")
            names = {b.name[len(base) :] for b in it}
            names |= {p[len(base) :].rstrip("/") for p in it.prefixes}
        except Exception as e:
            raise _translate(e, f"{self.uri}/{rel}") from e
        return sorted(n for n in names if n)

    def _list_recursive(self, rel: str) -> builtins.list[str]:
        base = f"{self._key(rel)}/"
        try:
            return [
                b.name[len(base) :] for b in self.bucket.client.list_blobs(self.bucket, prefix=base)
            ]
        except Exception as e:
            raise _translate(e, f"{self.uri}/{rel}") from e

    def delete(self, rel: str = "") -> builtins.list[str]:
        """Delete ``rel`` (an object or everything below it); returns the deleted URIs."""
        key = self._key(rel)
        blobs = list(self.bucket.client.list_blobs(self.bucket, prefix=f"{key}/"))
        single = self.bucket.get_blob(key) if rel else None
        if single is not None:
            blobs.append(single)
        # markers first, so a half-deleted checkpoint never looks complete
        blobs.sort(key=lambda b: not b.name.endswith(f"/{COMMITTED}"))
        for b in blobs:
            b.delete()
        return [f"gs://{self.bucket.name}/{b.name}" for b in blobs]

    def move(self, src: str, dst: str) -> None:
        """Rename ``src`` (an object or everything below it) to ``dst``: each object
        copied within the bucket, then the originals deleted, a COMMITTED marker first
        (a half-moved checkpoint never looks complete) and never copied (a checkpoint
        set aside is not complete; one recovered is committed again once it restored)."""
        self._check_lease()
        key, new = self._key(src), self._key(dst)
        try:
            blobs = list(self.bucket.client.list_blobs(self.bucket, prefix=f"{key}/"))
            single = self.bucket.get_blob(key)
            if single is not None:
                blobs.append(single)
            blobs.sort(key=lambda b: not b.name.endswith(f"/{COMMITTED}"))
            for b in blobs:
                if b.name.endswith(f"/{COMMITTED}"):
                    b.delete()
                    continue
                self.bucket.copy_blob(b, self.bucket, new + b.name[len(key) :])
                b.delete()
        except Exception as e:
            raise _translate(e, f"{self.uri}/{src}") from e

    # --- local staging for files the trainer writes incrementally ------------
    def staging_dir(self) -> Path:
        """A fresh local folder per process: what Orbax/TensorBoard write into."""
        if self._staging is None:
            root = self._staging_root or os.environ.get("RLCTL_STAGING_DIR")
            if root:
                Path(root).mkdir(parents=True, exist_ok=True)
            self._staging = Path(tempfile.mkdtemp(prefix=f"rlctl-{self.name}-", dir=root))
            weakref.finalize(self, shutil.rmtree, str(self._staging), True)
        return self._staging

    def path_for(self, rel: str) -> str:
        p = self.staging_dir() / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        return str(p)

    def pull(self, rel: str) -> None:
        """Make the staging copy of ``rel`` (an object or a folder) match the store."""
        local = self.staging_dir() / rel
        key = self._key(rel)
        blob = self.bucket.get_blob(key)
        pairs = (
            [(blob, local)]
            if blob is not None
            else [
                (b, local / b.name[len(key) + 1 :])
                for b in self.bucket.client.list_blobs(self.bucket, prefix=f"{key}/")
            ]
        )
        try:
            for b, dest in pairs:
                dest.parent.mkdir(parents=True, exist_ok=True)
                b.download_to_filename(str(dest))
                st = dest.stat()
                self._uploaded[str(dest)] = (st.st_size, st.st_mtime_ns)
        except Exception as e:
            raise _translate(e, f"{self.uri}/{rel}") from e

    def push(self, rel: str) -> None:
        """Upload the staging copy of ``rel``: a file, or a folder's changed files."""
        local = self.staging_dir() / rel
        if local.is_file():
            files = [(local, rel)]
        elif local.is_dir():
            files = [
                (p, f"{rel}/{p.relative_to(local).as_posix()}")
                for p in sorted(local.rglob("*"))
                if p.is_file()
            ]
        else:
            return
        self._check_lease()
        try:
            for path, obj_rel in files:
                st = path.stat()
                sig = (st.st_size, st.st_mtime_ns)
                if self._uploaded.get(str(path)) == sig:
                    continue
                self.bucket.blob(self._key(obj_rel)).upload_from_filename(
                    str(path), content_type=_content_type(obj_rel)
                )
                self._uploaded[str(path)] = sig
        except Exception as e:
            raise _translate(e, f"{self.uri}/{rel}") from e

    # --- checkpoints -----------------------------------------------------------
    def checkpoint_steps(self) -> builtins.list[int]:
        """Steps whose upload finished: only those with a COMMITTED marker."""
        steps = []
        for rel in self._list_recursive(CHECKPOINTS):
            name, _, leaf = rel.partition("/")
            step = step_number(name)
            if leaf == COMMITTED and step is not None:
                steps.append(step)
        return sorted(steps)

    def publish_checkpoint(self, step: int) -> None:
        """Upload ``checkpoints/<step>/`` from staging, then write its marker last.

        Steps that Orbax has pruned locally (``checkpoint.keep``) are deleted from
        the store too, marker first.
        """
        rel = f"{CHECKPOINTS}/{step}"
        if not (self.staging_dir() / rel).is_dir():
            raise NotFoundError(f"checkpoint {step} is not in the staging folder")
        self.push(rel)
        marker = {"step": step, "files": sorted(self._list_recursive(rel))}
        self.write_json(f"{rel}/{COMMITTED}", marker)
        kept = {step_number(p.name) for p in (self.staging_dir() / CHECKPOINTS).iterdir()}
        for old in self.checkpoint_steps():
            if old not in kept:
                self.delete(f"{CHECKPOINTS}/{old}")

    def fetch_checkpoint(self, step: int) -> None:
        """Download a committed checkpoint into staging (for Orbax to restore)."""
        if step not in self.checkpoint_steps():
            raise NotFoundError(f"{self.uri}: no complete checkpoint at step {step}")
        self.pull(f"{CHECKPOINTS}/{step}")
        (self.staging_dir() / CHECKPOINTS / str(step) / COMMITTED).unlink(missing_ok=True)


def _content_type(rel: str) -> str:
    if rel.endswith(".json") or rel.endswith(COMMITTED):
        return "application/json"
    if rel.endswith((".yaml", ".jsonl")):
        return "text/plain"
    return "application/octet-stream"


class GcsRunStore:
    def __init__(
        self,
        uri: str,
        client: Client | None = None,
        staging_root: str | None = None,
        lease_ttl: float | None = None,
    ) -> None:
        bucket, self.prefix = parse_gs_uri(uri)
        self.uri = f"gs://{bucket}/{self.prefix}" if self.prefix else f"gs://{bucket}"
        if client is None:
            # the one client factory: ADC in a pod, anonymous with STORAGE_EMULATOR_HOST
            from rlctl.core.clients import Clients

            client = Clients().storage
        self.client = client
        self.bucket = self.client.bucket(bucket)
        self.staging_root = staging_root
        self.lease_ttl = lease_ttl  # None: $RLCTL_LEASE_TTL_S or 120 s, read at lock()
        self._reached = False  # reachable() answered once

    def reachable(self) -> None:
        """``probe_bucket`` once, before the store is first used."""
        if not self._reached:
            probe_bucket(self.client, self.bucket, self.prefix)
            self._reached = True

    def run(self, name: str) -> GcsRunDir:
        return GcsRunDir(
            self.bucket,
            self.prefix,
            validate_name(name, "run"),
            self.staging_root,
            self.lease_ttl,
            reach=self.reachable,
        )

    def list_runs(self) -> list[str]:
        self.reachable()
        base = f"{self.prefix}/" if self.prefix else ""
        try:
            it = self.client.list_blobs(self.bucket, prefix=base, delimiter="/")
            list(it)
            names = [p[len(base) :].rstrip("/") for p in it.prefixes]
            return sorted(
                n
                for n in names
                if any(self.bucket.blob(f"{base}{n}/{m}").exists() for m in RUN_MARKERS)
            )
        except Exception as e:
            raise _translate(e, self.uri) from e

    def existing(self, name: str) -> GcsRunDir:
        return cast(GcsRunDir, existing_run(self, name))  # its own store's run()
