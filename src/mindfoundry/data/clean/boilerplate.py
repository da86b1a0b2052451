"""Boilerplate: lines that many documents share, and advertising templates.

Navigation bars, copyright footers and "share this" widgets repeat verbatim across the pages of
a site, so a line's *document frequency* exposes them. :class:`LineCounter` is the pre-pass: it
counts, for every normalized line, how many documents contain it, keeping only 8-byte hashes
(never the lines). :class:`BoilerplateRemover` then deletes the frequent lines, and any line
matching an advertising pattern, from each document.

Documents of a single line are not counted and lose no frequent line: a one-line document that
many documents repeat is a duplicate document, which dedup reduces to one copy rather than
deleting every copy. Advertising patterns apply to every document.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from mindfoundry.config.clean import BoilerplateConfig
from mindfoundry.data.clean.base import Transform
from mindfoundry.data.clean.text import canonical
from mindfoundry.data.document import Document


def line_key(line: str) -> int:
    """Stable 64-bit key of a normalized line (the same in every process, unlike ``hash``)."""
    digest = hashlib.blake2b(line.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _candidate_lines(text: str, min_line_chars: int) -> list[tuple[str, str]]:
    """``(raw line, normalized line)`` pairs; empty for single-line documents."""
    lines = text.split("\n")
    if sum(1 for line in lines if line.strip()) < 2:
        return []
    pairs = [(line, canonical(line)) for line in lines]
    return [(raw, norm) for raw, norm in pairs if len(norm) >= min_line_chars]


class LineCounter:
    """Document frequency of normalized lines, for finding boilerplate (the pre-pass).

    Memory is one dict entry per distinct line (about 100 bytes), whatever the line's length.
    """

    def __init__(self, min_line_chars: int) -> None:
        self.min_line_chars = min_line_chars
        self.documents: Counter[int] = Counter()

    def add(self, text: str) -> None:
        """Count each distinct qualifying line of one document once."""
        self.documents.update({line_key(norm) for _, norm in _candidate_lines(text, self.min_line_chars)})

    def add_all(self, texts: Iterable[str]) -> None:
        for text in texts:
            self.add(text)

    def frequent(self, min_documents: int) -> frozenset[int]:
        """Keys of the lines found in at least ``min_documents`` documents."""
        return frozenset(key for key, n in self.documents.items() if n >= min_documents)


class BoilerplateRemover(Transform):
    """Delete frequent lines (keys from :class:`LineCounter`) and lines matching ad patterns.

    ``ad_patterns`` are case-insensitive regular expressions searched within each line. Edits:
    ``repeated_line`` and ``ad_line`` (lines deleted). A document left empty is dropped.
    """

    name = "boilerplate"
    section = BoilerplateConfig

    def __init__(self, frequent_lines: frozenset[int] = frozenset(), **settings: Any) -> None:
        super().__init__(**settings)
        self.frequent_lines = frequent_lines
        self.min_line_chars = self.settings.min_line_chars
        patterns = self.settings.ad_patterns
        self.ads = re.compile("|".join(f"(?:{p})" for p in patterns), re.IGNORECASE) if patterns else None

    @classmethod
    def build(cls, settings: dict[str, Any], frequent_lines: frozenset[int]) -> BoilerplateRemover:
        return cls(frequent_lines, **settings)

    def transform(self, doc: Document) -> Document:
        repeated = self._repeated_lines(doc.text)
        if not repeated and (self.ads is None or self.ads.search(doc.text) is None):
            return doc
        kept = []
        for line in doc.text.split("\n"):
            if line in repeated:
                self.count("repeated_line")
            elif self.ads is not None and self.ads.search(line):
                self.count("ad_line")
            else:
                kept.append(line)
        return replace(doc, text="\n".join(kept))

    def _repeated_lines(self, text: str) -> set[str]:
        if not self.frequent_lines:
            return set()
        return {
            raw for raw, norm in _candidate_lines(text, self.min_line_chars)
            if line_key(norm) in self.frequent_lines
        }
