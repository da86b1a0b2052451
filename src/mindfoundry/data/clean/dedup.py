"""Corpus-wide deduplication: exact copies, then near-duplicates by MinHash-LSH.

Run over the whole cleaned corpus *before* the train/validation split, so that of every group of
duplicates only one document survives and validation can never hold a near-twin of a training
document (a split by content hash only keeps *identical* texts together).

- **Exact**: a 64-bit BLAKE2b hash of the canonical text (whitespace collapsed, case-folded); a
  document whose hash was seen before is dropped.
- **Near**: each document becomes a set of shingles made the same way for every script, so a
  document and its edited twin are always compared like with like (deciding per document by
  script would give a Chinese page and its English-heavier twin different kinds and a Jaccard of
  0): by default character ``char_ngram``-grams of the document's letters and digits (case
  folded, punctuation and spacing reduced to one space between Latin words and none around CJK
  characters), which survive the scattered character edits that break word n-grams; or, with
  ``shingle: words``, ``word_ngram``-grams of units (a word or a CJK character). Shingles are
  hashed and min-hashed in numpy (:func:`signature`), locality-sensitive hashing with ``bands`` x
  ``rows`` proposes candidate pairs (two documents whose signatures agree on every row of some
  band: :func:`band_keys`), and a pair counts when its Jaccard
  similarity reaches ``threshold``: estimated from the full signatures (``verify="signature"``),
  computed exactly from the shingles (``verify="exact"``, one more read of the corpus for the
  documents in candidate pairs only), or taken on the LSH's word (``verify="none"``).

Documents are considered in stream order and the first one wins (:func:`first_kept_wins`): a
document is dropped when it matches a document that is kept, so chains (A~B, B~C, A!~C) do not
remove C. A *cluster* is a kept document with the documents dropped in its favour.

:class:`Deduplicator` decides in memory (ids, hashes, signatures and the LSH tables, never texts):
the reference, and what the labelled benchmark runs. `prepare` decides the same way from files,
in stages that hold only a share of the corpus each (:mod:`mindfoundry.data.prepare.stage_dedup`),
with the same pieces: :class:`Signer`, :func:`band_keys`, :func:`signature_similarity`,
:func:`first_kept_wins` and :class:`Clusters`.
"""

from __future__ import annotations

import hashlib
import time
from array import array
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from mindfoundry.config.data_config import DedupConfig
from mindfoundry.data.clean.shingling import MIX, ROLL, Shingle, shingle_keys, shingle_ngram, unit_values
from mindfoundry.data.clean.templates import Templates
from mindfoundry.data.clean.text import canonical
from mindfoundry.data.document import Document, origin_name

Verify = Literal["none", "signature", "exact"]
_CHUNK = 8192  # shingles min-hashed at once (bounds the shingles x num_perm matrix of a long document)


def jaccard(a: set[str] | np.ndarray, b: set[str] | np.ndarray) -> float:
    """|a ∩ b| / |a ∪ b| of two shingle sets or two arrays of distinct hashes (1.0 for two empty ones)."""
    if isinstance(a, np.ndarray):
        common = len(np.intersect1d(a, b, assume_unique=True))
        union = len(a) + len(b) - common
        return common / union if union else 1.0
    union = len(a | b)
    return len(a & b) / union if union else 1.0


def exact_key(text: str) -> int:
    """64-bit identity of a document's canonical text, for exact dedup."""
    return int.from_bytes(hashlib.blake2b(canonical(text).encode("utf-8"), digest_size=8).digest(), "little")


def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``num_perm`` hash permutations ``h -> a*h + b`` (mod 2**64, ``a`` odd: a bijection) of a seed."""
    rng = np.random.RandomState(seed)
    a = rng.randint(0, 2**63, size=num_perm, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    b = rng.randint(0, 2**63, size=num_perm, dtype=np.uint64)
    return a, b


def signature(hashes: np.ndarray, perms: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """The MinHash signature of a set of shingle hashes: for each permutation the smallest permuted
    hash, kept to its high 32 bits (the well-mixed ones of an affine map mod 2**64)."""
    a, b = perms
    lowest = np.full(len(a), np.iinfo(np.uint64).max, dtype=np.uint64)
    for start in range(0, len(hashes), _CHUNK):
        block = hashes[start:start + _CHUNK, None] * a + b
        np.minimum(lowest, block.min(axis=0), out=lowest)
    return lowest >> np.uint64(32)


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

    def keeps(self, doc: Document) -> bool:
        return doc.id not in self.dropped


class Signer:
    """Shingles a document and min-hashes them: what dedup (and a worker signing for it) computes per document."""

    def __init__(self, *, shingle: Shingle = "chars", char_ngram: int = 5, word_ngram: int = 5,
                 num_perm: int = 128, seed: int = 1, templates: Templates | None = None) -> None:
        self.shingle, self.ngram = shingle, shingle_ngram(shingle, char_ngram, word_ngram)
        self.perms = permutations(num_perm, seed)
        self.templates = templates

    def hashes(self, text: str, source: str) -> np.ndarray:
        """The distinct hashes of the document's shingles, less its source's template shingles (for exact Jaccard)."""
        keys = shingle_keys(unit_values(text, self.shingle), self.ngram)
        if self.templates:
            outside = self.templates.outside(keys, source, self.ngram)
            if outside is not None:
                keys = keys[outside]
        return np.unique(keys)

    def sign(self, text: str, source: str) -> np.ndarray:
        """The document's MinHash signature."""
        return signature(self.hashes(text, source), self.perms)


def band_keys(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """``(bands, n)`` keys of the LSH bands of ``n`` signatures (rows of ``signatures``): band ``b`` is rows
    ``b*rows .. b*rows+rows-1`` of a signature, and two signatures share band ``b``'s bucket when their keys
    there are equal. A key is the band's values folded into 64 bits (xor, multiply by an odd constant, a final
    mix): equal bands give equal keys, and unequal ones collide with probability about 2**-64."""
    keys = np.empty((bands, len(signatures)), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for band in range(bands):
            key = np.full(len(signatures), np.uint64(band + 1) * MIX, dtype=np.uint64)
            for row in range(band * rows, band * rows + rows):
                key = (key ^ signatures[:, row].astype(np.uint64)) * ROLL
            key ^= key >> np.uint64(31)
            keys[band] = key * MIX
    return keys


def signature_similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The Jaccard similarity two MinHash signatures estimate: the share of permutations where they agree
    (row by row for two arrays of signatures)."""
    return np.mean(a == b, axis=-1)


Pair = tuple[int, int, float | None]  # (earlier, later, Jaccard or None)


def first_kept_wins(pairs: Iterable[Pair]) -> dict[int, tuple[int, float | None]]:
    """``{dropped: (kept, Jaccard)}`` from matching pairs sorted by (later, earlier): in corpus order, a document
    is dropped for the first earlier document it matches that is itself kept (so A~B, B~C, A!~C keeps C)."""
    dropped: dict[int, tuple[int, float | None]] = {}
    for earlier, later, score in pairs:
        if later not in dropped and earlier not in dropped:
            dropped[later] = (earlier, score)
    return dropped


@dataclass
class Clusters:
    """Clusters of one kind (a kept document and the copies dropped for it): how many, their sizes, and the
    ``max_examples`` largest (ties: the earlier kept document first). Partial counts :meth:`merge`."""

    max_examples: int
    removed: int = 0
    sizes: Counter[int] = field(default_factory=Counter)
    largest: list[tuple[int, int, list[int]]] = field(default_factory=list)  # (-size, kept, sorted copies)

    def add(self, kept: int, copies: list[int]) -> None:
        self.removed += len(copies)
        self.sizes[len(copies) + 1] += 1
        self._keep([(-len(copies), kept, sorted(copies))])

    def merge(self, other: Clusters) -> None:
        self.removed += other.removed
        self.sizes.update(other.sizes)
        self._keep(other.largest)

    def _keep(self, more: list[tuple[int, int, list[int]]]) -> None:
        self.largest = sorted(self.largest + more, key=lambda item: item[:2])[: self.max_examples]

    def report(self, name: Callable[[int], str]) -> dict[str, Any]:
        """The manifest's form: ``removed``, ``clusters``, ``cluster_sizes`` and ``examples`` (``name`` of each member:
        ``source:path#record``, the kept document first)."""
        return {
            "removed": self.removed,
            "clusters": sum(self.sizes.values()),
            "cluster_sizes": {str(size): n for size, n in sorted(self.sizes.items())},
            "examples": [[name(kept), *(name(i) for i in copies)] for _, kept, copies in self.largest],
        }

    def to_json(self) -> dict[str, Any]:
        return {"removed": self.removed, "sizes": {str(k): v for k, v in self.sizes.items()},
                "largest": [[size, kept, copies] for size, kept, copies in self.largest]}

    @classmethod
    def from_json(cls, value: dict[str, Any], max_examples: int) -> Clusters:
        return cls(max_examples, value["removed"], Counter({int(k): v for k, v in value["sizes"].items()}),
                   [(size, kept, copies) for size, kept, copies in value["largest"]])

    @classmethod
    def of(cls, dropped: dict[int, int], max_examples: int) -> Clusters:
        """The clusters of ``{dropped: kept}``."""
        members: dict[int, list[int]] = defaultdict(list)
        for index, kept in dropped.items():
            members[kept].append(index)
        clusters = cls(max_examples)
        for kept, copies in members.items():
            clusters.add(kept, copies)
        return clusters


#: The data.dedup defaults (their one home is :class:`~mindfoundry.config.data_config.DedupConfig`).
_DEFAULT = DedupConfig()


class Deduplicator:
    """Streaming exact + near-duplicate detection: :meth:`add` every document, then :meth:`finish`."""

    def __init__(
        self,
        *,
        exact: bool = True,
        near: bool = True,
        threshold: float = _DEFAULT.threshold,
        num_perm: int = _DEFAULT.num_perm,
        bands: int = _DEFAULT.bands,
        rows: int = _DEFAULT.rows,
        shingle: Shingle = "chars",
        char_ngram: int = 5,
        word_ngram: int = 5,
        verify: Verify = "signature",
        seed: int = 1,
        max_examples: int = 5,
        template_shingles: Templates | None = None,
    ) -> None:
        if bands * rows > num_perm:
            raise ValueError(f"bands*rows = {bands * rows} exceeds num_perm={num_perm}: lower bands or rows")
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        if verify not in ("none", "signature", "exact"):
            raise ValueError(f"verify must be 'none', 'signature' or 'exact', got {verify!r}")
        self.exact, self.near, self.threshold, self.verify = exact, near, threshold, verify
        self.seed, self.max_examples = seed, max_examples
        self.signer = Signer(
            shingle=shingle, char_ngram=char_ngram, word_ngram=word_ngram, num_perm=num_perm, seed=seed,
            templates=template_shingles,
        )
        self.bands, self.rows = bands, rows
        self._buckets: list[dict[int, list[int]]] = [{} for _ in range(bands)]  # per band: key -> indices
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
        hashes = self.signer.sign(doc.text, doc.source) if self.near else None
        self._register(doc.id, doc.origin(), key, hashes)

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

    def _match_and_insert(self, index: int, hashes: np.ndarray) -> None:
        """Record the pairs a signature forms with earlier documents, then index it."""
        candidates: set[int] = set()
        for bucket, key in zip(
            self._buckets, band_keys(hashes[None, :], self.bands, self.rows)[:, 0].tolist(), strict=True
        ):
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

    def _register(self, doc_id: str, origin: dict[str, Any], key: int | None, hashes: np.ndarray | None) -> None:
        index = len(self._ids)
        self._ids.append(doc_id)
        self._sources.append(origin["source"])
        self._paths.append(origin["path"])
        self._records.append(origin["record"])
        first = index if key is None else self._first_by_key.setdefault(key, index)
        if first != index:
            self._exact_of[index] = first
        elif hashes is not None:
            self._match_and_insert(index, hashes)

    def _exact_pairs(self, docs: Iterable[Document]) -> list[tuple[int, int, float | None]]:
        """Candidate pairs whose exact shingle Jaccard reaches the threshold (reads only their documents)."""
        needed = {self._ids[i]: i for pair in self._pairs for i in pair[:2]}
        sets: dict[int, np.ndarray] = {}
        for doc in docs:
            if doc.id in needed:
                sets[needed[doc.id]] = self.signer.hashes(doc.text, doc.source)
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

