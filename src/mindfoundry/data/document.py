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
    reports group sources by kind.
    """

    text: str
    id: str
    source: str
    category: str
