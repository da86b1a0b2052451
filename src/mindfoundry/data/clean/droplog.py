"""The drop log: one JSON line per document that cleaning or dedup dropped or edited (``drops.jsonl.gz``).

A line names the document by ``source``, ``path`` (relative to the source's root) and ``record``
(0-based line or row in that file), the ``block`` and ``reason``, the ``action`` (``drop`` or
``edit``), the measured ``value`` and the ``threshold`` it broke, and a 200-character
``excerpt`` (the document for a drop, the changed span for an edit). A dedup drop also names the
twin that stays (``kept``) and their ``jaccard``. The shard pass writes it next to the shards,
so it lists exactly the documents that are in the sources but not in the shards.

The stages of `prepare` each write their lines with the document's ordinal in its read task
(:func:`write_numbered`); the shard stage merges them into a task's part (:func:`write_part`) and
the parts become the log (:func:`assemble`).
"""

from __future__ import annotations

import gzip
import json
import shutil
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mindfoundry.errors import InputMissingError, MindFoundryError

DROPS_FILE = "drops.jsonl.gz"


class DropLogError(MindFoundryError, ValueError):
    """A drop log that cannot be read."""


NumberedLine = tuple[int, dict[str, Any]]  # (the document's ordinal in its read task, drop-log line)


def write_numbered(path: Path, lines: Iterable[NumberedLine]) -> int:
    """Drop-log lines of one task, each with its document's ordinal (how stages merge their lines), as JSON lines."""
    count = 0
    with open(path, "w", encoding="utf-8") as fh:
        for ordinal, line in lines:
            fh.write(json.dumps([ordinal, line], ensure_ascii=False) + "\n")
            count += 1
    return count


def read_numbered(path: Path) -> Iterator[NumberedLine]:
    with open(path, encoding="utf-8") as fh:
        for raw in fh:
            ordinal, line = json.loads(raw)
            yield ordinal, line


def write_part(path: Path, lines: Iterable[dict[str, Any]]) -> int:
    """One task's finished drop-log lines, in document order, as the drop log's text (uncompressed)."""
    count = 0
    with open(path, "w", encoding="utf-8") as fh:
        for line in lines:
            fh.write(json.dumps(line, ensure_ascii=False) + "\n")
            count += 1
    return count


def assemble(parts: Iterable[Path], out: Path) -> None:
    """The drop log: the parts in corpus order, gzip-compressed with no time stamp or name in its header, so the
    same lines always give the same bytes."""
    with open(out, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as fh:
        for part in parts:
            with open(part, "rb") as src:
                shutil.copyfileobj(src, fh, 1 << 20)


def read_drops(path: Path) -> Iterator[dict[str, Any]]:
    """The lines of a drop log; a missing or damaged file is an error that says what to do."""
    if not path.is_file():
        raise InputMissingError(f"no drop log at {path}: run `mindfoundry prepare` with this config first "
                                "(data prepared before drop logs existed has none: re-prepare with --overwrite)")
    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            for number, line in enumerate(fh, start=1):
                try:
                    yield json.loads(line)
                except ValueError as exc:
                    raise DropLogError(f"{path}: line {number} is not JSON ({exc}): the file is damaged; "
                                       "re-prepare with --overwrite") from None
    except (OSError, EOFError, zlib.error) as exc:
        raise DropLogError(f"{path} is not a readable gzip file ({exc}): re-prepare with --overwrite") from None


def line_chars(line: dict[str, Any]) -> int:
    """The characters a drop-log line took from the corpus: the document's for a drop (logs written before drops
    carried ``chars`` give 0), what was deleted for an edit."""
    if line["action"] == "edit":
        return int(line["value"] or 0)
    return int(line.get("chars", 0))


@dataclass
class DropSummary:
    """Counts of the matching lines by (block, reason, action) and by source, in documents and in characters, with
    a few examples of each."""

    counts: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    chars: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    by_source: Counter[str] = field(default_factory=Counter)
    chars_by_source: Counter[str] = field(default_factory=Counter)
    examples: dict[tuple[str, str, str], list[dict[str, Any]]] = field(default_factory=dict)
    total: int = 0


def summarise(lines: Iterator[dict[str, Any]], *, block: str | None = None, reason: str | None = None,
              source: str | None = None, examples: int = 3) -> DropSummary:
    """What the drop log says, restricted to one block, reason and/or source."""
    summary = DropSummary()
    for line in lines:
        if (
            (block and line["block"] != block)
            or (reason and line["reason"] != reason)
            or (source and line["source"] != source)
        ):
            continue
        key = (line["block"], line["reason"], line["action"])
        summary.counts[key] += 1
        summary.chars[key] += line_chars(line)
        summary.by_source[line["source"]] += 1
        summary.chars_by_source[line["source"]] += line_chars(line)
        summary.total += 1
        kept = summary.examples.setdefault(key, [])
        if len(kept) < examples:
            kept.append(line)
    return summary
