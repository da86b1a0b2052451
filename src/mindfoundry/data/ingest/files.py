"""Streaming readers for local text files (the built-in demo corpora are :mod:`.builtin`'s).

Every reader yields :class:`~mindfoundry.data.document.Document` objects one at a time and fills
a :class:`SourceStats` as it goes, so a data-preparation run can report exactly what it read
(files with their sha256) and what it dropped (and why) without holding a corpus in memory.

Files are ``.txt`` and ``.jsonl``, each plain, gzip (``.gz``) or Zstandard (``.zst``)
compressed, and ``.parquet``, on a local disk or on object storage (``s3://bucket/prefix``: a path
given as a URL is listed and read through :class:`~mindfoundry.storage.remote.Remote`). All are
streamed: text files line by line through the decompressor, Parquet by record batches of one
column (objects by ranged reads), so memory does not grow with file size and nothing is downloaded
whole first (except for ``txt_mode="file"``, where one file is one document).

Bad input never crashes a run: a record that is not valid UTF-8, a malformed JSON line, a record
without the text field (or a Parquet file without that column, noted in
:attr:`SourceStats.notes`), or an empty document is skipped and counted. Decoding happens per
record, so one bad line does not take the rest of its file with it. Configuration mistakes
(a path that does not exist, a glob that matches nothing, a missing demo package) are raised
eagerly as :class:`DataSourceError`, before any reading starts; a corrupt or truncated
compressed or Parquet file raises it naming the file.
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
import io
import json
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import zstandard

from mindfoundry.config.storage_config import StorageConfig
from mindfoundry.data.document import Document
from mindfoundry.data.ingest.listing import (
    DataSourceError,
    FileLedger,
    file_version,
    files_root,
    resolve_files,
    unreadable,
)
from mindfoundry.data.ingest.zstd import ZstdReader
from mindfoundry.storage.location import Location
from mindfoundry.storage.resolve import locate

TxtMode = Literal["file", "line"]

_JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
_HASH_CHUNK = 1 << 20
_PARQUET_BATCH_ROWS = 1024


@dataclass
class SourceStats:
    """What a source read and what it skipped, for the data-preparation report.

    ``documents``, ``bytes`` (UTF-8 bytes of document text) and ``chars`` count the documents a
    reader yielded. Each ``skipped_*`` counter counts records dropped for that reason. ``files`` lists
    every file opened, as ``{"path": str, "sha256": str, "bytes": int}`` (size and hash of the
    file on disk, i.e. of the compressed bytes for ``.gz``/``.zst``), so a manifest can pin the
    inputs (and ``version``, its modification time or ETag, so a later listing tells whether it changed). ``notes``
    explains skips that affect a whole file (a Parquet file without the column).
    """

    documents: int = 0
    bytes: int = 0
    chars: int = 0
    skipped_non_utf8: int = 0
    skipped_empty: int = 0
    skipped_too_long: int = 0
    skipped_bad_json: int = 0
    skipped_missing_text: int = 0
    files: list[dict[str, str | int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    ledger: FileLedger | None = None  # the files as prepare listed them

    def counters(self) -> dict[str, int]:
        """The numeric counters (what a report shows per source)."""
        return {k: v for k, v in vars(self).items() if isinstance(v, int)}

    def record_file(self, path: Path | Location) -> None:
        """Hash ``path`` in chunks (bounded memory; an object streamed) and append it to :attr:`files`."""
        path = locate(path)
        digest = hashlib.sha256()
        size = 0
        try:
            version = file_version(path)[1]
            with path.open() as fh:
                while chunk := fh.read(_HASH_CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
        except OSError as exc:  # unreadable: permissions, a dangling link, a folder named like a file, an I/O error
            raise unreadable(path, exc) from None
        if self.ledger is not None:
            self.ledger.check(path, size, version, digest.hexdigest())
        self.files.append({"path": str(path), "sha256": digest.hexdigest(), "bytes": size, "version": version})

    def file_read(self, path: Location) -> None:
        """``path`` was read to its end (see :meth:`FileLedger.check_unchanged`)."""
        if self.ledger is not None:
            self.ledger.check_unchanged(path)


# --------------------------------------------------------------------------------------------
# Local files
# --------------------------------------------------------------------------------------------


def read_files(
    patterns: Sequence[str],
    *,
    name: str,
    category: str,
    text_field: str = "text",
    txt_mode: TxtMode = "file",
    stats: SourceStats,
    storage: StorageConfig | None = None,
    url_field: str | None = None,
) -> Iterator[Document]:
    """Stream documents from files, folders and globs of ``.txt``, ``.jsonl`` and ``.parquet``.

    Each pattern is a file, a folder (searched recursively for supported suffixes) or a glob
    (``**`` recurses), on a local disk or under a URL (``s3://bucket/prefix/*.jsonl``, reached with
    ``storage``). Files are read in sorted order within each pattern, patterns in the
    given order, and a file matched twice is read once. ``.txt`` files are one document per file
    (``txt_mode="file"``) or one per non-empty line (``txt_mode="line"``); ``.jsonl`` files are
    one JSON object per line with the text under ``text_field`` (blank lines are ignored);
    ``.parquet`` files are one row per record with the text in column ``text_field`` (string or
    binary). Text files may be compressed (``.gz``, ``.zst``). With ``url_field``, a record's URL there gives its
    document's :attr:`~mindfoundry.data.document.Document.site` (the host: pages of one site share a template).

    Document ids are ``"{name}:{path}:{line}"`` (``"{name}:{path}"`` for whole-file documents,
    ``"{name}:{path}:{row}"`` with 1-based rows for Parquet),
    where ``path`` is relative to the deepest folder that contains every matched file, so ids do
    not depend on the working directory (or on the bucket the files are in) yet stay unique across patterns.

    Patterns are resolved immediately, so a missing path raises :class:`DataSourceError` at call
    time rather than at the first ``next()``.
    """
    files = resolve_files(patterns, storage)
    return read_listed(files, files_root(files), name=name, category=category, text_field=text_field, txt_mode=txt_mode,
                       stats=stats, url_field=url_field)


def read_listed(files: Sequence[Path | Location], root: Path | Location, *, name: str, category: str,
                text_field: str = "text", txt_mode: TxtMode = "file", stats: SourceStats,
                url_field: str | None = None) -> Iterator[Document]:
    """Stream documents from resolved ``files`` (:func:`resolve_files`), their ids relative to ``root``: a part of
    a source's files read with the ids the whole source would give them (see :func:`read_files`)."""
    if txt_mode not in ("file", "line"):
        raise DataSourceError(f"txt_mode must be 'file' or 'line', got {txt_mode!r}")
    if not name:
        raise DataSourceError("a source needs a non-empty name (it prefixes document ids)")
    return count_emitted(_read_resolved([locate(f) for f in files], locate(root), name, category, text_field,
                                        txt_mode, stats, url_field), stats)


def _read_resolved(
    files: list[Location],
    root: Location,
    name: str,
    category: str,
    text_field: str,
    txt_mode: TxtMode,
    stats: SourceStats,
    url_field: str | None,
) -> Iterator[Document]:
    """Read resolved files one at a time, dispatching on the suffix."""
    for path in files:
        stats.record_file(path)
        relative = path.relative_to(root)
        prefix = f"{name}:{relative}"
        records: Iterator[tuple[int | None, str, str]]
        if path.name.endswith(".parquet"):
            records = _parquet_records(path, text_field, stats, url_field)
        elif path.name.endswith(_JSONL_SUFFIXES):
            records = _jsonl_records(path, text_field, stats, url_field)
        elif txt_mode == "line":
            records = ((number, text, "") for number, text in line_records(path, stats))
        else:
            records = ((number, text, "") for number, text in _whole_file_record(path, stats))
        for number, text, site in records:
            doc_id = prefix if number is None else f"{prefix}:{number}"
            if is_blank(text, stats) or is_too_long(text, path, number, stats):
                continue
            yield Document(text=text, id=doc_id, source=name, category=category, path=relative,
                           record=0 if number is None else number - 1, site=site)
        stats.file_read(path)


def _whole_file_record(path: Location, stats: SourceStats) -> Iterator[tuple[None, str]]:
    """The whole (decompressed) file as one record; a non-UTF-8 file is skipped and counted."""
    with _decompression_errors(path), _open_binary(path) as fh:
        data = fh.read()
    text = decode(data.removeprefix(codecs.BOM_UTF8), stats)
    if text is not None:
        yield None, text


def line_records(path: Path | Location, stats: SourceStats) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` for every valid-UTF-8 line, without its line terminator.

    A UTF-8 byte-order mark (common in files saved on Windows) is dropped from the first line.
    """
    path = locate(path)
    number = 0
    with _decompression_errors(path, lambda: number), _open_binary(path) as fh:
        for number, raw in enumerate(fh, start=1):
            if number == 1:
                raw = raw.removeprefix(codecs.BOM_UTF8)
            text = decode(raw.removesuffix(b"\n").removesuffix(b"\r"), stats)
            if text is not None:
                yield number, text


def json_records(path: Location, stats: SourceStats) -> Iterator[tuple[int, dict[str, Any] | None]]:
    """``(line number, record)`` for every non-blank line of a .jsonl file; None for a line that is not a JSON
    object."""
    for number, line in line_records(path, stats):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        yield number, record if isinstance(record, dict) else None


def url_host(value: Any) -> str:
    """The host of a URL (lower case), or "" for anything else: the site a page belongs to."""
    if not isinstance(value, str) or "://" not in value:
        return ""
    try:
        return urlsplit(value.strip()).hostname or ""
    except ValueError:
        return ""


def _jsonl_records(path: Location, text_field: str, stats: SourceStats,
                   url_field: str | None = None) -> Iterator[tuple[int, str, str]]:
    """``(line number, text, site)`` for every JSON line that holds a string under ``text_field`` (site: the host of
    its ``url_field``, "" without one)."""
    for number, record in json_records(path, stats):
        if record is None:
            stats.skipped_bad_json += 1
            continue
        text = record.get(text_field)
        if not isinstance(text, str):
            stats.skipped_missing_text += 1
            continue
        if not _is_encodable(text):
            # JSON escapes can smuggle lone surrogates ("\ud800") that are not valid UTF-8.
            stats.skipped_non_utf8 += 1
            continue
        yield number, text, url_host(record.get(url_field)) if url_field else ""


def _parquet_records(path: Location, text_field: str, stats: SourceStats,
                     url_field: str | None = None) -> Iterator[tuple[int, str, str]]:
    """``(row number from 1, text, site)`` for every row of a Parquet file, one record batch at a time.

    Only the text column is read, and the ``url_field`` column where there is one (site: the URL's host). A file
    without the text column, or whose column holds no text, skips all its rows as missing text and says why in
    ``stats.notes``; a null value skips its row the same way, and bytes that are not UTF-8 count as non-UTF-8.
    """
    pa, pq = _import_pyarrow()
    try:
        with path.open() as fh:
            parquet = pq.ParquetFile(fh)
            binary = _parquet_text_as_binary(pa, parquet.schema_arrow, text_field)
            if isinstance(binary, str):
                rows = parquet.metadata.num_rows
                stats.notes.append(
                    f"{path}: skipped all {rows} rows: {binary}; set the source's text_field to the text column"
                )
                stats.skipped_missing_text += rows
                return
            number = 0
            with_url = url_field is not None and url_field in parquet.schema_arrow.names
            columns = [text_field, url_field] if with_url else [text_field]
            for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS, columns=columns):
                # Decoded here, not by Arrow: a string column can still hold invalid UTF-8, to be counted, not fatal.
                urls = batch.column(1).to_pylist() if with_url else [None] * batch.num_rows
                for value, url in zip(batch.column(0).cast(binary).to_pylist(), urls, strict=True):
                    number += 1
                    if value is None:
                        stats.skipped_missing_text += 1
                    elif (text := decode(value, stats)) is not None:
                        yield number, text, url_host(url)
    except (pa.ArrowException, OSError) as exc:
        raise DataSourceError(f"{path}: corrupt or unreadable Parquet data ({exc})") from exc


def _parquet_text_as_binary(pa, schema, text_field: str):  # noqa: ANN001, ANN202 - pyarrow objects
    """The binary type to read the text column as, or why the column cannot hold text."""
    if text_field not in schema.names:
        return f"it has no column {text_field!r} (columns: {', '.join(schema.names)})"
    column = schema.field(text_field).type
    if pa.types.is_large_string(column) or pa.types.is_large_binary(column):
        return pa.large_binary()
    if pa.types.is_string(column) or pa.types.is_binary(column):
        return pa.binary()
    return f"its column {text_field!r} has type {column}, not string"


def _import_pyarrow():  # noqa: ANN202 - modules
    """pyarrow and pyarrow.parquet, imported on first use (0.2 s, and only Parquet needs them)."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as exc:
        raise DataSourceError(f"reading .parquet files needs pyarrow ({exc}); run: pip install 'pyarrow<26'") from exc
    return pyarrow, pyarrow.parquet


def _open_binary(path: Location) -> io.BufferedIOBase:
    """The file's bytes, decompressed (``.gz``, ``.zst``), as a stream that closes the file with itself."""
    raw = path.open()
    if path.name.endswith(".gz"):
        return io.BufferedReader(_Owning(gzip.GzipFile(fileobj=raw, mode="rb"), raw))
    if path.name.endswith(".zst"):
        return io.BufferedReader(ZstdReader(raw))
    return raw


class _Owning(io.RawIOBase):
    """A decompressing stream that also closes the file it reads (GzipFile leaves a file object it was given open)."""

    def __init__(self, stream: io.BufferedIOBase, raw: io.BufferedIOBase) -> None:
        super().__init__()
        self._stream, self._raw = stream, raw

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:
        return self._stream.readinto(buffer)

    def close(self) -> None:
        if not self.closed:
            self._stream.close()
            self._raw.close()
        super().close()


@contextmanager
def _decompression_errors(path: Location, lines_read: Callable[[], int] | None = None) -> Iterator[None]:
    """Report a corrupt or truncated ``.gz``/``.zst`` file as a :class:`DataSourceError` naming it (and, for a file
    read by lines, how many lines were whole: the records before the damage)."""
    try:
        yield
    except (gzip.BadGzipFile, EOFError, zlib.error, zstandard.ZstdError) as exc:
        kind = "zstd" if path.name.endswith(".zst") else "gzip"
        where = f" after line {lines_read():,}" if lines_read is not None else ""
        raise DataSourceError(f"{path}: corrupt or truncated {kind} data{where} ({exc}): "
                              "replace the file or remove it from the source's paths") from exc


def decode(data: bytes, stats: SourceStats) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        stats.skipped_non_utf8 += 1
        return None


def _is_encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_blank(text: str, stats: SourceStats) -> bool:
    if text.strip():
        return False
    stats.skipped_empty += 1
    return True


#: Longest document read, in characters (~4M tokens). A longer "document" is a dump, a minified file or a
#: file without line breaks, not text to pretrain on; skipping it at read time keeps one 200 MB line from
#: costing minutes of cleaning and gigabytes before a source turns out to be unusable.
MAX_DOCUMENT_CHARS = 16_000_000


def is_too_long(text: str, path: Location, number: int | None, stats: SourceStats) -> bool:
    if len(text) <= MAX_DOCUMENT_CHARS:
        return False
    stats.skipped_too_long += 1
    where = f"{path}" if number is None else f"{path}:{number}"
    stats.notes.append(f"{where}: a {len(text):,}-character document skipped (more than {MAX_DOCUMENT_CHARS:,}; "
                       f"use txt_mode: line for one document per line)")
    return True


def count_emitted(docs: Iterable[Document], stats: SourceStats) -> Iterator[Document]:
    """Count documents and UTF-8 bytes as they are handed to the caller."""
    for doc in docs:
        stats.documents += 1
        stats.bytes += len(doc.text.encode("utf-8"))
        stats.chars += len(doc.text)
        yield doc
