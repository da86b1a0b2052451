"""Which images are copies of which: exact copies by pixel key, near copies by perceptual hash, and the clusters the
train/validation split keeps on one side.

Near copies are found exactly, not sampled: a pair within ``distance`` bits agrees on at least one of ``distance + 1``
bands of the 64-bit hash (pigeonhole), so images are grouped by each band's value and only the pairs inside a group
are compared. The cost grows with the square of the images that share a band value (about N^2 / 2^(64 / (distance +
1)) per band for unrelated images): right for the 10^5 images of one `prepare` here; a corpus of many millions wants
these bands as key runs across tasks, as the text dedup does.
"""

from __future__ import annotations

import numpy as np

from mindfoundry.data.images.hashes import hamming

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


def copies_of(keys: np.ndarray, hashes: np.ndarray, *, exact: bool, near: bool,
              near_distance: int) -> tuple[np.ndarray, np.ndarray]:
    """Which image each image (in corpus order) is a copy of -- itself when it is kept -- and, for a near copy, the
    bits between the two (-1 otherwise): exact copies (equal pixel keys) of the first; then among the rest, a near
    copy within ``near_distance`` of the nearest earlier image that is kept."""
    count = len(keys)
    kept_by = first_copies(keys) if exact else np.arange(count)
    bits = np.full(count, -1)
    if near:
        alive = np.flatnonzero(kept_by == np.arange(count))
        first, second = near_pairs(hashes[alive], near_distance)
        for later, (earlier, apart) in _nearest_kept_earlier(first, second, hamming(
                hashes[alive[first]], hashes[alive[second]])).items():
            kept_by[alive[later]], bits[alive[later]] = alive[earlier], apart
    return kept_by, bits


def _nearest_kept_earlier(first: np.ndarray, second: np.ndarray, apart: np.ndarray) -> dict[int, tuple[int, int]]:
    """In corpus order, each item within reach of an earlier item that is kept is dropped, for the nearest such item
    (the earliest of equals): {dropped: (kept, bits)}. Not transitive: a copy of a dropped copy is judged against
    the kept ones alone, so a chain of small changes never drops an image far from everything kept."""
    dropped: dict[int, tuple[int, int]] = {}
    order = np.lexsort((first, apart, second))  # by the later item, then the nearest, then the earliest
    for i in order:
        later, earlier = int(second[i]), int(first[i])
        if later not in dropped and earlier not in dropped:
            dropped[later] = (earlier, int(apart[i]))
    return dropped


def split_clusters(hashes: np.ndarray, kept: np.ndarray, split_distance: int) -> np.ndarray:
    """For each kept image (indices ``kept``), the first image of its cluster within ``split_distance``: what decides
    its side of the split."""
    first, second = near_pairs(hashes[kept], split_distance)
    return kept[components(len(kept), first, second)]
