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
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlctl.core.errors import CloudError, ConfigError, ConflictError, NotFoundError
from rlctl.core.names import validate_name
from rlctl.core.store.base import CHECKPOINTS, SPEC, STATUS, existing_run

if TYPE_CHECKING:  # google.cloud.* is imported only by core/clients.py
    from rlctl.core.clients import StorageBucket as Bucket
    from rlctl.core.clients import StorageClient as Client

COMMITTED = "COMMITTED"
_COMMIT_NAMES = {SPEC, STATUS}


def _is_commit_object(rel: str) -> bool:
    return rel in _COMMIT_NAMES or rel.endswith(f"/{COMMITTED}")


def parse_gs_uri(uri: str) -> tuple[str, str]:
    """``gs://bucket/a/b/`` -> ("bucket", "a/b") with no leading/trailing slashes."""
    if not uri.startswith("gs://"):
        raise ConfigError(f"{uri!r} is not a gs:// URI", hint="use gs://BUCKET/PREFIX")
    bucket, _, prefix = uri[len("gs://"):].partition("/")
    if not bucket:
        raise ConfigError(f"{uri!r} names no bucket", hint="use gs://BUCKET/PREFIX")
    return bucket, prefix.strip("/")


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


class GcsRunDir:
    """One run's objects under ``gs://bucket/prefix/<name>/`` (same methods as LocalRunDir)."""

    def __init__(self, bucket: Bucket, prefix: str, name: str,
                 staging_root: str | None = None) -> None:
        self.name = name
        self.bucket = bucket
        self.prefix = f"{prefix}/{name}" if prefix else name
        self.uri = f"gs://{bucket.name}/{self.prefix}"
        self._generations: dict[str, int] = {}
        self._uploaded: dict[str, tuple[int, int]] = {}  # local file -> (size, mtime_ns)
        self._staging_root = staging_root
        self._staging: Path | None = None

    # --- objects -------------------------------------------------------------
    def _key(self, rel: str) -> str:
        rel = rel.strip("/")
        return f"{self.prefix}/{rel}" if rel else self.prefix

    def exists(self, rel: str = "") -> bool:
        key = self._key(rel)
        try:
            if self.bucket.blob(key).exists():
                return True
            # a "folder": any object below it
            return any(True for _ in self.bucket.client.list_blobs(
                self.bucket, prefix=f"{key}/", max_results=1))
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

    def write_text(self, rel: str, text: str) -> None:
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
        """No cross-host lease yet: on gs:// a second writer is caught per file by the
        generation preconditions of spec.yaml, status.json and COMMITTED instead."""
        yield

    def read_json(self, rel: str) -> Any:
        return json.loads(self.read_text(rel))

    def write_json(self, rel: str, data: Any) -> None:
        self.write_text(rel, json.dumps(data, indent=2, default=str) + "\n")

    def list(self, rel: str) -> list[str]:
        """Names directly below ``rel`` (objects and "folders"), like os.listdir."""
        base = f"{self._key(rel)}/"
        try:
            it = self.bucket.client.list_blobs(self.bucket, prefix=base, delimiter="/")
            names = {b.name[len(base):] for b in it}
            names |= {p[len(base):].rstrip("/") for p in it.prefixes}
        except Exception as e:
            raise _translate(e, f"{self.uri}/{rel}") from e
        return sorted(n for n in names if n)

    def _list_recursive(self, rel: str) -> list[str]:
        base = f"{self._key(rel)}/"
        try:
            return [b.name[len(base):] for b in
                    self.bucket.client.list_blobs(self.bucket, prefix=base)]
        except Exception as e:
            raise _translate(e, f"{self.uri}/{rel}") from e

    def delete(self, rel: str = "") -> list[str]:
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
        pairs = [(blob, local)] if blob is not None else [
            (b, local / b.name[len(key) + 1:])
            for b in self.bucket.client.list_blobs(self.bucket, prefix=f"{key}/")
        ]
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
            files = [(p, f"{rel}/{p.relative_to(local).as_posix()}")
                     for p in sorted(local.rglob("*")) if p.is_file()]
        else:
            return
        try:
            for path, obj_rel in files:
                st = path.stat()
                sig = (st.st_size, st.st_mtime_ns)
                if self._uploaded.get(str(path)) == sig:
                    continue
                self.bucket.blob(self._key(obj_rel)).upload_from_filename(
                    str(path), content_type=_content_type(obj_rel))
                self._uploaded[str(path)] = sig
        except Exception as e:
            raise _translate(e, f"{self.uri}/{rel}") from e

    # --- checkpoints -----------------------------------------------------------
    def checkpoint_steps(self) -> list[int]:
        """Steps whose upload finished: only those with a COMMITTED marker."""
        steps = []
        for rel in self._list_recursive(CHECKPOINTS):
            step, _, leaf = rel.partition("/")
            if leaf == COMMITTED and step.isdigit():
                steps.append(int(step))
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
        kept = {int(p.name) for p in (self.staging_dir() / CHECKPOINTS).iterdir()
                if p.name.isdigit()}
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
    def __init__(self, uri: str, client: Client | None = None,
                 staging_root: str | None = None) -> None:
        bucket, self.prefix = parse_gs_uri(uri)
        self.uri = f"gs://{bucket}/{self.prefix}" if self.prefix else f"gs://{bucket}"
        if client is None:
            # the one client factory: ADC in a pod, anonymous with STORAGE_EMULATOR_HOST
            from rlctl.core.clients import Clients

            client = Clients().storage
        self.client = client
        self.bucket = self.client.bucket(bucket)
        self.staging_root = staging_root

    def run(self, name: str) -> GcsRunDir:
        return GcsRunDir(self.bucket, self.prefix, validate_name(name, "run"),
                         self.staging_root)

    def list_runs(self) -> list[str]:
        base = f"{self.prefix}/" if self.prefix else ""
        try:
            it = self.client.list_blobs(self.bucket, prefix=base, delimiter="/")
            list(it)
            names = [p[len(base):].rstrip("/") for p in it.prefixes]
            return sorted(n for n in names if self.bucket.blob(f"{base}{n}/{SPEC}").exists())
        except Exception as e:
            raise _translate(e, self.uri) from e

    def existing(self, name: str) -> GcsRunDir:
        return existing_run(self, name)  # type: ignore[return-value]
