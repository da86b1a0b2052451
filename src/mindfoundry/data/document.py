"""The unit of text that flows through the data pipeline."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Document:
    """One training document and where it came from.

    ``id`` is unique within a corpus and stable across runs (for example
    ``"mysource:sub/file.jsonl:17"``: source name, path relative to the source root, line or
    record number), so manifests, dedup reports and split decisions can point back to the exact
    origin of every document. ``category`` (``news``, ``code``, ...) lets mixtures and evaluation
    reports group sources by kind. ``path`` (relative to the source's root) and ``record`` (0-based
    index of the document in that file: its line for .jsonl and line-mode .txt, its row for
    .parquet, 0 for a whole-file document) say where to find it again, for the drop log. ``site`` is the host of
    the document's URL where its source names a ``url_field`` (pages of one site share a template; a source may hold
    many sites), and ``language`` what the language block identified (near-duplicates are looked for within a
    language: a translation is not a copy); both empty when unknown.
    """

    text: str
    id: str
    source: str
    category: str
    path: str = ""
    record: int = 0
    site: str = ""
    language: str = ""

    def origin(self) -> dict[str, str | int]:
        """Where the document came from, as the drop log and dedup reports write it."""
        return {"source": self.source, "path": self.path, "record": self.record}


def origin_name(origin: dict[str, str | int]) -> str:
    """``source:path#record`` (record 0-based): how reports and messages name a document, the drop log's numbering
    (an id's trailing number is a 1-based line or row, kept as it is because ids are stable)."""
    return f"{origin['source']}:{origin['path']}#{origin['record']}"
