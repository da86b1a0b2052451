"""What an image is, as two numbers: its exact pixels (:func:`pixel_key`) and its look (:func:`perceptual_hash`).

The exact key is the sha256 of the decoded RGB pixels and their shape: two files with one image in them (a PNG and
its lossless WebP, the same file under two names) have one key, whatever their bytes. The perceptual hash is the
DCT hash (pHash: the 8x8 lowest frequencies of a 32x32 greyscale thumbnail, each bit "above the median") that a
resize, a re-encode, a small crop or a recolouring changes in few of its 64 bits, and another image in about half:
near copies are those within a Hamming distance (:func:`hamming`).
"""

from __future__ import annotations

import hashlib
from functools import cache

import numpy as np
from PIL import Image

#: The thumbnail side and the kept frequencies per axis (64 bits).
THUMB, LOW = 32, 8


def pixel_key(pixels: np.ndarray) -> int:
    """The exact identity of decoded pixels (uint64 from their sha256)."""
    digest = hashlib.sha256(np.asarray(pixels.shape, np.int64).tobytes() + np.ascontiguousarray(pixels).tobytes())
    return int.from_bytes(digest.digest()[:8], "little")


@cache
def _dct_matrix(n: int) -> np.ndarray:
    """The orthonormal DCT-II matrix of size ``n``."""
    k, i = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    matrix = np.cos(np.pi * (2 * i + 1) * k / (2 * n)) * np.sqrt(2 / n)
    matrix[0] /= np.sqrt(2)
    return matrix


def perceptual_hash(pixels: np.ndarray) -> int:
    """The 64-bit DCT hash of RGB pixels (see the module docstring), as an unsigned integer."""
    # reducing_gap: a large image is first shrunk by whole factors (box averages), then resampled: the same thumbnail
    # to within rounding, in a fraction of the time
    grey = Image.fromarray(pixels).convert("L").resize((THUMB, THUMB), Image.Resampling.LANCZOS, reducing_gap=2.0)
    dct = _dct_matrix(THUMB)
    low = (dct @ np.asarray(grey, dtype=np.float64) @ dct.T)[:LOW, :LOW].ravel()
    bits = low > np.median(low)
    return int(np.packbits(bits.astype(np.uint8), bitorder="little").view("<u8")[0])


def hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The number of differing bits of uint64 arrays ``a`` and ``b`` (element by element)."""
    x = np.atleast_1d(np.bitwise_xor(np.asarray(a, np.uint64), np.asarray(b, np.uint64)))
    counts = np.unpackbits(x.view(np.uint8).reshape(*x.shape, 8), axis=-1).sum(axis=-1)
    return counts.reshape(np.shape(np.bitwise_xor(np.asarray(a, np.uint64), np.asarray(b, np.uint64))))
