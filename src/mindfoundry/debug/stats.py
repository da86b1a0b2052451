"""Summary statistics of one tensor: what the `statistics` dump mode stores instead of the array."""

from __future__ import annotations

import math

import numpy as np


def tensor_stats(array: np.ndarray) -> dict[str, float | int | None]:
    """count, NaN/Inf counts, and min/max/mean/L2 norm over the finite elements.

    Statistics over finite elements only keep a tensor with one Inf comparable (its other values
    still have a mean); the NaN and Inf counts say that it is not clean. The common all-finite case
    costs four passes (sum, min, max, dot) and no temporary arrays.
    """
    a = np.asarray(array)
    flat = a.reshape(-1)
    n = int(flat.size)
    if n == 0:
        return {"count": 0, "nan": 0, "inf": 0, "min": None, "max": None, "mean": None, "norm": 0.0}
    if a.dtype.kind not in "fc":
        flat = flat.astype(np.float64)
    total = float(flat.sum(dtype=np.float64))
    nan = inf = 0
    if not math.isfinite(total):
        nan = int(np.isnan(flat).sum())
        inf = int(np.isinf(flat).sum())
        flat = flat[np.isfinite(flat)]
        if flat.size == 0:
            return {"count": n, "nan": nan, "inf": inf, "min": None, "max": None, "mean": None, "norm": None}
        total = float(flat.sum(dtype=np.float64))
    if flat.dtype not in (np.float32, np.float64):
        flat = flat.astype(np.float32)
    return {
        "count": n, "nan": nan, "inf": inf,
        "min": float(flat.min()), "max": float(flat.max()), "mean": total / flat.size,
        "norm": float(math.sqrt(float(np.dot(flat, flat)))),
    }
