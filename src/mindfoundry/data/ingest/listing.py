"""Which files a source names, and the check that they are still those files when they are read.

A source's ``paths`` are files, folders and globs, on a local disk or under a URL (``s3://bucket/prefix``);
:func:`resolve_files` turns them into the files to read, in reading order, before any reading starts (a path that does
not exist, a glob that matches nothing, a bucket that cannot be reached is a :class:`DataSourceError` or the store's
one-line error here). `prepare` lists the files when it plans its tasks and reads each much later, maybe on another
machine: :class:`FileLedger` holds every file to its size and :data:`Version` as listed, so a file rewritten in between
is named, never read as if it were the one listed.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mindfoundry.config.storage_config import StorageConfig
from mindfoundry.errors import MindFoundryError, describe_path
from mindfoundry.storage.location import Location, locate
from mindfoundry.storage.remote import ObjectMissingError, Remote

#: A file's version as listed: its modification time in ns on a local disk, its ETag (which changes with the content)
#: on object storage.
Version = int | str
SUPPORTED_SUFFIXES: tuple[str, ...] = (
    ".txt", ".jsonl", ".txt.gz", ".jsonl.gz", ".txt.zst", ".jsonl.zst", ".parquet",
)

_GLOB_MAGIC = re.compile(r"[*?\[]")

class DataSourceError(MindFoundryError, ValueError):
    """A data source is misconfigured (missing path, empty glob, demo package not installed)."""


@dataclass
class FileLedger:
    """Each source file's size and version (:data:`Version`) as `prepare` listed it (and its sha256 once read).

    `prepare` lists the files when it plans its tasks and reads each once, maybe much later and on
    another machine: a file rewritten, truncated or appended to in between, or while it is read,
    must not be taken for the file that was listed. Every opening, and the end of every reading,
    is checked against the listing: a change is an error naming the file.
    """

    seen: dict[str, tuple[int, Version, str | None]] = field(default_factory=dict)

    def expect(self, path: Location, size: int, version: Version) -> None:
        """The file as listed (its content not yet hashed)."""
        self.seen[str(path)] = (size, version, None)

    def check(self, path: Location, size: int, version: Version, sha256: str) -> None:
        first = self.seen.setdefault(str(path), (size, version, sha256))
        if first[:2] != (size, version) or first[2] not in (None, sha256):
            raise _changed(path, first, (size, version, sha256), "since prepare listed it")

    def check_unchanged(self, path: Location) -> None:
        """After a file was read to its end: its size and version are still those it was opened with."""
        first = self.seen[str(path)]
        now = file_version(path)
        if now != first[:2]:
            raise _changed(path, first, (*now, "?"), "while prepare was reading it")


def file_version(path: Location) -> tuple[int, Version]:
    """A file's size and :data:`Version` now (DataSourceError when it cannot be looked up)."""
    try:
        if isinstance(path, Remote):
            info = path.info()
            version = info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified") or ""
            return int(info.get("size") or 0), str(version)
        st = path.stat()
    except ObjectMissingError as exc:
        raise DataSourceError(f"cannot read source file '{path}' ({exc}): fix it or remove it from the source's "
                              "paths") from None
    except OSError as exc:
        if isinstance(path, Remote):  # the store's own one line (permission, connection) says it all
            raise
        raise DataSourceError(f"cannot read source file '{path}' ({exc.strerror or exc}): fix it or "
                              "remove it from the source's paths") from None
    return st.st_size, st.st_mtime_ns


def _changed(path: Location, first: tuple[int, Version, str | None], now: tuple[int, Version, str],
             when: str) -> MindFoundryError:
    what = (f"{first[0]:,} -> {now[0]:,} bytes" if first[0] != now[0] else "rewritten" if first[1] != now[1]
            else "same size and time, different content")
    return DataSourceError(f"source file '{path}' changed {when} ({what}): prepare again once nothing writes it "
                           f"(no output was written; the work done on the old file is discarded)")


def resolve_files(patterns: Sequence[str], storage: StorageConfig | None = None) -> list[Location]:
    """Every file the patterns name, in reading order (see :func:`read_files`); DataSourceError for a bad pattern."""
    if isinstance(patterns, str):
        raise DataSourceError(
            f"patterns must be a list of paths, not a single string: use [{patterns!r}]"
        )
    return _resolve_patterns(patterns, storage)


def files_root(files: Sequence[Location]) -> Location:
    """The deepest folder holding every file: what document ids are relative to."""
    remote = [f for f in files if isinstance(f, Remote)]
    if not remote:
        return Path(os.path.commonpath([path.parent for path in files]))
    if len(remote) != len(files) or len({f.protocol for f in remote}) != 1:
        raise DataSourceError(f"a source's paths mix local files and URLs ({files[0]}, {files[-1]}): give the local "
                              "files and the objects as two sources")
    parts = [f.parent.url.split("/") for f in remote]
    common = os.path.commonprefix(parts)
    return Remote("/".join(common), remote[0].storage)


def _resolve_patterns(patterns: Sequence[str], storage: StorageConfig | None) -> list[Location]:
    """Expand every pattern to files, keeping pattern order and dropping repeats."""
    if not patterns:
        raise DataSourceError("no input paths given: pass at least one file, folder or glob")
    ordered: dict[Location, None] = {}
    for pattern in patterns:
        where = locate(pattern, storage)
        for path in (_expand_url(where, pattern) if isinstance(where, Remote) else _expand_pattern(pattern)):
            ordered.setdefault(path, None)
    return list(ordered)


def _expand_url(where: Remote, pattern: str) -> list[Location]:
    """One URL pattern (an object, a prefix or a glob) as its objects, sorted."""
    where.check_reachable()  # a missing bucket or refused credentials: one line naming the cause, before listing
    if _GLOB_MAGIC.search(where.key):
        matches = where.glob(pattern)
        if not matches:
            raise DataSourceError(f"glob {pattern!r} matched no objects; check the pattern (use '**' to search "
                                  "below sub-prefixes)")
        files = [f for match in matches for f in ([match] if match.is_file() else match.files())]
        return _require_supported([f for f in files if is_supported(f)], pattern)
    if where.is_file():
        if not is_supported(where):
            raise DataSourceError(
                f"unsupported file type {pattern!r}: expected one of {', '.join(SUPPORTED_SUFFIXES)}"
            )
        return [where]
    found = where.files()
    if not found:
        raise DataSourceError(f"input path {pattern!r} does not exist (no object under that prefix): fix the URL or "
                              "remove it from the data config")
    return _require_supported([f for f in found if is_supported(f)], pattern)


def _expand_pattern(pattern: str) -> list[Location]:
    """Turn one local file/folder/glob pattern into a sorted list of absolute file paths.

    An existing path is taken literally even if its name contains glob characters (``[``).
    """
    path = Path(pattern.removeprefix("file://"))
    pattern = str(path)
    if not path.exists() and _GLOB_MAGIC.search(pattern):
        matches = [Path(match) for match in sorted(glob.glob(pattern, recursive=True))]
        if not matches:
            raise DataSourceError(
                f"glob {pattern!r} matched no files; check the pattern "
                "(relative to the current directory; use '**' to search sub-folders)"
            )
        files = [f for match in matches for f in _files_under(match)]
        return _require_supported(files, pattern)
    if path.is_dir():
        return _require_supported(_files_under(path), pattern)
    if path.is_file():
        if not is_supported(path):
            raise DataSourceError(
                f"unsupported file type {pattern!r}: expected one of {', '.join(SUPPORTED_SUFFIXES)}"
            )
        return [Path(os.path.abspath(path))]
    if path.exists():  # a FIFO, a socket, a device: reading it would block or stream without end
        raise DataSourceError(f"input path {pattern!r} is {describe_path(path)}, not a file or folder: give the "
                              "source regular files (copy a stream to a file first)")
    raise DataSourceError(
        f"input path {pattern!r} does not exist (relative paths are resolved against "
        f"{os.getcwd()}); fix the path or remove it from the data config"
    )


def _files_under(path: Path) -> list[Location]:
    """A file itself, or every supported file below a folder, as sorted absolute paths."""
    if path.is_file():
        return [Path(os.path.abspath(path))] if is_supported(path) else []
    found = (Path(os.path.abspath(p)) for p in path.rglob("*") if p.is_file())
    return sorted(p for p in found if is_supported(p))


def _require_supported(files: list[Location], pattern: str) -> list[Location]:
    if not files:
        raise DataSourceError(
            f"{pattern!r} contains no readable files: expected {', '.join(SUPPORTED_SUFFIXES)}"
        )
    return files


def is_supported(path: Location) -> bool:
    return path.name.endswith(SUPPORTED_SUFFIXES)


