"""The image samples a source's files hold, one at a time: the encoded image, its caption, where it came from.

Three layouts, local or at a URL (every file read through its :class:`~mindfoundry.storage.location.Location`, a tar
streamed, never downloaded whole first):

- **WebDataset tars** in img2dataset's layout: consecutive members sharing a key (``000123.jpg``, ``000123.txt``,
  ``000123.json``) are one sample; the image is the member with an image extension, the caption the ``.txt`` member,
  else the ``text_field`` of the ``.json`` member.
- **Records** (``.jsonl``, plain, ``.gz`` or ``.zst``, and ``.parquet``): ``image_field`` holds a path relative to the
  record's file (LLaVA, data-juicer) or the encoded bytes (a Parquet binary column); ``text_field`` the caption, a
  dotted path into the record allowed (``conversations.1.value``, ``-1`` for the last item).
- **Image files** (``.jpg``, ``.jpeg``, ``.png``, ``.webp``, ``.gif``, ``.bmp``) with the caption in a sidecar
  ``NAME.txt`` beside ``NAME.EXT``.

A sample that cannot be an image-caption pair is yielded with its ``problem`` (the drop log's reason and detail)
instead of failing the source: an image path that does not exist or leaves the source's folder, a tar group with a
caption and no image, a pair without a caption, a corrupted tar (the samples before the damage are kept).
"""

from __future__ import annotations

import json
import posixpath
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from mindfoundry.config.data_config import SourceConfig
from mindfoundry.data.ingest.files import SourceStats, json_records
from mindfoundry.storage.location import Location

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp")
RECORD_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet")
TAR_SUFFIXES = (".tar",)
#: The files an image source reads, in either case (anything else under its paths is left alone, a sidecar caption
#: included).
SUFFIXES = tuple(s for suffix in IMAGE_SUFFIXES + RECORD_SUFFIXES + TAR_SUFFIXES for s in (suffix, suffix.upper()))


@dataclass(frozen=True, slots=True)
class ImageSample:
    """One sample as read: ``key`` unique and stable in the corpus (``source:path[:member or record]``), the encoded
    image, its caption (None for ``modality: image``), where it came from (``path`` relative to the source's root,
    ``record`` its 0-based number in that file), and ``problem`` (reason, detail) when it cannot be kept."""

    key: str
    data: bytes
    caption: str | None
    path: str
    record: int
    problem: tuple[str, str] | None = None


def image_samples(files: list[Location], root: Location, src: SourceConfig,
                  stats: SourceStats) -> Iterator[ImageSample]:
    """Every sample of ``files`` (a run of one source's files, relative to ``root``), in reading order."""
    for path in files:
        rel = path.relative_to(root)
        name = path.name.lower()
        if name.endswith(TAR_SUFFIXES):
            yield from _tar_samples(path, rel, src)
        elif name.endswith(RECORD_SUFFIXES):
            yield from _record_samples(path, rel, root, src, stats)
        else:
            yield _file_sample(path, rel, src)
        stats.file_read(path)


def _sample(src: SourceConfig, rel: str, record: int, suffix: str, data: bytes, caption: Any) -> ImageSample:
    """A sample, or the same with its problem when a pair lacks its caption (no text where the caption should be)."""
    key = f"{src.name}:{rel}{suffix}"
    if src.modality == "image":
        return ImageSample(key, data, None, rel, record)
    if not isinstance(caption, str) or not caption.strip():
        return ImageSample(key, data, None, rel, record, ("no_caption", "an image-text pair without a caption"))
    return ImageSample(key, data, caption, rel, record)


def _problem(src: SourceConfig, rel: str, record: int, suffix: str, reason: str, detail: str) -> ImageSample:
    return ImageSample(f"{src.name}:{rel}{suffix}", b"", None, rel, record, (reason, detail))


def _file_sample(path: Location, rel: str, src: SourceConfig) -> ImageSample:
    """An image file; its caption the sidecar ``NAME.txt``."""
    sidecar = path.with_name(path.name.rsplit(".", 1)[0] + ".txt")
    caption = None
    if src.modality == "image_text" and sidecar.is_file():
        caption = sidecar.read_bytes().decode("utf-8", errors="replace").strip()
    return _sample(src, rel, 0, "", path.read_bytes(), caption)


def _tar_samples(path: Location, rel: str, src: SourceConfig) -> Iterator[ImageSample]:
    """The samples of a WebDataset tar, streamed member by member; a damaged tar ends with a problem sample."""
    group: dict[str, bytes] = {}
    current, record = None, 0
    try:
        with path.open() as raw, tarfile.open(fileobj=raw, mode="r|*") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                folder, base = posixpath.split(member.name)
                stem, _, ext = base.partition(".")
                key = posixpath.join(folder, stem)
                if key != current and current is not None:
                    yield _tar_group(src, rel, record, current, group)
                    group, record = {}, record + 1
                current = key
                handle = tar.extractfile(member)
                group[ext.lower()] = handle.read() if handle is not None else b""
        if current is not None:
            yield _tar_group(src, rel, record, current, group)
    except (tarfile.TarError, EOFError) as exc:  # (a disk's or the network's I/O error is the read task's to report)
        yield _problem(src, rel, record, f":{current or ''}", "corrupt_tar",
                       f"the tar is damaged after {record} sample(s) ({exc or type(exc).__name__})")


def _tar_group(src: SourceConfig, rel: str, record: int, key: str, group: dict[str, bytes]) -> ImageSample:
    image = next((group[ext] for ext in group if "." + ext in IMAGE_SUFFIXES), None)
    if image is None:
        return _problem(src, rel, record, f":{key}", "no_image",
                        f"members {', '.join(sorted(group))} and no image ({', '.join(IMAGE_SUFFIXES)})")
    caption = None
    if "txt" in group:
        caption = group["txt"].decode("utf-8", errors="replace")
    elif "json" in group:
        try:
            caption = field(json.loads(group["json"]), src.text_field)
        except ValueError:
            caption = None
    return _sample(src, rel, record, f":{key}", image, caption)


def _record_samples(path: Location, rel: str, root: Location, src: SourceConfig,
                    stats: SourceStats) -> Iterator[ImageSample]:
    """The samples of a .jsonl or .parquet file: each record's image (a relative path, or bytes) and caption."""
    for record, row in enumerate(_records(path, src, stats)):
        if row is None:
            yield _problem(src, rel, record, f":{record + 1}", "bad_record", "not a JSON object")
            continue
        value = field(row, src.image_field)
        caption = field(row, src.text_field)
        suffix = f":{record + 1}"
        if isinstance(value, (bytes, bytearray)):
            yield _sample(src, rel, record, suffix, bytes(value), caption)
        elif isinstance(value, str) and value:
            yield _referenced(path, root, value, src, rel, record, suffix, caption)
        else:
            yield _problem(src, rel, record, suffix, "no_image", f"no image under {src.image_field!r}")


def _referenced(path: Location, root: Location, value: str, src: SourceConfig, rel: str, record: int, suffix: str,
                caption: Any) -> ImageSample:
    """The image a record names by a path relative to its own file: refused when the path leaves the source's folder
    (``..``, an absolute path) or names nothing."""
    parts = value.replace("\\", "/").split("/")
    if value.startswith("/") or "://" in value or ".." in parts:
        return _problem(src, rel, record, suffix, "outside_source",
                        f"{value!r} leaves the source's folder: image paths are relative to the record's file")
    image = path.parent / "/".join(p for p in parts if p not in ("", "."))
    if not image.is_below(root):
        return _problem(src, rel, record, suffix, "outside_source", f"{value!r} leaves the source's folder")
    try:
        data = image.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return _problem(src, rel, record, suffix, "missing_image", f"{value!r} does not exist beside {path.name}")
    return _sample(src, rel, record, suffix, data, caption)


def _records(path: Location, src: SourceConfig, stats: SourceStats) -> Iterator[dict[str, Any] | None]:
    """The records of a .jsonl (blank lines skipped) or .parquet file, in order; None for a line that is no object."""
    if path.name.lower().endswith(".parquet"):
        import pyarrow.parquet as pq

        with path.open() as fh:
            parquet = pq.ParquetFile(fh)
            columns = [c for c in dict.fromkeys((src.image_field.split(".")[0], src.text_field.split(".")[0]))
                       if c in parquet.schema_arrow.names]
            for batch in parquet.iter_batches(batch_size=256, columns=columns):
                yield from batch.to_pylist()
        return
    yield from (record for _, record in json_records(path, stats))


def field(record: Any, dotted: str) -> Any:
    """The value at ``dotted`` in a record (``conversations.1.value``; a negative index counts from the end);
    None where the path leads nowhere."""
    node = record
    for part in dotted.split("."):
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and part.lstrip("-").isdigit() and -len(node) <= int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node
