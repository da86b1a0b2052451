"""Sorted key runs on disk and the key-range partitions that read them: the shuffle of the staged `prepare`.

A map task writes its ``(key, value)`` pairs as one *run*: two ``.npy`` files sorted by key (stably,
so equal keys keep the task's order). A reduce task owns a range of the 64-bit key space and reads
its slice of every run by binary search on the memory-mapped keys, so it holds only its share of
the corpus's entries, and a run is written once however many partitions read it. This is how
datatrove's MinHash buckets find matches (sorted signature files merged per bucket); here it also
counts boilerplate lines, finds exact duplicates, and hands dedup's candidate pairs to the task
that verifies them.

The number of partitions is :func:`partitions` of the total number of entries, decided from the
map tasks' counts: deterministic for a corpus, whatever runs the tasks.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

#: Entries a reduce task holds (16 bytes each, a few copies while sorting: a few MB) while the corpus is small enough
#: (bench/prepare_scale.py: at 1 << 19, the exact and band tasks' peak RSS doubled from 25k to 400k documents).
PARTITION_ENTRIES = 1 << 16
#: At most this many key ranges per stage: every range reads a slice of every map task's run, so the reads grow as
#: tasks x ranges; past 64M entries (some 64M documents) ranges grow instead (a billion: 1M entries, ~50 MB a task).
MAX_PARTITIONS = 1024
KEY_SPACE = 1 << 64


def partitions(entries: int, most: int = MAX_PARTITIONS) -> int:
    """How many key ranges share ``entries``: about :data:`PARTITION_ENTRIES` each, at most ``most`` ranges."""
    return min(max(1, -(-entries // PARTITION_ENTRIES)), most)


def key_range(partition: int, count: int) -> tuple[int, int | None]:
    """``[low, high)`` of partition ``partition`` of ``count`` equal ranges of the key space (high None: to the end)."""
    low = partition * KEY_SPACE // count
    return low, None if partition == count - 1 else (partition + 1) * KEY_SPACE // count


def write_run(folder: Path, name: str, keys: np.ndarray, values: np.ndarray) -> int:
    """Save ``(keys, values)`` sorted by key (ties in the given order) as ``NAME.keys.npy`` / ``NAME.values.npy``."""
    order = np.argsort(keys, kind="stable")
    np.save(folder / f"{name}.keys.npy", np.ascontiguousarray(keys[order], dtype=np.uint64))
    np.save(folder / f"{name}.values.npy", np.ascontiguousarray(values[order]))
    return len(keys)


def read_range(folder: Path, name: str, low: int, high: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The run's entries with ``low <= key < high``, copied out of the memory-mapped files."""
    keys = np.load(folder / f"{name}.keys.npy", mmap_mode="r")
    values = np.load(folder / f"{name}.values.npy", mmap_mode="r")
    start = int(np.searchsorted(keys, np.uint64(low), side="left"))
    end = len(keys) if high is None else int(np.searchsorted(keys, np.uint64(high), side="left"))
    return np.array(keys[start:end]), np.array(values[start:end])


def gather(folders: Iterable[Path], name: str, low: int, high: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every run's slice of ``[low, high)``: keys, values and the number of the run (the folder) each came from,
    in run order, then each run's key order."""
    parts = [(read_range(folder, name, low, high), i) for i, folder in enumerate(folders)]
    keys = np.concatenate([k for (k, _), _ in parts]) if parts else np.zeros(0, np.uint64)
    values = np.concatenate([v for (_, v), _ in parts]) if parts else np.zeros(0, np.uint64)
    runs = np.concatenate([np.full(len(k), i, np.int64) for (k, _), i in parts]) if parts else np.zeros(0, np.int64)
    return keys, values, runs


def groups(sorted_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, ends)`` of the runs of equal keys in a sorted array."""
    if not len(sorted_keys):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.flatnonzero(np.concatenate(([True], sorted_keys[1:] != sorted_keys[:-1])))
    return starts, np.append(starts[1:], len(sorted_keys))
