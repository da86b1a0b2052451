"""One object-storage URL, reached through fsspec, with every failure told as one line.

A :class:`Remote` is a URL (``s3://bucket/prefix/name``) and the ``storage`` settings it is reached with; it pickles
(to pool and Ray workers) as those two and opens its file system lazily in each process. Its methods are the few
operations MindFoundry needs of a store -- list, stat, read (streamed), write one object, upload and download a file,
delete, abort unfinished multipart uploads -- and nothing assumes a rename, a directory or a lock: object stores have
none of them (commits are :mod:`.commit`'s).

Every call runs inside :func:`failures`, which turns what s3fs, botocore and aiohttp raise into a
:class:`StorageError`: missing bucket, no credentials, refused credentials, permission denied, unreachable endpoint,
a connection that kept breaking after the retries, a missing object -- each with the URL, what was being done and
what to do, and never a secret. The client retries failed requests itself with exponential backoff
(``storage.retries``; standard mode); a failure reaches this module only when the retries are spent.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import os
import posixpath
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from mindfoundry.config.section import url_protocol
from mindfoundry.config.storage_config import StorageConfig
from mindfoundry.storage.claim import LeaseClaim
from mindfoundry.storage.failures import (
    DENIED,
    StorageError,
    bucket_missing,
    error_code,
    explain,
    is_storage_failure,
    mask,
)
from mindfoundry.storage.location import Claim, Location, Seal, Version

#: The install extra that brings the S3 file system.
S3_EXTRA = "pip install 'mindfoundry[s3]'"


def _strip(url: str) -> str:
    """The URL without a trailing slash (a prefix names the same objects with or without it)."""
    head = url.index("://") + 3
    return url[:head] + url[head:].rstrip("/")


@functools.lru_cache(maxsize=16)
def _filesystem(protocol: str, options_json: str, environment: str) -> Any:
    """The fsspec file system of ``protocol`` with these options, one per process (s3fs keeps connections open) and
    per ``environment`` (the AWS variables it reads credentials and the endpoint from)."""
    try:
        import fsspec

        cls = fsspec.get_filesystem_class(protocol)
    except ImportError as exc:
        fix = S3_EXTRA if protocol in ("s3", "s3a") else f"install the fsspec implementation of {protocol}://"
        raise StorageError(f"{protocol}:// URLs need a package that is not installed ({exc}): {fix}") from None
    except ValueError:
        raise StorageError(f"unknown storage protocol '{protocol}://': use s3:// (S3, Huawei OBS, MinIO) or a "
                           "protocol fsspec knows (fsspec.available_protocols())") from None
    filesystem = cls(**json.loads(options_json), skip_instance_cache=True)
    if getattr(filesystem, "async_impl", False):
        _quiet_abandoned_requests()
    return filesystem


def _ignore_abandoned_request(loop: Any, context: dict[str, Any]) -> None:
    """fsspec's event-loop exception handler: a connection error in a request task that the client gave up on (it
    retried, or failed the call, which :func:`failures` reports as one line) is not printed as a stray traceback;
    anything else goes to asyncio's default handler."""
    if isinstance(context.get("exception"), OSError):  # aiohttp's connection errors and timeouts are OSErrors
        return
    loop.default_exception_handler(context)


@functools.cache
def _quiet_abandoned_requests() -> None:
    """Install :func:`_ignore_abandoned_request` on fsspec's I/O loop, once per process."""
    import fsspec.asyn

    fsspec.asyn.get_loop().set_exception_handler(_ignore_abandoned_request)


class Remote(Location):
    """A URL on object storage and the settings to reach it (see the module docstring)."""

    __slots__ = ("url", "storage")

    def __init__(self, url: str, storage: StorageConfig | None = None) -> None:
        if url_protocol(url) is None:
            raise ValueError(f"not a URL: {url!r}")
        self.url = _strip(url)
        self.storage = storage or StorageConfig()

    # -- naming ------------------------------------------------------------------------------------------------
    @property
    def protocol(self) -> str:
        return url_protocol(self.url) or ""

    @property
    def key(self) -> str:
        """The path the file system is given: ``bucket/prefix/name`` for S3."""
        return self.url.split("://", 1)[1]

    @property
    def bucket(self) -> str:
        return self.key.split("/", 1)[0]

    @property
    def name(self) -> str:
        return posixpath.basename(self.key)

    @property
    def parent(self) -> Remote:
        head = posixpath.dirname(self.key)
        return Remote(f"{self.protocol}://{head or self.key}", self.storage)

    def __truediv__(self, part: str | os.PathLike[str]) -> Remote:
        part = str(part).strip("/")
        return Remote(f"{self.url}/{part}" if part else self.url, self.storage)

    def relative_to(self, other: Location) -> str:
        """This URL's path below ``other`` (ValueError when it is not below)."""
        if not isinstance(other, Remote):
            raise ValueError(f"{self.url} is not under {other}")
        if self.url == other.url:
            return ""
        if not self.url.startswith(other.url + "/"):
            raise ValueError(f"{self.url} is not under {other.url}")
        return self.url[len(other.url) + 1:]

    def __str__(self) -> str:
        return self.url

    def __getstate__(self) -> tuple[str, StorageConfig]:
        return self.url, self.storage

    def __setstate__(self, state: tuple[str, StorageConfig]) -> None:
        self.url, self.storage = state

    # -- the file system ---------------------------------------------------------------------------------------
    @property
    def fs(self) -> Any:
        options = self.storage.fsspec_options(self.protocol)
        if self.protocol in ("s3", "s3a"):
            # listings are never cached: other processes commit objects, and a stale listing would miss them
            options.setdefault("use_listings_cache", False)
        environment = hashlib.sha256(repr(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
                                     .encode()).hexdigest()
        fs = _filesystem(self.protocol, json.dumps(options, sort_keys=True), environment)
        if self.protocol in ("s3", "s3a"):
            fs.retries = self.storage.outer_attempts
        return fs

    @contextlib.contextmanager
    def failures(self, doing: str) -> Iterator[None]:
        """Turn what the store raises while ``doing`` (e.g. "reading") this URL into a :class:`StorageError`."""
        try:
            yield
        except StorageError:
            raise
        except Exception as exc:
            if not is_storage_failure(exc):  # a bug keeps its traceback
                raise
            if error_code(exc) == "403":  # a HEAD's bare 403: a listing's answer says whether keys or rights
                self._diagnose(doing)
            raise explain(exc, self.url, self.storage, doing) from None

    def _diagnose(self, doing: str) -> None:
        """Raise the explained error of a listing of this key, when it fails with a code (which a HEAD never has).

        S3 answers a HEAD of a missing object with 403, not 404, when the credentials may not list the bucket
        (s3:ListBucket): a listing refused too means that whether the object exists cannot be told, which is what
        the user must hear, not "may not read"."""
        if self.protocol not in ("s3", "s3a"):
            return
        bucket, _, prefix = self.key.partition("/")
        try:
            self.fs.call_s3("list_objects_v2", Bucket=bucket, Prefix=prefix, MaxKeys=1)
        except Exception as probe:
            code = error_code(probe) if is_storage_failure(probe) else None
            if code in DENIED:
                raise StorageError(mask(
                    f"permission denied {doing} {self.url} (403; listing s3://{bucket}: {code}): the credentials in "
                    f"use may not list the bucket (s3:ListBucket), and without that S3 answers 403 for an object "
                    f"that does not exist, so whether it exists cannot be told; grant s3:ListBucket and "
                    f"s3:GetObject on the prefix or choose another location", self.storage)) from None
            if code not in (None, "403"):
                raise explain(probe, self.url, self.storage, doing) from None

    # -- reading -----------------------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """The object's size and version (``ETag``), FileNotFoundError-style error when it is missing."""
        with self.failures("looking up"):
            return self.fs.info(self.key)

    def absolute(self) -> Remote:
        return self

    def describe(self) -> str:
        kind = self._kind()
        return {"file": "an object", "directory": "a prefix holding objects"}.get(kind or "", "missing")

    def size_and_version(self) -> tuple[int, Version]:
        info = self.info()
        version = info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified") or ""
        return int(info.get("size") or 0), str(version)

    def _kind(self) -> str | None:
        """"file", "directory" (a prefix with objects below) or None when nothing is there; a missing bucket is an
        error the caller can act on, not None."""
        with self.failures("looking up"):
            try:
                return self.fs.info(self.key).get("type")
            except FileNotFoundError as exc:
                if "/" not in self.key or bucket_missing(exc):
                    raise
                return None

    def exists(self) -> bool:
        """Whether an object, or any object under this prefix, exists."""
        return self._kind() is not None

    def is_file(self) -> bool:
        return self._kind() == "file"

    def is_dir(self) -> bool:
        return self._kind() == "directory"

    def permissions(self) -> int | None:
        return None

    def read_bytes(self) -> bytes:
        with self.failures("reading"):
            return self.fs.cat_file(self.key)

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def open(self, block_size: int = 8 << 20) -> io.BufferedReader:
        """The object as a binary stream read ahead in blocks (ranged GETs): never downloaded whole first."""
        with self.failures("opening"):
            raw = self.fs.open(self.key, "rb", block_size=block_size, cache_type="readahead")
        return io.BufferedReader(StreamFailures(raw, self), buffer_size=1 << 20)

    def download(self, local: Path) -> None:
        """The object's bytes into the local file ``local`` (whose folder exists)."""
        with self.failures("downloading"):
            self.fs.get_file(self.key, str(local))
        if not local.exists():  # s3fs writes no file for an empty object
            local.write_bytes(b"")

    def files(self) -> list[Location]:
        """Every object under this prefix (at any depth), sorted; none when there are none."""
        with self.failures("listing"):
            found = self.fs.find(self.key, withdirs=False)
        return [Remote(f"{self.protocol}://{key}", self.storage) for key in sorted(found)]

    def children(self) -> list[str]:
        """The names directly under this prefix (objects and sub-prefixes), sorted."""
        with self.failures("listing"):
            try:
                entries = self.fs.ls(self.key, detail=False)
            except FileNotFoundError as exc:
                if "/" not in self.key or bucket_missing(exc):
                    raise
                return []
        return sorted({posixpath.basename(e.rstrip("/")) for e in entries if e.rstrip("/") != self.key})

    def glob(self, pattern: str) -> list[Location]:
        """The objects and prefixes matching a glob of the URL's form (``s3://b/p/*.jsonl``, ``**`` recurses)."""
        with self.failures("listing"):
            found = self.fs.glob(pattern.split("://", 1)[1])
        return [Remote(f"{self.protocol}://{key}", self.storage) for key in sorted(found)]

    # -- writing -----------------------------------------------------------------------------------------------
    def write_bytes(self, data: bytes) -> None:
        """One object holding ``data`` (visible whole or not at all: a PUT completes or fails)."""
        with self.failures("writing"):
            self.fs.pipe_file(self.key, data)

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode("utf-8"))

    def upload(self, local: Path) -> None:
        """The local file ``local`` as this object (a multipart upload for large files: visible only once complete)."""
        with self.failures("uploading to"):
            self.fs.put_file(str(local), self.key)

    def put_file(self, local: Path) -> None:
        self.upload(local)

    def delete(self) -> None:
        """Remove this object (nothing when it is already gone)."""
        with self.failures("deleting"):
            try:
                self.fs.rm_file(self.key)
            except FileNotFoundError:
                pass

    def delete_tree(self) -> None:
        """Remove every object under this prefix."""
        with self.failures("deleting"):
            found = self.fs.find(self.key, withdirs=False)
            if found:
                self.fs.rm(found)

    def claim(self, *, shared: bool = False) -> Claim:
        return LeaseClaim(self, shared=shared)

    def abort_uploads(self) -> int:
        """Abort the multipart uploads under this prefix that a killed writer left unfinished (their parts cost storage
        and never become objects); return how many. S3 only; other protocols have none to abort."""
        if self.protocol not in ("s3", "s3a"):
            return 0
        bucket, _, prefix = self.key.partition("/")
        aborted = 0
        with self.failures("cleaning up unfinished uploads under"):
            fs = self.fs
            listing = fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=prefix)
            for upload in listing.get("Uploads", []):
                fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
                aborted += 1
        return aborted

    # -- committed folders ---------------------------------------------------------------------------------------
    def put_folder(self, local: Path, seal: Seal) -> None:
        if self.exists():  # what was here is no longer committed before any object changes, then gone
            self.remove_folder(seal)
        seal.write(local)
        files = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
        files.remove(seal.marker)
        for rel in files:
            (self / rel).upload(local / rel)
        sizes = {f.relative_to(self): f.info()["size"] for f in self.files()}
        wrong = [rel for rel in files if sizes.get(rel) != (local / rel).stat().st_size]
        if wrong:
            raise StorageError(f"{self / wrong[0]} did not arrive whole (its size differs after the upload): the store "
                               f"lost a write; {self} is not committed, write it again")
        (self / seal.marker).upload(local / seal.marker)

    def move_folder(self, target: Location, seal: Seal) -> None:
        dest = Remote(str(target), self.storage)
        for obj in sorted(self.files(), key=lambda o: o.name == seal.marker):  # the marker's copy last
            with self.failures("copying"):
                self.fs.copy(Remote(str(obj)).key, (dest / obj.relative_to(self)).key)
        self.remove_folder(seal)

    def holds_commit(self, seal: Seal) -> bool:
        return (self / seal.marker).is_file()

    def remove_folder(self, seal: Seal) -> None:
        (self / seal.marker).delete()
        self.delete_tree()

    def local_path(self, key: str, why: str) -> Path:
        raise StorageError(f"{key} cannot be a URL ({self.url}): {why}")

    def local_folder(self) -> Path | None:
        return None

    def staging(self, elsewhere: Path) -> Path:
        return elsewhere

    def on_io_threads(self, call: Callable[[], None]) -> None:
        """``call`` on fsspec's I/O thread, where s3fs's requests run."""
        import fsspec.asyn

        fsspec.asyn.get_loop().call_soon_threadsafe(call)

    def check_reachable(self) -> None:
        """List one object of the bucket: a missing bucket, missing or refused credentials and an unreachable endpoint
        are told here, before any work, as one line."""
        bucket, _, prefix = self.key.partition("/")
        with self.failures("reaching"):
            if self.protocol in ("s3", "s3a"):
                self.fs.call_s3("list_objects_v2", Bucket=bucket, Prefix=prefix, MaxKeys=1)
            else:
                self.fs.exists(self.key)

    def check_writable(self) -> None:
        """Write and delete a small object under this prefix: write permission is told before any work."""
        probe = self / f".write-probe-{os.getpid()}"
        with self.failures("writing to"):
            self.fs.pipe_file(probe.key, b"ok")
        probe.delete()


class StreamFailures(io.RawIOBase):
    """A stream from :meth:`Remote.open` whose read errors (a connection cut after the retries) are
    :class:`StorageError`s naming the object (wrap it in :class:`io.BufferedReader` to read lines)."""

    def __init__(self, raw: Any, remote: Remote) -> None:
        super().__init__()
        self._raw, self._remote = raw, remote

    def readinto(self, buffer: Any) -> int:
        with self._remote.failures("reading"):
            data = self._raw.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()
