"""How alike two images look: what decides whether two images whose hashes are near are copies.

A 64-bit hash within a few bits finds copies, but not only copies: hearts of two colours, two skin tones of one
emoji, two screenshots of one dialog hash alike, and a recoloured copy hashes farther than they do. So every image
keeps a *look* (:func:`look`, 1,536 bytes: its luma at 32 x 32 and its two chroma channels at 16 x 16), and a pair
found by its hashes is a copy when their looks agree (:func:`likeness`):

- in luma, up to brightness and contrast (the share of one's centred luma explained by the other's, scaled);
- in colour, up to saturation (the same for the chroma around grey, not centred: a hue is kept, a strength may
  change), so a paler copy agrees and a heart of another colour does not;
- each up to a noise floor (:data:`NOISE`), so that two flat images (luma) or two grey ones (colour) agree;
- after a crop: the centre of one (:data:`CROPS`) against the whole of the other, both ways, the best taken.

The likeness is in [0, 1]: the lesser of the luma and colour agreements at the best crop.
"""

from __future__ import annotations

from functools import cache

import numpy as np
from PIL import Image

#: The look's sides: luma, then each chroma channel.
LUMA, CHROMA = 32, 16
LOOK_BYTES = LUMA * LUMA + 2 * CHROMA * CHROMA
#: The sides compared (a centre of the look resampled to them).
VIEW_LUMA, VIEW_CHROMA = 24, 12
#: The centres of one image tried against the other's whole (share of each side kept).
CROPS = (1.0, 0.97, 0.94, 0.91, 0.88)
#: The noise per sample, in 0-255 units, under which two looks agree anyway: JPEG's and rounding's.
NOISE = 4.0


def look(image: Image.Image) -> np.ndarray:
    """The look of an RGB image (see the module docstring): ``LOOK_BYTES`` uint8."""
    ycc = image.convert("YCbCr")
    parts = [ycc.getchannel(0).resize((LUMA, LUMA), Image.Resampling.BOX)]
    parts += [ycc.getchannel(c).resize((CHROMA, CHROMA), Image.Resampling.BOX) for c in (1, 2)]
    return np.concatenate([np.asarray(p, dtype=np.uint8).ravel() for p in parts])


@cache
def _crop_matrix(side: int, out: int, keep: float) -> np.ndarray:
    """The (out x side) averaging matrix that resamples the centre ``keep`` of ``side`` samples to ``out``: each
    output sample the mean of the input it covers, fractions of a sample weighted by their share."""
    low = side * (1 - keep) / 2
    step = (side - 2 * low) / out
    starts = low + step * np.arange(out)
    pixel = np.arange(side)
    overlap = np.clip(np.minimum(starts[:, None] + step, pixel + 1) - np.maximum(starts[:, None], pixel), 0, None)
    return (overlap / step).astype(np.float32)


def _views(looks: np.ndarray, side: int, out: int, offset: int, channels: int) -> np.ndarray:
    """(n, crops, channels * out * out): each look's channels at every centre of :data:`CROPS`."""
    planes = looks[:, offset:offset + channels * side * side].reshape(len(looks), channels, side, side)
    planes = planes.astype(np.float32)
    views = [_crop_matrix(side, out, keep) @ planes @ _crop_matrix(side, out, keep).T for keep in CROPS]
    return np.stack(views, axis=1).reshape(len(looks), len(CROPS), -1)


def _agreement(x: np.ndarray, y: np.ndarray, floor: float) -> np.ndarray:
    """Row by row, how much of each of ``x`` and ``y`` the other explains scaled (never negatively), above a noise
    ``floor`` of squared length: the lesser of the two ways, in [0, 1]."""
    dot = np.maximum((x * y).sum(axis=-1), 0.0)
    xx, yy = (x * x).sum(axis=-1), (y * y).sum(axis=-1)
    x_by_y = 1 - (xx - dot * dot / np.maximum(yy, 1e-9)) / (xx + floor)
    y_by_x = 1 - (yy - dot * dot / np.maximum(xx, 1e-9)) / (yy + floor)
    return np.clip(np.minimum(x_by_y, y_by_x), 0.0, 1.0)


def likeness(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Row by row, how alike the looks ``first`` and ``second`` (n x LOOK_BYTES uint8) are (module docstring)."""
    if len(first) == 0:
        return np.zeros(0, np.float64)
    luma = [_views(looks, LUMA, VIEW_LUMA, 0, 1) for looks in (first, second)]
    luma = [v - v.mean(axis=-1, keepdims=True) for v in luma]
    chroma = [_views(looks, CHROMA, VIEW_CHROMA, LUMA * LUMA, 2) - 128.0 for looks in (first, second)]
    luma_floor, chroma_floor = VIEW_LUMA ** 2 * NOISE ** 2, 2 * VIEW_CHROMA ** 2 * NOISE ** 2
    best = np.zeros(len(first), np.float64)
    for crop in range(len(CROPS)):
        for a, b in ((0, 1), (1, 0)):  # the centre of one against the whole of the other
            alike = np.minimum(_agreement(luma[a][:, crop], luma[b][:, 0], luma_floor),
                               _agreement(chroma[a][:, crop], chroma[b][:, 0], chroma_floor))
            best = np.maximum(best, alike)
    return best
