"""Membership in a sorted ``uint64`` key array: the form every corpus-wide key set takes (boilerplate lines, template
shingles, exact-dedup drops), 8 bytes a key and a binary search a lookup, however large the corpus."""

from __future__ import annotations

import numpy as np


def in_sorted(sorted_keys: np.ndarray, keys: np.ndarray | np.uint64) -> np.ndarray:
    """Which of ``keys`` (an array, or one ``np.uint64``: a 0-d answer) are in ``sorted_keys`` (which may be
    memory-mapped). Both sides stay ``uint64``: a Python int above 2**63 would be compared as a float."""
    if not len(sorted_keys):
        return np.zeros(np.shape(keys), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return np.asarray(sorted_keys[at] == keys)
