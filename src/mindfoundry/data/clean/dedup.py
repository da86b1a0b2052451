"""Corpus-wide deduplication: exact copies, then near-duplicates by MinHash-LSH.

Run over the whole cleaned corpus *before* the train/validation split, so that of every group of
duplicates only one document survives and validation can never hold a near-twin of a training
document (a split by content hash only keeps *identical* texts together).

- **Exact**: a 64-bit BLAKE2b hash of the canonical text (whitespace collapsed, case-folded); a
  document whose hash was seen before is dropped.
- **Near**: each document becomes a set of shingles, character n-grams for Chinese-dominant
  documents (no spaces between words) and word n-grams otherwise (English, code), decided per
  document by script. ``datasketch`` computes MinHash signatures (``MinHash.bulk``) and an LSH
  index with ``bands`` x ``rows`` proposes candidate pairs. A pair counts when its Jaccard
  similarity reaches ``threshold``: estimated from the full signatures (``verify="signature"``),
  computed exactly from the shingles (``verify="exact"``, one more read of the corpus for the
  documents in candidate pairs only), or taken on the LSH's word (``verify="none"``).

Documents are considered in stream order and the first one wins: a document is dropped when it
matches a document that is kept, so chains (A~B, B~C, A!~C) do not remove C. A *cluster* is a
kept document with the documents dropped in its favour. Memory holds ids, hashes, signatures
and the LSH tables, never texts.
"""

from __future__ import annotations

import hashlib
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from datasketch import MinHash, MinHashLSH

from mindfoundry.data.clean.text import canonical, is_cjk_text, units
from mindfoundry.data.document import Document

Verify = Literal["none", "signature", "exact"]
_BATCH = 512


def shingles(text: str, *, char_ngram: int = 5, word_ngram: int = 5) -> set[bytes]:
    """The shingle set of a document: char n-grams if Chinese-dominant, else word n-grams.

    Units (see :func:`~mindfoundry.data.clean.text.units`) drop punctuation and case, so an
    edit of punctuation or capitalization changes no shingle. A document shorter than one
    n-gram is a single shingle.
    """
    tokens = units(text)
    if not tokens:
        return {canonical(text).encode("utf-8")}
    if is_cjk_text(text):
        chars = "".join(tokens)
        grams = {chars[i:i + char_ngram] for i in range(max(len(chars) - char_ngram + 1, 1))}
    else:
        grams = {" ".join(tokens[i:i + word_ngram]) for i in range(max(len(tokens) - word_ngram + 1, 1))}
    return {gram.encode("utf-8") for gram in grams}


def jaccard(a: set[bytes], b: set[bytes]) -> float:
    """|a ∩ b| / |a ∪ b| (1.0 for two empty sets)."""
    union = len(a | b)
    return len(a & b) / union if union else 1.0


def exact_key(text: str) -> int:
    """64-bit identity of a document's canonical text, for exact dedup."""
    return int.from_bytes(hashlib.blake2b(canonical(text).encode("utf-8"), digest_size=8).digest(), "little")


def _crc32(data: bytes) -> int:
    """32-bit shingle hash for MinHash: twice as fast as datasketch's SHA-1 default; the random
    permutations MinHash applies on top supply the min-wise independence."""
    return zlib.crc32(data)


@dataclass
class DedupResult:
    """Which documents to drop, and the report for the manifest."""

    dropped: dict[str, Literal["exact", "near"]]
    report: dict[str, Any] = field(default_factory=dict)

    def keeps(self, doc: Document) -> bool:
        return doc.id not in self.dropped


def minhash_signatures(sets: list[set[bytes]], num_perm: int, seed: int) -> list[MinHash]:
    """MinHash signatures of shingle sets, with the fast crc32 hash every dedup path must share."""
    return MinHash.bulk(sets, num_perm=num_perm, seed=seed, hashfunc=_crc32)


class Deduplicator:
    """Streaming exact + near-duplicate detection: :meth:`add` every document, then :meth:`finish`."""

    def __init__(
        self,
        *,
        exact: bool = True,
        near: bool = True,
        threshold: float = 0.7,
        num_perm: int = 128,
        bands: int = 20,
        rows: int = 5,
        char_ngram: int = 5,
        word_ngram: int = 5,
        verify: Verify = "signature",
        seed: int = 1,
        max_examples: int = 5,
    ) -> None:
        if bands * rows > num_perm:
            raise ValueError(f"bands*rows = {bands * rows} exceeds num_perm={num_perm}: lower bands or rows")
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        if verify not in ("none", "signature", "exact"):
            raise ValueError(f"verify must be 'none', 'signature' or 'exact', got {verify!r}")
        self.exact, self.near, self.threshold, self.verify = exact, near, threshold, verify
        self.num_perm, self.seed, self.max_examples = num_perm, seed, max_examples
        self.ngrams = {"char_ngram": char_ngram, "word_ngram": word_ngram}
        self._lsh = MinHashLSH(num_perm=num_perm, params=(bands, rows))
        self._ids: list[str] = []
        self._sources: list[str] = []
        self._first_by_key: dict[int, int] = {}
        self._exact_of: dict[int, int] = {}  # dropped index -> kept index with the same text
        self._pending: list[tuple[int, set[bytes]]] = []
        self._signatures: dict[int, np.ndarray] = {}
        self._pairs: list[tuple[int, int]] = []
        self._candidates = 0
        self._seconds = 0.0

    def add(self, doc: Document) -> None:
        """Register the next document of the corpus (order decides which copy is kept)."""
        start = time.perf_counter()
        self._add(doc)
        self._seconds += time.perf_counter() - start

    def _add(self, doc: Document) -> None:
        index = len(self._ids)
        self._ids.append(doc.id)
        self._sources.append(doc.source)
        if self.exact:
            first = self._first_by_key.setdefault(exact_key(doc.text), index)
            if first != index:
                self._exact_of[index] = first
                return
        if self.near:
            self._pending.append((index, shingles(doc.text, **self.ngrams)))
            if len(self._pending) >= _BATCH:
                self._flush()

    def add_all(self, docs: Iterable[Document]) -> None:
        for doc in docs:
            self.add(doc)

    def finish(self, reread: Callable[[], Iterable[Document]] | None = None) -> DedupResult:
        """Decide what to drop. ``verify="exact"`` needs ``reread``: the same documents again."""
        start = time.perf_counter()
        self._flush()
        pairs = self._pairs
        if self.near and self.verify == "exact":
            if reread is None:
                raise ValueError("verify='exact' needs reread: a callable that yields the same documents again")
            pairs = self._exact_pairs(reread())
        near_of = self._greedy(pairs)
        self._seconds += time.perf_counter() - start
        dropped: dict[str, Literal["exact", "near"]] = {self._ids[i]: "exact" for i in self._exact_of}
        dropped.update({self._ids[i]: "near" for i in near_of})
        return DedupResult(dropped, self._report(near_of, verified_pairs=len(pairs)))

    def _flush(self) -> None:
        """MinHash the pending batch, then query-and-insert each document in order."""
        if not self._pending:
            return
        indices, sets = zip(*self._pending, strict=True)
        self._pending = []
        for index, signature in zip(indices, minhash_signatures(sets, self.num_perm, self.seed), strict=True):
            self._match_and_insert(index, signature)

    def _match_and_insert(self, index: int, signature: MinHash) -> None:
        """Record the pairs a signature forms with earlier documents, then index it."""
        candidates = self._lsh.query(signature)
        self._lsh.insert(index, signature, check_duplication=False)
        self._candidates += len(candidates)
        hashes = signature.hashvalues.astype(np.uint32)
        if self.verify == "signature":
            self._signatures[index] = hashes
            candidates = [c for c in candidates if np.mean(self._signatures[c] == hashes) >= self.threshold]
        self._pairs.extend((c, index) for c in candidates)

    def add_signed(self, doc_id: str, source: str, key: int | None, signature: MinHash | None, seconds: float = 0.0) -> None:
        """Register the next document from its precomputed exact key and signature (computed elsewhere,
        e.g. in a worker process, with :func:`exact_key` and :func:`minhash_signatures`); `seconds` is
        the time that computation took, so the reported dedup time stays comparable."""
        start = time.perf_counter()
        index = len(self._ids)
        self._ids.append(doc_id)
        self._sources.append(source)
        first = index if key is None else self._first_by_key.setdefault(key, index)
        if first != index:
            self._exact_of[index] = first
        elif signature is not None:
            self._match_and_insert(index, signature)
        self._seconds += seconds + time.perf_counter() - start

    def _exact_pairs(self, docs: Iterable[Document]) -> list[tuple[int, int]]:
        """Candidate pairs whose exact shingle Jaccard reaches the threshold (reads only their documents)."""
        needed = {self._ids[i]: i for pair in self._pairs for i in pair}
        sets: dict[int, set[bytes]] = {}
        for doc in docs:
            if doc.id in needed:
                sets[needed[doc.id]] = shingles(doc.text, **self.ngrams)
        missing = len(needed) - len(sets)
        if missing:
            raise ValueError(f"reread yielded {missing} fewer of the candidate documents than the first read: "
                             "it must yield the same documents")
        return [(a, b) for a, b in self._pairs if jaccard(sets[a], sets[b]) >= self.threshold]

    def _greedy(self, pairs: list[tuple[int, int]]) -> dict[int, int]:
        """``{dropped index: kept index}``: in stream order, drop a document matching a kept one."""
        earlier: dict[int, list[int]] = defaultdict(list)
        for a, b in pairs:
            earlier[max(a, b)].append(min(a, b))
        near_of: dict[int, int] = {}
        for later in sorted(earlier):
            kept = [i for i in earlier[later] if i not in near_of]
            if kept:
                near_of[later] = min(kept)
        return near_of

    def _report(self, near_of: dict[int, int], *, verified_pairs: int) -> dict[str, Any]:
        documents = len(self._ids)
        by_source: dict[str, Counter[str]] = defaultdict(Counter)
        for kind, dropped in (("exact", self._exact_of), ("near", near_of)):
            for index in dropped:
                by_source[self._sources[index]][kind] += 1
        return {
            "documents": documents,
            "kept": documents - len(self._exact_of) - len(near_of),
            "exact": self._cluster_report(self._exact_of),
            "near": dict(self._cluster_report(near_of), candidate_pairs=self._candidates, verified_pairs=verified_pairs),
            "removed_by_source": {name: dict(counts) for name, counts in sorted(by_source.items())},
            "seconds": round(self._seconds, 3),
            "documents_per_second": round(documents / self._seconds) if self._seconds else None,
        }

    def _cluster_report(self, dropped: dict[int, int]) -> dict[str, Any]:
        """Clusters (a kept document and the copies dropped for it): count, size histogram, examples."""
        members: dict[int, list[int]] = defaultdict(list)
        for index, kept in dropped.items():
            members[kept].append(index)
        sizes = Counter(len(m) + 1 for m in members.values())
        largest = sorted(members.items(), key=lambda item: (-len(item[1]), item[0]))[: self.max_examples]
        return {
            "removed": len(dropped),
            "clusters": len(members),
            "cluster_sizes": {str(size): n for size, n in sorted(sizes.items())},
            "examples": [[self._ids[kept], *(self._ids[i] for i in sorted(copies))] for kept, copies in largest],
        }
