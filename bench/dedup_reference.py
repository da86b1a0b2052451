"""The in-memory reference of `prepare`'s dedup, for the labelled benchmark and the tests.

:class:`Deduplicator` decides as `prepare`'s dedup stages do (:mod:`mindfoundry.data.prepare.stage_dedup`), with the
same pieces (:class:`~mindfoundry.data.clean.dedup.Signer`, :func:`~mindfoundry.data.clean.dedup.band_keys`,
:func:`~mindfoundry.data.clean.dedup.signature_similarity`, :func:`~mindfoundry.data.clean.dedup.first_kept_wins`,
:class:`~mindfoundry.data.clean.dedup.Clusters`), but in memory (ids, hashes, signatures and the LSH tables, never
texts) and in one process: the reference the staged dedup is tested against, and what bench/dedup_quality.py runs.
:func:`count_templates` finds the template shingles in one pass over a corpus held in memory, as `prepare`'s read,
boilerplate and templates stages do over files.
"""

from __future__ import annotations

import time
from array import array
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from mindfoundry.config.data_config import DedupConfig
from mindfoundry.data.clean.boilerplate import frequent_in_source
from mindfoundry.data.clean.dedup import (
    Clusters,
    Signer,
    band_keys,
    comparison_salts,
    exact_key,
    first_kept_wins,
    jaccard,
    signature_similarity,
)
from mindfoundry.data.clean.shingling import shingle_ngram, unit_values
from mindfoundry.data.clean.templates import Templates, covered_shingles, document_spans, template_key
from mindfoundry.data.document import Document, origin_name

_NONE = np.zeros(0, dtype=np.uint64)


@dataclass(frozen=True)
class Twin:
    """Why a document was dropped by dedup: the kept document it copies (source, path, record) and
    the Jaccard similarity of their shingles (1.0 for an exact copy; estimated from the signatures or
    computed exactly as ``verify`` says; ``None`` with ``verify="none"``)."""

    kind: Literal["exact", "near"]
    kept: dict[str, str | int]
    jaccard: float | None


@dataclass
class DedupResult:
    """Which documents to drop, why (``twins``), and the report for the manifest."""

    dropped: dict[str, Literal["exact", "near"]]
    report: dict[str, Any] = field(default_factory=dict)
    twins: dict[str, Twin] = field(default_factory=dict)



class Deduplicator:
    """Streaming exact + near-duplicate detection: :meth:`add` every document, then :meth:`finish`."""

    def __init__(self, config: DedupConfig = DedupConfig(), templates: Templates | None = None) -> None:
        self.exact, self.near, self.threshold, self.verify = config.exact, config.near, config.threshold, config.verify
        self.max_examples = config.max_examples
        self.signer = Signer.of(config, templates)
        self.bands, self.rows = config.bands, config.rows
        self._buckets: list[dict[int, list[int]]] = [{} for _ in range(config.bands)]  # per band: key -> indices
        self._ids: list[str] = []
        self._sources: list[str] = []
        self._paths: list[str] = []
        self._records = array("q")
        self._first_by_key: dict[int, int] = {}
        self._exact_of: dict[int, int] = {}  # dropped index -> kept index with the same text
        self._signatures: dict[int, np.ndarray] = {}
        self._pairs: list[tuple[int, int, float | None]] = []  # (earlier, later, Jaccard estimate)
        self._candidates = 0
        self._seconds = 0.0

    def add(self, doc: Document) -> None:
        """Register the next document of the corpus (order decides which copy is kept)."""
        start = time.perf_counter()
        self._add(doc)
        self._seconds += time.perf_counter() - start

    def _add(self, doc: Document) -> None:
        key = exact_key(doc.text) if self.exact else None
        hashes = self.signer.sign(doc.text, template_key(doc.source, doc.site)) if self.near else None
        self._register(doc.id, doc.origin(), key, hashes, comparison_salts(doc.text, doc.language))

    def add_all(self, docs: Iterable[Document]) -> None:
        for doc in docs:
            self.add(doc)

    def finish(self, reread: Callable[[], Iterable[Document]] | None = None) -> DedupResult:
        """Decide what to drop. ``verify="exact"`` needs ``reread``: the same documents again."""
        start = time.perf_counter()
        pairs = self._pairs
        if self.near and self.verify == "exact":
            if reread is None:
                raise ValueError("verify='exact' needs reread: a callable that yields the same documents again")
            pairs = self._exact_pairs(reread())
        near_of = first_kept_wins(sorted(pairs, key=lambda pair: (pair[1], pair[0])))
        self._seconds += time.perf_counter() - start
        dropped: dict[str, Literal["exact", "near"]] = {self._ids[i]: "exact" for i in self._exact_of}
        dropped.update({self._ids[i]: "near" for i in near_of})
        twins = {self._ids[i]: Twin("exact", self._origin(kept), 1.0) for i, kept in self._exact_of.items()}
        twins.update({self._ids[i]: Twin("near", self._origin(kept), score) for i, (kept, score) in near_of.items()})
        return DedupResult(
            dropped, self._report({i: kept for i, (kept, _) in near_of.items()}, verified_pairs=len(pairs)), twins
        )

    def _origin(self, index: int) -> dict[str, str | int]:
        return {"source": self._sources[index], "path": self._paths[index], "record": self._records[index]}

    def _name(self, index: int) -> str:
        return origin_name(self._origin(index))

    def _match_and_insert(self, index: int, hashes: np.ndarray, salts: tuple[int, ...]) -> None:
        """Record the pairs a signature forms with earlier documents (of its comparison groups), then index it."""
        candidates: set[int] = set()
        keys = band_keys(np.repeat(hashes[None, :], len(salts), axis=0), self.bands, self.rows,
                         np.array(salts, dtype=np.uint64))
        for bucket, band in zip(self._buckets, keys.tolist(), strict=True):
            for key in band:
                members = bucket.setdefault(key, [])
                candidates.update(members)
                members.append(index)
        self._candidates += len(candidates)
        if self.verify == "signature":
            self._signatures[index] = hashes
            scored = ((c, float(signature_similarity(self._signatures[c], hashes))) for c in sorted(candidates))
            self._pairs.extend((c, index, score) for c, score in scored if score >= self.threshold)
        else:
            self._pairs.extend((c, index, None) for c in sorted(candidates))

    def _register(self, doc_id: str, origin: dict[str, Any], key: int | None, hashes: np.ndarray | None,
                  salts: tuple[int, ...] = (0,)) -> None:
        index = len(self._ids)
        self._ids.append(doc_id)
        self._sources.append(origin["source"])
        self._paths.append(origin["path"])
        self._records.append(origin["record"])
        first = index if key is None else self._first_by_key.setdefault(key, index)
        if first != index:
            self._exact_of[index] = first
        elif hashes is not None:
            self._match_and_insert(index, hashes, salts)

    def _exact_pairs(self, docs: Iterable[Document]) -> list[tuple[int, int, float | None]]:
        """Candidate pairs whose exact shingle Jaccard reaches the threshold (reads only their documents)."""
        needed = {self._ids[i]: i for pair in self._pairs for i in pair[:2]}
        sets: dict[int, np.ndarray] = {}
        for doc in docs:
            if doc.id in needed:
                sets[needed[doc.id]] = self.signer.hashes(doc.text, template_key(doc.source, doc.site))
        missing = len(needed) - len(sets)
        if missing:
            raise ValueError(f"reread yielded {missing} fewer of the candidate documents than the first read: "
                             "it must yield the same documents")
        scored = ((a, b, jaccard(sets[a], sets[b])) for a, b, _ in self._pairs)
        return [(a, b, score) for a, b, score in scored if score >= self.threshold]

    def _report(self, near_of: dict[int, int], *, verified_pairs: int) -> dict[str, Any]:
        documents = len(self._ids)
        by_source: dict[str, Counter[str]] = defaultdict(Counter)
        for kind, dropped in (("exact", self._exact_of), ("near", near_of)):
            for index in dropped:
                by_source[self._sources[index]][kind] += 1
        return {
            "documents": documents,
            "kept": documents - len(self._exact_of) - len(near_of),
            "exact": Clusters.of(self._exact_of, self.max_examples).report(self._name),
            "near": dict(Clusters.of(near_of, self.max_examples).report(self._name),
                         candidate_pairs=self._candidates, verified_pairs=verified_pairs),
            "removed_by_source": {name: dict(counts) for name, counts in sorted(by_source.items())},
            "seconds": round(self._seconds, 3),
            "documents_per_second": round(documents / self._seconds) if self._seconds else None,
        }


def count_templates(docs: Iterable[Document], config: DedupConfig) -> Templates:
    """The template shingles of ``docs``, each source's first ``templates.sample`` documents counted per site (held in
    memory for the second step); none when ``config.templates.enabled`` is off."""
    settings, shingle = config.templates, config.shingle
    ngram = shingle_ngram(shingle, config.char_ngram, config.word_ngram)
    if not settings.enabled:
        return Templates(_NONE)
    sampled: dict[str, list[np.ndarray]] = {}  # per site (template_key): its sampled documents' units
    taken: Counter[str] = Counter()  # per source: the sample is the source's first documents, whatever their site
    for doc in docs:
        if taken[doc.source] < settings.sample:
            taken[doc.source] += 1
            sampled.setdefault(template_key(doc.source, doc.site), []).append(unit_values(doc.text, shingle))
    found = [_NONE]
    for source, documents in sampled.items():
        keys, counts = np.unique(
            np.concatenate([_NONE, *(document_spans(v, settings.ngram, source) for v in documents)]),
            return_counts=True,
        )
        spans = keys[frequent_in_source(counts, len(documents), settings.min_documents, settings.min_share)]
        found += [covered_shingles(v, ngram, spans, settings.ngram, source) for v in documents]
    return Templates(np.unique(np.concatenate(found)))
