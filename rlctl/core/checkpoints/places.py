"""Folders to convert from and into: a local path or a ``gs://`` prefix, read by byte
range and written through a hidden staging area that becomes the output only whole.

Reads are ranged (``pread`` locally, ranged GETs on Cloud Storage), so a tensor is
fetched on its own and no shard is ever read whole. Writes go to
``<DST>.rlctl-partial`` (a sibling folder, or a sibling prefix): a conversion that
fails or is killed leaves DST untouched, and re-running it finds the files it
already finished there and skips them. ``commit`` turns staging into DST (a rename
locally; server-side copies on Cloud Storage, no bytes through this machine).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Protocol

from rlctl.core.errors import ConfigError

PARTIAL = ".rlctl-partial"
_PIECE = 64 << 20  # one ranged GET at most (bounds memory and request time)


class Place(Protocol):
    """A readable folder (or the folder of a single file)."""

    uri: str

    def exists(self, rel: str = "") -> bool: ...
    def size(self, rel: str) -> int: ...
    def read_into(self, rel: str, offset: int, buf: memoryview) -> None: ...
    def list(self) -> list[str]: ...

    def read_bytes(self, rel: str) -> bytes:
        n = self.size(rel)
        buf = bytearray(n)
        self.read_into(rel, 0, memoryview(buf))
        return bytes(buf)

    def local_path(self) -> Path | None:
        return None


class LocalPlace(Place):
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self.uri = str(self.path)

    def exists(self, rel: str = "") -> bool:
        return (self.path / rel).exists() if rel else self.path.exists()

    def size(self, rel: str) -> int:
        return (self.path / rel).stat().st_size

    def read_into(self, rel: str, offset: int, buf: memoryview) -> None:
        fd = os.open(self.path / rel, os.O_RDONLY)
        try:
            done = 0
            while done < len(buf):
                n = os.preadv(fd, [buf[done:]], offset + done)
                if n <= 0:
                    raise ConfigError(
                        f"{self.path / rel}: ends early (truncated file)",
                        hint="copy or download the model again",
                    )
                done += n
        finally:
            os.close(fd)

    def list(self) -> list[str]:
        if not self.path.is_dir():
            return []
        return sorted(str(p.relative_to(self.path)) for p in self.path.rglob("*") if p.is_file())

    def local_path(self) -> Path | None:
        return self.path


def parse_gs(uri: str) -> tuple[str, str]:
    rest = uri[len("gs://") :]
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ConfigError(f"{uri!r} names no bucket", hint="use gs://BUCKET/PATH")
    return bucket, prefix.strip("/")


class GcsPlace(Place):
    def __init__(self, uri: str, client: Any = None) -> None:
        bucket, self.prefix = parse_gs(uri)
        self.uri = f"gs://{bucket}/{self.prefix}".rstrip("/")
        if client is None:
            from rlctl.core.clients import Clients  # the one factory (ADC / emulator)

            client = Clients().storage
        self.client = client
        self.bucket = client.bucket(bucket)
        self._sizes: dict[str, int] | None = None

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def _listing(self) -> dict[str, int]:
        if self._sizes is None:
            from rlctl.core.store.gcs import probe_bucket

            probe_bucket(self.client, self.bucket, self.prefix)  # within 10 s, one line
            base = f"{self.prefix}/" if self.prefix else ""
            try:
                self._sizes = {
                    b.name[len(base) :]: int(b.size or 0)
                    for b in self.client.list_blobs(self.bucket, prefix=base)
                }
            except Exception as e:
                raise _gcs_error(e, self.uri) from e
        return self._sizes

    def exists(self, rel: str = "") -> bool:
        listing = self._listing()
        if not rel:
            return bool(listing)
        return rel in listing or any(k.startswith(rel.rstrip("/") + "/") for k in listing)

    def size(self, rel: str) -> int:
        try:
            return self._listing()[rel]
        except KeyError:
            raise ConfigError(f"{self.uri}/{rel} does not exist") from None

    def read_into(self, rel: str, offset: int, buf: memoryview) -> None:
        blob = self.bucket.blob(self.key(rel))
        done = 0
        try:
            while done < len(buf):
                n = min(_PIECE, len(buf) - done)
                data = blob.download_as_bytes(
                    start=offset + done, end=offset + done + n - 1, checksum=None
                )
                if len(data) != n:
                    raise ConfigError(
                        f"{self.uri}/{rel}: ends early (truncated object)",
                        hint="copy or upload the model again",
                    )
                buf[done : done + n] = data
                done += n
        except ConfigError:
            raise
        except Exception as e:
            raise _gcs_error(e, f"{self.uri}/{rel}") from e

    def list(self) -> list[str]:
        return sorted(self._listing())

    def download(self, rel: str, path: Path) -> None:
        """One object into a local file, streamed (never whole in memory)."""
        try:
            self.bucket.blob(self.key(rel)).download_to_filename(str(path))
        except Exception as e:
            raise _gcs_error(e, f"{self.uri}/{rel}") from e


def _gcs_error(e: Exception, what: str) -> Exception:
    from rlctl.core.errors import CloudError, NotFoundError, PermissionDeniedError

    name = type(e).__name__
    if name == "NotFound":
        return NotFoundError(f"{what} not found")
    if name in ("Forbidden", "Unauthorized"):
        return PermissionDeniedError(f"no access to {what}")
    first = (str(e).strip().splitlines() or [""])[0][:160]
    return CloudError(f"Cloud Storage: {what}: {name}: {first}")


def open_place(uri: str, client: Any = None) -> Place:
    if uri.startswith("gs://"):
        from rlctl.core.errors import require_extra

        require_extra("google.cloud.storage", "gcp")
        return GcsPlace(uri, client)
    if "://" in uri:
        raise ConfigError(f"{uri!r}: only local paths and gs:// are supported")
    return LocalPlace(uri)


# --- outputs ---------------------------------------------------------------------------
class Output(Protocol):
    """Where a conversion writes: staging first, DST only on ``commit``."""

    uri: str
    staging_uri: str  # readable as a source before commit (``--verify``)

    def done(self, rel: str) -> bool:
        """Whether a file is already complete in staging (a re-run skips it)."""
        ...

    @contextmanager
    def open(self, rel: str) -> Iterator[IO[bytes]]:
        """A writable stream; the file appears in staging only if the block succeeds."""
        yield  # type: ignore[misc]  # abstract: subclasses yield a stream

    def write_bytes(self, rel: str, data: bytes) -> None:
        with self.open(rel) as f:
            f.write(data)

    def staging_dir(self) -> Path | None:
        """A local folder to write into directly (local outputs), else None."""
        return None

    def commit(self) -> None: ...

    def abort(self) -> None:
        """Remove staging: the input was bad, so nothing of it is worth resuming."""


class LocalOutput(Output):
    def __init__(self, path: str | Path, overwrite: bool) -> None:
        self.path = Path(path).expanduser().absolute()
        self.uri = str(self.path)
        self.overwrite = overwrite
        self.stage = self.path.with_name(self.path.name + PARTIAL)
        self.staging_uri = str(self.stage)
        if self.path.exists() and not overwrite:
            raise ConfigError(f"{self.path} already exists", hint="pass --overwrite to replace it")
        if not self.path.parent.is_dir():
            raise ConfigError(f"{self.path.parent} is not a folder")
        self.stage.mkdir(exist_ok=True)

    def done(self, rel: str) -> bool:
        return (self.stage / rel).is_file()

    @contextmanager
    def open(self, rel: str) -> Iterator[IO[bytes]]:
        final = self.stage / rel
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(final.name + ".tmp")
        with tmp.open("wb") as f:
            try:
                yield f
                f.flush()
                os.fsync(f.fileno())
            except BaseException:
                f.close()
                tmp.unlink(missing_ok=True)
                raise
        os.replace(tmp, final)

    def staging_dir(self) -> Path:
        return self.stage

    def commit(self) -> None:
        old = self.path.with_name(self.path.name + ".rlctl-old")
        if self.path.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(self.path, old)
        os.replace(self.stage, self.path)
        shutil.rmtree(old, ignore_errors=True)

    def abort(self) -> None:
        shutil.rmtree(self.stage, ignore_errors=True)


class GcsOutput(Output):
    def __init__(self, uri: str, overwrite: bool, client: Any = None) -> None:
        self.dst = GcsPlace(uri, client)
        self.uri = self.dst.uri
        self.overwrite = overwrite
        if self.dst.exists() and not overwrite:
            raise ConfigError(f"{self.uri} already exists", hint="pass --overwrite to replace it")
        self.stage = GcsPlace(self.uri + PARTIAL, self.dst.client)
        self.staging_uri = self.stage.uri

    def done(self, rel: str) -> bool:
        return rel in self.stage._listing()

    @contextmanager
    def open(self, rel: str) -> Iterator[IO[bytes]]:
        # a resumable upload: the object exists only once the stream is closed whole
        blob = self.stage.bucket.blob(self.stage.key(rel), chunk_size=16 << 20)
        try:
            with blob.open("wb", ignore_flush=True) as f:
                yield f
        except Exception as e:
            if not type(e).__module__.startswith(("google.", "requests.", "urllib3.")):
                raise  # ours, or the caller's: not a storage failure
            raise _gcs_error(e, f"{self.stage.uri}/{rel}") from e
        self.stage._listing()[rel] = blob.size or 0

    def commit(self) -> None:
        bucket = self.dst.bucket
        try:
            if self.overwrite:
                for rel in self.dst.list():
                    bucket.blob(self.dst.key(rel)).delete()
            for rel in self.stage.list():
                src = bucket.blob(self.stage.key(rel))
                bucket.copy_blob(src, bucket, self.dst.key(rel))
            self.abort()
        except Exception as e:
            raise _gcs_error(e, self.uri) from e

    def abort(self) -> None:
        for rel in self.stage.list():
            self.stage.bucket.blob(self.stage.key(rel)).delete()
        self.stage._sizes = {}


def open_output(uri: str, overwrite: bool, client: Any = None) -> Output:
    if uri.startswith("gs://"):
        from rlctl.core.errors import require_extra

        require_extra("google.cloud.storage", "gcp")
        return GcsOutput(uri, overwrite, client)
    if "://" in uri:
        raise ConfigError(f"{uri!r}: only local paths and gs:// are supported")
    return LocalOutput(uri, overwrite)
