"""The drop log: one JSON line per document that cleaning or dedup dropped or edited (``drops.jsonl.gz``).

A line names the document by ``source``, ``path`` (relative to the source's root) and ``record``
(0-based line or row in that file), the ``block`` and ``reason``, the ``action`` (``drop`` or
``edit``), the measured ``value`` and the ``threshold`` it broke, and a 200-character
``excerpt`` (the document for a drop, the changed span for an edit). A dedup drop also names the
twin that stays (``kept``) and their ``jaccard``. The shard pass writes it next to the shards,
so it lists exactly the documents that are in the sources but not in the shards.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, IO

from mindfoundry.errors import InputMissingError, MindFoundryError

DROPS_FILE = "drops.jsonl.gz"


class DropLogError(MindFoundryError, ValueError):
    """A drop log that cannot be read."""


class DropLog:
    """Appends drop-log lines to a gzip file (a callable, as :func:`~mindfoundry.data.clean.curate.curate` takes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: IO[str] = gzip.open(path, "wt", encoding="utf-8")
        self.lines = 0

    def __call__(self, events: list[dict[str, Any]]) -> None:
        for line in events:
            self._fh.write(json.dumps(line, ensure_ascii=False) + "\n")
        self.lines += len(events)

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> DropLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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


@dataclass
class DropSummary:
    """Counts of the matching lines by (block, reason, action) and by source, with a few examples of each."""

    counts: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    by_source: Counter[str] = field(default_factory=Counter)
    examples: dict[tuple[str, str, str], list[dict[str, Any]]] = field(default_factory=dict)
    total: int = 0


def summarise(lines: Iterator[dict[str, Any]], *, block: str | None = None, reason: str | None = None,
              source: str | None = None, examples: int = 3) -> DropSummary:
    """What the drop log says, restricted to one block, reason and/or source."""
    summary = DropSummary()
    for line in lines:
        if (block and line["block"] != block) or (reason and line["reason"] != reason) or (source and line["source"] != source):
            continue
        key = (line["block"], line["reason"], line["action"])
        summary.counts[key] += 1
        summary.by_source[line["source"]] += 1
        summary.total += 1
        kept = summary.examples.setdefault(key, [])
        if len(kept) < examples:
            kept.append(line)
    return summary
