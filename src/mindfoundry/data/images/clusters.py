"""Which images are copies of which: exact copies by pixel key, near copies by perceptual hashes then looks
(:mod:`mindfoundry.data.images.likeness`), and the clusters the train/validation split keeps on one side.

Near copies are found exactly, not sampled: a pair within ``distance`` bits agrees on at least one of ``distance + 1``
bands of the 64-bit hash (pigeonhole), so images are grouped by each band's value and only the pairs inside a group
are compared. The cost grows with the square of the images that share a band value (about N^2 / 2^(64 / (distance +
1)) per band for unrelated images). Measured on the bench's real hashes (three per image): 8,000 images in 9 s at
distance 12 (1.7 s at 8), 16,000 in 35 s, 32,000 in 129 s (21 s at 8): right for the 10^4 images of one `prepare`
here, not for millions, which want multi-index hashing (longer bands probed within a radius) or these bands as key
runs across tasks, as the text dedup does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mindfoundry.data.images.hashes import hamming
from mindfoundry.data.images.likeness import likeness

BITS = 64


def near_pairs(hashes: np.ndarray, distance: int) -> tuple[np.ndarray, np.ndarray]:
    """``(first, second)`` index arrays of every pair ``first < second`` of ``hashes`` (uint64) within ``distance``
    bits, each pair once, sorted."""
    hashes = np.asarray(hashes, dtype=np.uint64)
    edges = np.linspace(0, BITS, distance + 2).astype(int)
    found: list[np.ndarray] = []
    for low, high in zip(edges[:-1], edges[1:]):
        band = (hashes >> np.uint64(low)) & np.uint64((1 << (high - low)) - 1)
        order = np.argsort(band, kind="stable")
        ordered = band[order]
        for offset in range(1, len(order)):
            same = ordered[offset:] == ordered[:-offset]
            if not same.any():
                break
            a, b = order[:-offset][same], order[offset:][same]
            close = hamming(hashes[a], hashes[b]) <= distance
            first, second = np.minimum(a, b)[close], np.maximum(a, b)[close]
            found.append(first.astype(np.int64) * len(hashes) + second)
    if not found:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    codes = np.unique(np.concatenate(found))
    return codes // len(hashes), codes % len(hashes)


def components(count: int, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Each of ``count`` items' cluster: the smallest index connected to it through the pairs."""
    labels = np.arange(count)
    while True:
        low = np.minimum(labels[first], labels[second])
        before = labels.copy()
        np.minimum.at(labels, first, low)
        np.minimum.at(labels, second, low)
        labels = labels[labels]  # pointer jumping: every item straight to its cluster's current smallest
        if np.array_equal(labels, before):
            return labels


def first_copies(keys: np.ndarray) -> np.ndarray:
    """For each item, the index of the first item with its key (itself when it is the first)."""
    _, inverse = np.unique(np.asarray(keys, dtype=np.uint64), return_inverse=True)
    first = np.full(inverse.max() + 1 if len(inverse) else 0, len(keys), dtype=np.int64)
    np.minimum.at(first, inverse, np.arange(len(keys)))
    return first[inverse]


def hash_pairs(hashes: np.ndarray, distance: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(first, second, bits)``: every pair of images ``first < second`` whose whole hash (column 0 of ``hashes``,
    n x crops) is within ``distance`` bits of the other's whole or centre hash, each pair once with its fewest bits."""
    count, crops = hashes.shape
    flat = np.ascontiguousarray(hashes, dtype=np.uint64).reshape(-1)
    a, b = near_pairs(flat, distance)
    useful = (a // crops != b // crops) & ((a % crops == 0) | (b % crops == 0))
    a, b = a[useful], b[useful]
    bits = hamming(flat[a], flat[b])
    first, second = np.minimum(a // crops, b // crops), np.maximum(a // crops, b // crops)
    order = np.lexsort((bits, second, first))
    codes = first[order] * count + second[order]
    once = np.concatenate([[True], codes[1:] != codes[:-1]]) if len(codes) else np.zeros(0, bool)
    return first[order][once], second[order][once], bits[order][once]


@dataclass(frozen=True)
class Candidates:
    """Pairs of images ``first < second`` whose hashes are near (:func:`hash_pairs`), with the bits between them and
    the likeness of their looks."""

    first: np.ndarray
    second: np.ndarray
    bits: np.ndarray
    likeness: np.ndarray


def near_candidates(hashes: np.ndarray, looks_of: Callable[[np.ndarray], np.ndarray], distance: int,
                    among: np.ndarray | None = None, chunk: int = 512) -> Candidates:
    """The pairs of the images ``among`` (indices; every image when None) within ``distance`` bits
    (:func:`hash_pairs`) and their likeness. ``looks_of(indices)`` gives the looks of those images, asked ``chunk``
    pairs at a time so that only the looks of candidate pairs are ever held."""
    among = np.arange(len(hashes)) if among is None else among
    first, second, bits = hash_pairs(np.asarray(hashes)[among], distance)
    first, second = among[first], among[second]
    score = [likeness(looks_of(first[s:s + chunk]), looks_of(second[s:s + chunk]))
             for s in range(0, len(first), chunk)]
    return Candidates(first, second, bits, np.concatenate(score) if score else np.zeros(0))


@dataclass(frozen=True)
class NearCopies:
    """Which image each image (in corpus order) is a copy of -- itself when it is kept -- and, for a near copy, the
    likeness of the two and their hashes' bits apart (-1 otherwise)."""

    kept_by: np.ndarray
    likeness: np.ndarray
    bits: np.ndarray


def copies_of(exact: np.ndarray, near: Candidates | None, near_likeness: float) -> NearCopies:
    """Given each image's exact twin (:func:`first_copies`, or itself), among the images that are no exact copy a
    near copy (a candidate pair at least ``near_likeness`` alike; none when ``near`` is None) of the most alike
    earlier image that is kept."""
    count = len(exact)
    kept_by = np.array(exact, dtype=np.int64)
    alike, bits = np.full(count, -1.0), np.full(count, -1)
    if near is not None:
        alive = kept_by == np.arange(count)
        copy = np.flatnonzero((near.likeness >= near_likeness) & alive[near.first] & alive[near.second])
        for later, (earlier, index) in _most_alike_kept_earlier(near.first[copy], near.second[copy],
                                                                near.likeness[copy]).items():
            kept_by[later] = earlier
            alike[later], bits[later] = near.likeness[copy[index]], near.bits[copy[index]]
    return NearCopies(kept_by, alike, bits)


def _most_alike_kept_earlier(first: np.ndarray, second: np.ndarray, alike: np.ndarray) -> dict[int, tuple[int, int]]:
    """In corpus order, each item alike an earlier item that is kept is dropped, for the most alike such item (the
    earliest of equals): {dropped: (kept, pair index)}. Not transitive: a copy of a dropped copy is judged against
    the kept ones alone, so a chain of small changes never drops an image far from everything kept."""
    dropped: dict[int, tuple[int, int]] = {}
    order = np.lexsort((first, -alike, second))  # by the later item, then the most alike, then the earliest
    for i in order:
        later, earlier = int(second[i]), int(first[i])
        if later not in dropped and earlier not in dropped:
            dropped[later] = (earlier, int(i))
    return dropped


def split_clusters(hashes: np.ndarray, kept: np.ndarray, split_distance: int) -> np.ndarray:
    """For each kept image (indices ``kept``), the first image of its cluster within ``split_distance``: what decides
    its side of the split."""
    first, second = near_pairs(hashes[kept], split_distance)
    return kept[components(len(kept), first, second)]
