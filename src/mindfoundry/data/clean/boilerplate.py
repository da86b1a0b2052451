"""Boilerplate: lines that many documents share, and advertising templates.

Navigation bars, copyright footers and "share this" widgets repeat verbatim across the pages of
a site, so a line's *document frequency* exposes them. :class:`LineCounter` is the pre-pass: it
counts, for every normalized line, how many documents contain it, keeping only 8-byte hashes
(never the lines). Two kinds of line count:

- *edge lines*, the first and last ``edge_lines`` non-blank lines of a document, whatever their
  length, counted per source: headers, breadcrumbs and nav items are short ("首页", "上一页"), and
  they are boilerplate when they open or close at least ``min_source_share`` of that source's
  documents (and ``min_documents`` of them) and stand in a block of at least ``edge_block_lines``
  such lines (a header is a block; a lone "Exeunt." closing most scenes of a play is content);
- *body lines* of at least ``min_line_chars`` characters anywhere, counted corpus-wide, found in
  ``min_documents`` documents. In the ``docs`` profile (manuals, API references) body lines are
  never removed: "Traceback (most recent call last):" or a shared example line is content there.

:class:`BoilerplateRemover` deletes the frequent lines, and any line matching an advertising
pattern, from each document. Content lines (code, imports, tracebacks, headings, options, table rules) are never
boilerplate. Documents of a single line
are not counted and lose no frequent line: a one-line document that many documents repeat is a
duplicate document, which dedup reduces to one copy rather than deleting every copy.
Advertising patterns apply to every document.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from mindfoundry.config.clean import BoilerplateConfig
from mindfoundry.config.patterns import UserPatterns
from mindfoundry.data.clean.block import Transform
from mindfoundry.data.clean.keysets import in_sorted
from mindfoundry.data.clean.kind import is_content_line
from mindfoundry.data.clean.text import canonical
from mindfoundry.data.document import Document


def line_key(line: str) -> int:
    """Stable 64-bit key of a normalized line (the same in every process, unlike ``hash``)."""
    digest = hashlib.blake2b(line.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


@dataclass(frozen=True)
class FrequentLines:
    """The corpus-wide verdict: keys of boilerplate body lines (corpus-wide) and of edge lines (per source),
    each a sorted ``uint64`` array (8 bytes a line, however many the corpus has)."""

    body: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    edges: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))

    def __bool__(self) -> bool:
        return bool(len(self.body) or len(self.edges))

    def body_line(self, key: int) -> bool:
        return bool(in_sorted(self.body, np.uint64(key)))

    def edge_line(self, key: int) -> bool:
        return bool(in_sorted(self.edges, np.uint64(key)))


def frequent_body(documents: np.ndarray, min_documents: int) -> np.ndarray:
    """Which of the document counts of body lines make them boilerplate."""
    return documents >= min_documents


def frequent_in_source(documents: np.ndarray, source_documents: np.ndarray | int, min_documents: int,
                       min_share: float) -> np.ndarray:
    """Which keys recur in their source, by their document counts and their sources' counted documents: in at least
    ``min_documents`` documents and at least ``min_share`` of their source's (edge lines here, template spans in
    :mod:`.templates`)."""
    return (documents >= min_documents) & (documents >= min_share * source_documents)


def edge_key(source: str, norm: str) -> int:
    """Key of an edge line of ``source`` (edge lines are counted per source)."""
    return line_key(f"{source}\x00{norm}")


Line = tuple[str, str]  # (raw, normalized)


def _lines(text: str, min_line_chars: int, edge_lines: int) -> tuple[list[Line], list[Line], list[Line]]:
    """A document's head and tail edge lines and its long body lines, as ``(raw, normalized)`` pairs (none
    for one-line documents); content lines (code, tracebacks, headings, options, table rules: :func:`is_content_line`)
    are never candidates."""
    lines = [line for line in text.split("\n") if line.strip()]
    if len(lines) < 2:
        return [], [], []
    pairs = [(line, canonical(line)) for line in lines if not is_content_line(line)]
    head = pairs[:edge_lines]
    tail = pairs[max(edge_lines, len(pairs) - edge_lines):] if edge_lines else []
    return head, tail, [(raw, norm) for raw, norm in pairs if len(norm) >= min_line_chars]


def _runs(flags: list[bool], least: int) -> list[bool]:
    """``flags`` with every run of consecutive trues shorter than ``least`` set false."""
    out = [False] * len(flags)
    start = 0
    for i in range(len(flags) + 1):
        if i == len(flags) or not flags[i]:
            if i - start >= least:
                out[start:i] = [True] * (i - start)
            start = i + 1
    return out


def document_keys(text: str, source: str, min_line_chars: int, edge_lines: int) -> tuple[set[int], set[int]] | None:
    """The keys of a document's distinct body lines and edge lines, each counted once per document; None for a
    document that does not count (one line)."""
    head, tail, body = _lines(text, min_line_chars, edge_lines)
    if not head:
        return None
    return {line_key(norm) for _, norm in body}, {edge_key(source, norm) for _, norm in head + tail}


class LineCounter:
    """Document frequency of normalized lines, for finding boilerplate (the pre-pass).

    Memory is one dict entry per distinct line (about 100 bytes), whatever the line's length.
    Counters of chunks counted apart :meth:`merge` into one.
    """

    def __init__(self, min_line_chars: int, edge_lines: int) -> None:
        self.min_line_chars, self.edge_lines = min_line_chars, edge_lines
        self.body: Counter[int] = Counter()
        self.edges: Counter[int] = Counter()
        self.edge_source: dict[int, str] = {}
        self.source_documents: Counter[str] = Counter()

    def add(self, text: str, source: str) -> None:
        """Count each distinct qualifying line of one document of ``source`` once."""
        keys = document_keys(text, source, self.min_line_chars, self.edge_lines)
        if keys is None:
            return
        body, edges = keys
        self.source_documents[source] += 1
        self.body.update(body)
        self.edges.update(edges)
        self.edge_source.update(dict.fromkeys(edges, source))

    def merge(self, other: LineCounter) -> None:
        self.body.update(other.body)
        self.edges.update(other.edges)
        self.edge_source.update(other.edge_source)
        self.source_documents.update(other.source_documents)

    def frequent(self, min_documents: int, min_source_share: float) -> FrequentLines:
        """Body lines found in at least ``min_documents`` documents; edge lines found in at least that many
        and in at least ``min_source_share`` of their source's documents."""
        body = np.fromiter(self.body.keys(), np.uint64, len(self.body))
        body_counts = np.fromiter(self.body.values(), np.int64, len(self.body))
        edges = np.fromiter(self.edges.keys(), np.uint64, len(self.edges))
        edge_counts = np.fromiter(self.edges.values(), np.int64, len(self.edges))
        sources = np.fromiter(
            (self.source_documents[self.edge_source[key]] for key in self.edges), np.int64, len(self.edges)
        )
        return FrequentLines(np.sort(body[frequent_body(body_counts, min_documents)]),
                             np.sort(edges[frequent_in_source(edge_counts, sources, min_documents, min_source_share)]))


class BoilerplateRemover(Transform):
    """Delete frequent lines (keys from :class:`LineCounter`) and lines matching ad patterns.

    ``ad_patterns`` are case-insensitive regular expressions searched within each line. Edits:
    ``repeated_line`` (a frequent body line), ``edge_line`` (a frequent header/footer line) and
    ``ad_line``. A document left empty is dropped.
    """

    name = "boilerplate"
    section = BoilerplateConfig

    def __init__(self, frequent_lines: FrequentLines = FrequentLines(), **settings: Any) -> None:
        super().__init__(**settings)
        self.frequent_lines = frequent_lines
        self.min_line_chars, self.edge_lines = self.settings.min_line_chars, self.settings.edge_lines
        self.body_lines, self.edge_block_lines = self.settings.body_lines, self.settings.edge_block_lines
        patterns = self.settings.ad_patterns
        self.ads = UserPatterns(patterns, "data.clean.boilerplate.ad_patterns") if patterns else None

    @classmethod
    def build(cls, settings: dict[str, Any], frequent_lines: FrequentLines) -> BoilerplateRemover:
        return cls(frequent_lines, **settings)

    def transform(self, doc: Document) -> Document:
        repeated = self._repeated_lines(doc)
        if not repeated and (self.ads is None or not self.ads.search(doc.text)):
            return doc
        kept = []
        for line in doc.text.split("\n"):
            if line in repeated:
                self.count(repeated[line])
            elif self.ads is not None and self.ads.search(line):
                self.count("ad_line")
            else:
                kept.append(line)
        return replace(doc, text="\n".join(kept))

    def _repeated_lines(self, doc: Document) -> dict[str, str]:
        """``{raw line: edit kind}`` of the document's frequent lines."""
        if not self.frequent_lines:
            return {}
        head, tail, body = _lines(doc.text, self.min_line_chars, self.edge_lines)
        found = {}
        for edge in (head, tail):
            frequent = [self.frequent_lines.edge_line(edge_key(doc.source, norm)) for _, norm in edge]
            found.update(
                {
                    raw: "edge_line"
                    for (raw, _), keep in zip(edge, _runs(frequent, self.edge_block_lines), strict=True)
                    if keep
                }
            )
        if self.body_lines:
            found.update({raw: "repeated_line" for raw, norm in body
                          if raw not in found and self.frequent_lines.body_line(line_key(norm))})
        return found
