"""What storage raises (:class:`StorageError`: one line naming the place, the cause and the fix), and what went wrong
with a request to a store, as the one line a user reads: missing bucket, no credentials, refused
credentials, permission denied, unreachable endpoint, a connection that kept breaking after the retries, a missing
object -- each with the URL, what was being done and what to do, and never a secret."""

from __future__ import annotations

import os

from mindfoundry.config.storage_config import StorageConfig, masked
from mindfoundry.errors import InputMissingError, MindFoundryError

#: The codes of a request the credentials may not make (a HEAD's is the bare status).
DENIED = ("AccessDenied", "AllAccessDisabled", "403")
_CREDENTIAL_CODES = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
                     "TokenRefreshRequired", "InvalidClientTokenId", "AuthorizationHeaderMalformed")


class StorageError(MindFoundryError, OSError):
    """A store or a disk refused or failed an operation; the message names the location, the cause and the fix."""


class ObjectMissingError(StorageError, InputMissingError):
    """An object (or every object under a prefix) that should be there is not."""



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


def error_code(exc: BaseException) -> str | None:
    """The S3 error code of ``exc`` or what it was raised from (``NoSuchBucket``, ``AccessDenied``, ``403`` for a
    HEAD); None when none carries one."""
    return _code(_chain(exc))


def _code(chain: list[BaseException]) -> str | None:
    """The S3 error code of a client error in the chain (``NoSuchBucket``, ``AccessDenied``, ``403`` for a HEAD)."""
    for exc in chain:
        error = getattr(exc, "response", None)
        if isinstance(error, dict) and isinstance(error.get("Error"), dict):
            return str(error["Error"].get("Code"))
    return None


def bucket_missing(exc: BaseException) -> bool:
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


def explain(exc: BaseException, url: str, storage: StorageConfig, doing: str) -> StorageError:
    """The one line a user reads for ``exc`` raised while ``doing`` ``url`` (see the module docstring)."""
    chain = _chain(exc)
    names = {type(e).__name__ for e in chain} | {c.__name__ for e in chain for c in type(e).__mro__}
    code = _code(chain)
    endpoint = endpoint_of(storage)
    where = f"{doing} {url}"
    retries = storage.retries
    first = str(chain[-1]).strip().splitlines()[0] if str(chain[-1]).strip() else type(chain[-1]).__name__
    cls: type[StorageError] = StorageError
    if "NoCredentialsError" in names or "PartialCredentialsError" in names:
        message = (f"no credentials for {where}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, "
                   "~/.aws/credentials, storage.profile)")
    elif code in _CREDENTIAL_CODES:
        message = (f"the storage at {endpoint} refused the credentials ({code}) {where}: check AWS_ACCESS_KEY_ID / "
                   "AWS_SECRET_ACCESS_KEY (or the profile in use) and the endpoint")
    elif code in DENIED or (code is None and "PermissionError" in names):
        verb = "write" if doing.startswith(("writ", "upload", "copy", "delet", "clean")) else "read"
        message = (f"permission denied {where} ({code or first}): the credentials in use may not {verb} there (a "
                   f"bucket policy or read-only credentials); grant {verb} access to the prefix or choose another "
                   "location")
    elif code == "NoSuchBucket" or (isinstance(exc, FileNotFoundError) and "bucket" in first.lower()):
        bucket = url.split("://", 1)[1].split("/", 1)[0]
        message = (f"bucket '{bucket}' does not exist at {endpoint} ({where}): create it or fix the URL "
                   "(and storage.endpoint_url / AWS_ENDPOINT_URL)")
    elif code in ("NoSuchKey", "404") or isinstance(exc, FileNotFoundError):
        cls = ObjectMissingError
        message = f"{url} does not exist ({doing} it): check the URL, or restore the object"
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
    return cls(mask(message, storage))
