"""Which files a source names, and the check that they are still those files when they are read.

A source's ``paths`` are files, folders and globs, on a local disk or under a URL (``s3://bucket/prefix``);
:func:`resolve_files` turns them into the files to read, in reading order, before any reading starts (a path that does
not exist, a glob that matches nothing, a bucket that cannot be reached is a :class:`DataSourceError` or the store's
one-line error here). `prepare` lists the files when it plans its tasks and reads each much later, maybe on another
machine: :class:`FileLedger` holds every file to its size and :data:`Version` as listed, so a file rewritten in between
is named, never read as if it were the one listed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mindfoundry.config.storage_config import StorageConfig
from mindfoundry.errors import MindFoundryError
from mindfoundry.storage.failures import ObjectMissingError, StorageError
from mindfoundry.storage.location import Location, Version
from mindfoundry.storage.resolve import locate

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


def file_version(path: Path | Location) -> tuple[int, Version]:
    """A file's size and :data:`Version` now (DataSourceError when it cannot be looked up)."""
    try:
        return locate(path).size_and_version()
    except OSError as exc:
        raise unreadable(path, exc) from None


def unreadable(path: Location, exc: OSError) -> Exception:
    """A source file that cannot be read, as the error a user can act on: the store's own one line where it says it
    all (a permission, a connection), else the file named with the reason."""
    if isinstance(exc, StorageError) and not isinstance(exc, ObjectMissingError):
        return exc
    return DataSourceError(f"cannot read source file '{path}' ({exc.strerror or exc}): fix it or remove it from the "
                           "source's paths")


def _changed(path: Location, first: tuple[int, Version, str | None], now: tuple[int, Version, str],
             when: str) -> MindFoundryError:
    what = (f"{first[0]:,} -> {now[0]:,} bytes" if first[0] != now[0] else "rewritten" if first[1] != now[1]
            else "same size and time, different content")
    return DataSourceError(f"source file '{path}' changed {when} ({what}): prepare again once nothing writes it "
                           f"(no output was written; the work done on the old file is discarded)")


def resolve_files(patterns: Sequence[str], storage: StorageConfig | None = None,
                  suffixes: tuple[str, ...] = SUPPORTED_SUFFIXES) -> list[Location]:
    """Every file the patterns name whose name ends in one of ``suffixes`` (a text source's by default; an image
    source's are :data:`mindfoundry.data.images.sources.SUFFIXES`), in reading order (see :func:`read_files`);
    DataSourceError for a bad pattern."""
    if isinstance(patterns, str):
        raise DataSourceError(
            f"patterns must be a list of paths, not a single string: use [{patterns!r}]"
        )
    return _resolve_patterns(patterns, storage, suffixes)


def files_root(files: Sequence[Location]) -> Location:
    """The deepest folder holding every file: what document ids are relative to."""
    root = files[0].parent
    while not all(_below(f, root) for f in files):
        if root.parent == root:
            raise DataSourceError(f"a source's paths mix local files and URLs ({files[0]}, {files[-1]}): give the "
                                  "local files and the objects as two sources")
        root = root.parent
    return root


def _below(path: Location, root: Location) -> bool:
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True


def _resolve_patterns(patterns: Sequence[str], storage: StorageConfig | None,
                      suffixes: tuple[str, ...]) -> list[Location]:
    """Expand every pattern to files, keeping pattern order and dropping repeats."""
    if not patterns:
        raise DataSourceError("no input paths given: pass at least one file, folder or glob")
    ordered: dict[Location, None] = {}
    for pattern in patterns:
        for path in _expand(locate(pattern, storage).absolute(), pattern, suffixes):
            ordered.setdefault(path, None)
    return list(ordered)


def _expand(where: Location, pattern: str, suffixes: tuple[str, ...]) -> list[Location]:
    """One file, folder or glob (a path or a URL) as its supported files, sorted. An existing path is taken
    literally even if its name contains glob characters (``[``)."""
    where.check_reachable()  # a missing bucket or refused credentials: one line naming the cause, before listing
    if _GLOB_MAGIC.search(str(where)) and not where.exists():
        matches = where.glob(str(where))
        if not matches:
            raise DataSourceError(f"glob {pattern!r} matched no files; check the pattern (relative to the current "
                                  "directory for a path; use '**' to search sub-folders)")
        files = [f for match in matches for f in ([match] if match.is_file() else match.files())]
        return _require_supported([f for f in files if is_supported(f, suffixes)], pattern, suffixes)
    if where.is_dir():
        return _require_supported([f for f in where.files() if is_supported(f, suffixes)], pattern, suffixes)
    if where.is_file():
        if not is_supported(where, suffixes):
            raise DataSourceError(
                f"unsupported file type {pattern!r}: expected one of {', '.join(suffixes)}"
            )
        return [where]
    if where.exists():  # a FIFO, a socket, a device: reading it would block or stream without end
        raise DataSourceError(f"input path {pattern!r} is {where.describe()}, not a file or folder: give the "
                              "source regular files (copy a stream to a file first)")
    raise DataSourceError(f"input path {pattern!r} does not exist (nothing at {where}): fix the path or URL, or "
                          "remove it from the data config")


def _require_supported(files: list[Location], pattern: str, suffixes: tuple[str, ...]) -> list[Location]:
    if not files:
        raise DataSourceError(
            f"{pattern!r} contains no readable files: expected {', '.join(suffixes)}"
        )
    return files


def is_supported(path: Location, suffixes: tuple[str, ...] = SUPPORTED_SUFFIXES) -> bool:
    return path.name.endswith(suffixes)


