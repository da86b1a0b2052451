"""Corpus-wide deduplication: exact copies, then near-duplicates by MinHash-LSH.

Run over the whole cleaned corpus *before* the train/validation split, so that of every group of
duplicates only one document survives and validation can never hold a near-twin of a training
document (a split by content hash only keeps *identical* texts together).

- **Exact**: a 64-bit BLAKE2b hash of the canonical text (whitespace collapsed, case-folded); a
  document whose hash was seen before is dropped.
- **Near**: each document becomes a set of shingles (:mod:`.shingling`), less its source's page
  template (:mod:`.templates`). Shingles are min-hashed in numpy (:func:`signature`),
  locality-sensitive hashing with ``bands`` x ``rows`` proposes candidate pairs (two documents
  whose signatures agree on every row of some band: :func:`band_keys`), and a pair counts when
  its Jaccard similarity reaches ``threshold``: estimated from the full signatures (``verify="signature"``),
  computed exactly from the shingles (``verify="exact"``, one more read of the corpus for the
  documents in candidate pairs only), or taken on the LSH's word (``verify="none"``).

Documents are considered in stream order and the first one wins (:func:`first_kept_wins`): a
document is dropped when it matches a document that is kept, so chains (A~B, B~C, A!~C) do not
remove C. A *cluster* is a kept document with the documents dropped in its favour.

`prepare` decides from files, in stages that hold only a share of the corpus each
(:mod:`mindfoundry.data.prepare.stage_dedup`), with these pieces: :class:`Signer`, :func:`band_keys`,
:func:`signature_similarity`, :func:`first_kept_wins` and :class:`Clusters` (bench/dedup_reference.py decides the
same way in memory: the reference the stages are tested against).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mindfoundry.config.data_config import DedupConfig
from mindfoundry.data.clean.shingling import MIX, ROLL, Shingle, shingle_keys, shingle_ngram, unit_values
from mindfoundry.data.clean.templates import Templates, source_salt
from mindfoundry.data.clean.text import LATIN_RANGES, canonical, other_script_units, script_counts

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


class Signer:
    """Shingles a document and min-hashes them: what dedup (and a worker signing for it) computes per document."""

    def __init__(self, *, shingle: Shingle = "chars", char_ngram: int = 5, word_ngram: int = 5,
                 num_perm: int = 128, seed: int = 1, templates: Templates | None = None) -> None:
        self.shingle, self.ngram = shingle, shingle_ngram(shingle, char_ngram, word_ngram)
        self.perms = permutations(num_perm, seed)
        self.templates = templates

    @classmethod
    def of(cls, settings: DedupConfig, templates: Templates | None = None) -> Signer:
        """The signer of ``data.dedup``, discounting ``templates``."""
        return cls(shingle=settings.shingle, char_ngram=settings.char_ngram, word_ngram=settings.word_ngram,
                   num_perm=settings.num_perm, seed=settings.seed, templates=templates)

    def hashes(self, text: str, source: str) -> np.ndarray:
        """The distinct hashes of the document's shingles, less its site's template shingles (for exact Jaccard). A
        page that is template through and through (a chapter index whose entries are the site's menu) is compared on
        its own text, which is none: its shingles are salted with its canonical text, so that only its verbatim copies
        share them, and not the site's other pages of template alone."""
        keys = shingle_keys(unit_values(text, self.shingle), self.ngram)
        if self.templates:
            outside = self.templates.outside(keys, source, self.ngram)
            if outside is not None:
                keys = keys[outside] if outside.any() else keys ^ np.uint64(exact_key(text))
        return np.unique(keys)

    def sign(self, text: str, source: str) -> np.ndarray:
        """The document's MinHash signature."""
        return signature(self.hashes(text, source), self.perms)


#: A document labelled with a language written in Latin letters whose reader units are at least this share in
#: another script (CJK characters, or words of Cyrillic, Greek, Arabic...) is a half-translated page: its own group;
#: a page with at least this share in Latin letters and in another script is also in the group of that mix.
MIXED_SCRIPT_SHARE = 0.2
_NON_LATIN_LANGUAGES = frozenset({"zh", "ja", "ko", "ru", "uk", "bg", "el", "ar", "fa", "he", "hi", "th", "ta"})
_KANA = re.compile("[\u3040-\u30ff]")
_OTHER_LETTER = re.compile(f"[^\\W\\d_{LATIN_RANGES}]")


def _other_script(text: str) -> str:
    """The script of a mixed page's letters that are not Latin: KANA where it has kana (Japanese), else the Unicode
    name's first word of its first such letter (CJK, HANGUL, CYRILLIC, GREEK, ARABIC...)."""
    if _KANA.search(text):
        return "KANA"
    match = _OTHER_LETTER.search(text)
    return unicodedata.name(match.group(), "?").split()[0] if match else ""


def comparison_groups(text: str, language: str) -> tuple[str, ...]:
    """Which documents a document is compared with for near-duplicates: those of its language (a translation that
    keeps the original's command listings is not a copy of it), and among those written in Latin letters, a page
    half in another script apart (a help page translated in part: its English paragraphs are its original's). A page
    with at least :data:`MIXED_SCRIPT_SHARE` of its reader units in Latin letters and in another script is also
    compared with the pages of that mix (``mixed:CJK``...): the model labels it by its larger half, which an edited
    copy can tip (a Chinese help page left half in English is ``en`` and its copy ``zh``)."""
    other = other_script_units(text) if language else 0
    if other <= 0:
        return (language,)
    units = script_counts(text).reader_units
    own = language if language in _NON_LATIN_LANGUAGES or other < MIXED_SCRIPT_SHARE * units else f"{language}+"
    if MIXED_SCRIPT_SHARE * units <= other <= (1 - MIXED_SCRIPT_SHARE) * units:
        return own, f"mixed:{_other_script(text)}"
    return (own,)


def comparison_salts(text: str, language: str) -> tuple[int, ...]:
    """What a document's band keys are mixed with, once per group of :func:`comparison_groups`: the group's number; 0
    for a document without a language, so a corpus prepared without the language block is bucketed as before."""
    return tuple(int(source_salt(group)) if group else 0 for group in comparison_groups(text, language))


def band_keys(signatures: np.ndarray, bands: int, rows: int, salts: np.ndarray | None = None) -> np.ndarray:
    """``(bands, n)`` keys of the LSH bands of ``n`` signatures (rows of ``signatures``): band ``b`` is rows
    ``b*rows .. b*rows+rows-1`` of a signature, and two signatures share band ``b``'s bucket when their keys
    there are equal. A key is the band's values folded into 64 bits (xor, multiply by an odd constant, a final
    mix): equal bands give equal keys, and unequal ones collide with probability about 2**-64. ``salts`` (one per
    signature, :func:`comparison_salts`) start each key, so documents of two comparison groups never share a
    bucket."""
    keys = np.empty((bands, len(signatures)), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for band in range(bands):
            key = np.full(len(signatures), np.uint64(band + 1) * MIX, dtype=np.uint64)
            if salts is not None:
                key ^= salts
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
