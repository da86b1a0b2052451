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
from mindfoundry.config.storage_config import StorageConfig, masked
from mindfoundry.errors import InputMissingError, MindFoundryError

#: The install extra that brings the S3 file system.
S3_EXTRA = "pip install 'mindfoundry[s3]'"


class StorageError(MindFoundryError, OSError):
    """Object storage refused or failed an operation; the message names the URL, the cause and the fix."""


class ObjectMissingError(StorageError, InputMissingError):
    """An object (or every object under a prefix) that should be there is not."""


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


def on_io_thread(call: Callable[[], None]) -> None:
    """Run ``call`` on fsspec's I/O thread (where s3fs's requests run), without waiting for it."""
    try:
        import fsspec.asyn
    except ImportError:
        return
    fsspec.asyn.get_loop().call_soon_threadsafe(call)


class Remote:
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

    def with_name(self, name: str) -> Remote:
        """The URL beside this one named ``name``."""
        return self.parent / name

    def __truediv__(self, part: str | os.PathLike[str]) -> Remote:
        part = str(part).strip("/")
        return Remote(f"{self.url}/{part}" if part else self.url, self.storage)

    def relative_to(self, other: Remote) -> str:
        """This URL's path below ``other`` (ValueError when it is not below)."""
        if self.url == other.url:
            return ""
        if not self.url.startswith(other.url + "/"):
            raise ValueError(f"{self.url} is not under {other.url}")
        return self.url[len(other.url) + 1:]

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"Remote({self.url!r})"  # never the settings: they may hold a secret

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Remote) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)

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
            if _code(_chain(exc)) == "403":  # a HEAD's bare 403: a listing's answer says whether keys or rights
                self._diagnose(doing)
            raise explain(exc, self, doing) from None

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
            code = _code(_chain(probe)) if is_storage_failure(probe) else None
            if code in _DENIED:
                raise StorageError(mask(
                    f"permission denied {doing} {self.url} (403; listing s3://{bucket}: {code}): the credentials in "
                    f"use may not list the bucket (s3:ListBucket), and without that S3 answers 403 for an object "
                    f"that does not exist, so whether it exists cannot be told; grant s3:ListBucket and "
                    f"s3:GetObject on the prefix or choose another location", self.storage)) from None
            if code not in (None, "403"):
                raise explain(probe, self, doing) from None

    # -- reading -----------------------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """The object's size and version (``ETag``), FileNotFoundError-style error when it is missing."""
        with self.failures("looking up"):
            return self.fs.info(self.key)

    def _kind(self) -> str | None:
        """"file", "directory" (a prefix with objects below) or None when nothing is there; a missing bucket is an
        error the caller can act on, not None."""
        with self.failures("looking up"):
            try:
                return self.fs.info(self.key).get("type")
            except FileNotFoundError as exc:
                if "/" not in self.key or _bucket_missing(exc):
                    raise
                return None

    def exists(self) -> bool:
        """Whether an object, or any object under this prefix, exists."""
        return self._kind() is not None

    def is_file(self) -> bool:
        return self._kind() == "file"

    def is_dir(self) -> bool:
        return self._kind() == "directory"

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

    def files(self) -> list[Remote]:
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
                if "/" not in self.key or _bucket_missing(exc):
                    raise
                return []
        return sorted({posixpath.basename(e.rstrip("/")) for e in entries if e.rstrip("/") != self.key})

    def glob(self, pattern: str) -> list[Remote]:
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

    def copy_to(self, target: Remote) -> None:
        """This object as ``target`` too, copied inside the store (no bytes through this machine)."""
        with self.failures("copying"):
            self.fs.copy(self.key, target.key)

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


# -- what went wrong ---------------------------------------------------------------------------------------------
#: The codes of a request the credentials may not make (a HEAD's is the bare status).
_DENIED = ("AccessDenied", "AllAccessDisabled", "403")
_CREDENTIAL_CODES = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
                     "TokenRefreshRequired", "InvalidClientTokenId", "AuthorizationHeaderMalformed")


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and everything it was raised from or during."""
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


#: Exception classes (by name: botocore and aiohttp are imported only with s3fs) that mean the store or the way to it
#: failed, not our code.
_STORAGE_FAILURES = {"OSError", "BotoCoreError", "ClientError", "TimeoutError"}


def is_storage_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is a failure of the store or the network."""
    return any(cls.__name__ in _STORAGE_FAILURES for e in _chain(exc) for cls in type(e).__mro__)


def _code(chain: list[BaseException]) -> str | None:
    """The S3 error code of a client error in the chain (``NoSuchBucket``, ``AccessDenied``, ``403`` for a HEAD)."""
    for exc in chain:
        error = getattr(exc, "response", None)
        if isinstance(error, dict) and isinstance(error.get("Error"), dict):
            return str(error["Error"].get("Code"))
    return None


def _bucket_missing(exc: BaseException) -> bool:
    """Whether ``exc`` says the bucket itself does not exist (not just the object)."""
    chain = _chain(exc)
    return _code(chain) == "NoSuchBucket" or any("bucket does not exist" in str(e).lower() for e in chain)


def endpoint_of(storage: StorageConfig) -> str:
    """The endpoint requests go to, for messages: storage.endpoint_url, AWS_ENDPOINT_URL(_S3), or AWS."""
    return (storage.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            or "AWS S3")


def mask(text: str, storage: StorageConfig) -> str:
    """``text`` with every secret the process knows (``storage.options``, the AWS variables) replaced."""
    return masked(text, storage.secrets())


def explain(exc: BaseException, remote: Remote, doing: str) -> StorageError:
    """The one line a user reads for ``exc`` raised while ``doing`` ``remote`` (see the module docstring)."""
    chain = _chain(exc)
    names = {type(e).__name__ for e in chain} | {c.__name__ for e in chain for c in type(e).__mro__}
    code = _code(chain)
    endpoint = endpoint_of(remote.storage)
    where = f"{doing} {remote.url}"
    retries = remote.storage.retries
    first = str(chain[-1]).strip().splitlines()[0] if str(chain[-1]).strip() else type(chain[-1]).__name__
    cls: type[StorageError] = StorageError
    if "NoCredentialsError" in names or "PartialCredentialsError" in names:
        message = (f"no credentials for {where}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, "
                   "~/.aws/credentials, storage.profile)")
    elif code in _CREDENTIAL_CODES:
        message = (f"the storage at {endpoint} refused the credentials ({code}) {where}: check AWS_ACCESS_KEY_ID / "
                   "AWS_SECRET_ACCESS_KEY (or the profile in use) and the endpoint")
    elif code in _DENIED or (code is None and "PermissionError" in names):
        verb = "write" if doing.startswith(("writ", "upload", "copy", "delet", "clean")) else "read"
        message = (f"permission denied {where} ({code or first}): the credentials in use may not {verb} there (a "
                   f"bucket policy or read-only credentials); grant {verb} access to the prefix or choose another "
                   "location")
    elif code == "NoSuchBucket" or (isinstance(exc, FileNotFoundError) and "bucket" in first.lower()):
        message = (f"bucket '{remote.bucket}' does not exist at {endpoint} ({where}): create it or fix the URL "
                   "(and storage.endpoint_url / AWS_ENDPOINT_URL)")
    elif code in ("NoSuchKey", "404") or isinstance(exc, FileNotFoundError):
        cls = ObjectMissingError
        message = f"{remote.url} does not exist ({doing} it): check the URL, or restore the object"
    elif names & {"EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError", "ConnectionRefusedError",
                  "gaierror", "ClientConnectorDNSError"}:
        message = (f"cannot reach the storage endpoint {endpoint} ({where}; {first}) after {retries} retries: check "
                   "storage.endpoint_url / AWS_ENDPOINT_URL and the network")
    elif names & {"HTTPClientError", "ConnectionClosedError", "ReadTimeoutError", "IncompleteRead",
                  "ClientPayloadError", "ServerDisconnectedError", "ClientOSError", "ResponseStreamingError",
                  "FSTimeoutError", "TimeoutError", "ConnectionResetError", "BrokenPipeError"}:
        message = (f"the connection to {endpoint} kept breaking while {where} ({first}); {retries} retries with "
                   "backoff did not get through: check the network (or raise storage.retries) and run the command "
                   "again: nothing was committed half")
    elif code is not None:
        message = f"the storage at {endpoint} answered {code} {where} ({first})"
    else:
        message = f"{type(chain[-1]).__name__} {where}: {first}"
    return cls(mask(message, remote.storage))
