"""Shingles: the sets near-duplicate detection compares, made the same way for every script.

A document is a stream of *units*: by default its letters and digits (case folded, punctuation and
spacing reduced to one space between Latin words and none around CJK characters, :func:`char_stream`),
whose character ``n``-grams survive the scattered character edits that break word n-grams; or, with
``shingle: words``, its words and CJK characters. Deciding per document by script would give a Chinese
page and its English-heavier twin different kinds and a Jaccard of 0, so every document gets the same
kind. A shingle is an ``n``-unit window, hashed to 64 bits in numpy (:func:`window_keys`).
"""

from __future__ import annotations

import re
import zlib
from typing import Literal

import numpy as np

from mindfoundry.data.clean.text import CJK_RANGES, canonical, units

Shingle = Literal["chars", "words"]
_NON_UNIT = re.compile(r"[\W_]+")
_SPACE_BY_CJK = re.compile(f"(?<=[{CJK_RANGES}]) | (?=[{CJK_RANGES}])")
ROLL = np.uint64(0x100000001B3)  # FNV-64 prime: the base of the rolling n-gram hash
MIX = np.uint64(0x9E3779B97F4A7C15)


def char_stream(text: str) -> str:
    """What character shingles are cut from: letters and digits case-folded, every run of punctuation
    and spacing one space between Latin words and none next to a CJK character."""
    return _SPACE_BY_CJK.sub("", _NON_UNIT.sub(" ", text.casefold())).strip()


def shingles(text: str, *, shingle: Shingle = "chars", char_ngram: int = 5, word_ngram: int = 5) -> set[str]:
    """The shingle set of a document, as text (for reading and tests; dedup uses :func:`shingle_hashes`).

    Punctuation, spacing and case never change a shingle. A document shorter than one n-gram is
    a single shingle (its whole stream, or its canonical text when it has no letter or digit).
    """
    if shingle == "words":
        tokens = units(text)
        if not tokens:
            return {canonical(text)}
        return {" ".join(tokens[i:i + word_ngram]) for i in range(max(len(tokens) - word_ngram + 1, 1))}
    stream = char_stream(text) or canonical(text)
    return {stream[i:i + char_ngram] for i in range(max(len(stream) - char_ngram + 1, 1))}


def unit_values(text: str, shingle: Shingle) -> np.ndarray:
    """The document's units as numbers: code points of :func:`char_stream` (``chars``), or crc32 of each word and
    CJK character (``words``); a document without letters or digits is its canonical text."""
    if shingle == "words":
        tokens = units(text) or (canonical(text),)
        return np.fromiter((zlib.crc32(t.encode("utf-8")) for t in tokens), dtype=np.uint64, count=len(tokens))
    stream = char_stream(text) or canonical(text)
    return np.frombuffer(stream.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)


def window_keys(values: np.ndarray, n: int) -> np.ndarray:
    """The hash of every ``n``-unit window (``len(values) - n + 1`` of them): the polynomial
    ``sum(x[i+k] * B**(n-1-k))`` over 64-bit wraparound, one vector operation per k, then mixed."""
    windows = len(values) - n + 1
    keys = values[:windows].copy()
    with np.errstate(over="ignore"):
        for k in range(1, n):
            keys = keys * ROLL + values[k:k + windows]
        return keys * MIX


def shingle_ngram(shingle: Shingle, char_ngram: int, word_ngram: int) -> int:
    """The shingle size in units of the shingle kind."""
    return word_ngram if shingle == "words" else char_ngram


def shingle_keys(values: np.ndarray, n: int) -> np.ndarray:
    """The hash of every shingle position of a document's unit values (a document shorter than ``n`` units is one
    shingle, one without units a zero)."""
    if not len(values):
        return np.zeros(1, dtype=np.uint64)
    return window_keys(values, min(n, len(values)))


def shingle_hashes(text: str, *, shingle: Shingle = "chars", char_ngram: int = 5, word_ngram: int = 5) -> np.ndarray:
    """The distinct 64-bit hashes of :func:`shingles` (one per shingle), computed in numpy."""
    return np.unique(shingle_keys(unit_values(text, shingle), shingle_ngram(shingle, char_ngram, word_ngram)))
