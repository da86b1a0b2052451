"""Train/validation split decided per document by a keyed hash of its text.

The decision depends only on the (stripped) text and the seed, never on position, source or id.
So the split is reproducible without storing a list of ids, it does not shift when documents are
added or reordered, and two identical documents always land on the same side: validation never
contains an exact copy of a training document. (Near-duplicates are the dedup stage's job.)
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Literal

from mindfoundry.data.document import Document

Split = Literal["train", "validation"]

_HASH_BYTES = 8
# Keep the top 53 bits so the value is an exact double in [0, 1) (64 bits could round to 1.0).
_MANTISSA_BITS = 53


def content_hash(text: str) -> str:
    """sha256 hex digest of the stripped text: the identity used for "same document"."""
    return hashlib.sha256(text.strip().encode("utf-8")).hexdigest()


def is_validation(text: str, seed: int, fraction: float) -> bool:
    """Whether a document with this text belongs to the validation split.

    The stripped text is hashed with BLAKE2b keyed by the seed and the digest is mapped to
    [0, 1); the document is in validation when that value is below ``fraction``. A different
    seed gives an independent split; ``fraction=0`` puts everything in train.
    """
    _check_split_args(seed, fraction)
    return _unit_interval(text, _seed_key(seed)) < fraction


def split_documents(
    docs: Iterable[Document], seed: int, fraction: float
) -> Iterator[tuple[Split, Document]]:
    """Label each document ``"train"`` or ``"validation"`` (see :func:`is_validation`), lazily.

    Arguments are checked at call time, before the first document is read.
    """
    _check_split_args(seed, fraction)
    return _label(docs, _seed_key(seed), fraction)


def _label(
    docs: Iterable[Document], key: bytes, fraction: float
) -> Iterator[tuple[Split, Document]]:
    for doc in docs:
        yield ("validation" if _unit_interval(doc.text, key) < fraction else "train"), doc


def _check_split_args(seed: int, fraction: float) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if not 0.0 <= fraction < 1.0:
        raise ValueError(
            f"validation fraction must be in [0, 1), got {fraction!r} (use e.g. 0.01 to hold out 1% of documents)"
        )


def _seed_key(seed: int) -> bytes:
    """A BLAKE2b key (at most 64 bytes) derived from any int seed, negative or huge."""
    return hashlib.sha256(f"mindfoundry.split:{seed}".encode("ascii")).digest()


def _unit_interval(text: str, key: bytes) -> float:
    digest = hashlib.blake2b(text.strip().encode("utf-8"), key=key, digest_size=_HASH_BYTES)
    top_bits = int.from_bytes(digest.digest(), "big") >> (8 * _HASH_BYTES - _MANTISSA_BITS)
    return top_bits / (1 << _MANTISSA_BITS)
