"""The masks of masked image modelling (``objective: mae``), computed in the data layer as functions of (seed,
sample position), as the text objective's masks are (:mod:`.masking`): both engines, every data-parallel layout and
every resume mask a sample alike. A sample's patches are sorted by their noise; the first ``kept``
(:attr:`mindfoundry.model.vision_spec.VisionSpec.kept`) are visible, the rest masked -- the rule of MAE and of
Hugging Face's ``ViTMAEForPreTraining``, which takes this noise as its ``noise`` argument.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np


def mae_noise(seed: int, positions: np.ndarray, num_patches: int) -> np.ndarray:
    """(len(positions), num_patches) float32 uniform noise, each row a function of (``seed``, that sample's
    position in the training order) alone."""
    rows = []
    for position in np.asarray(positions, dtype=np.int64).ravel():
        digest = hashlib.sha256(f"mae-mask:{seed}:{int(position)}".encode()).digest()
        rows.append(np.random.default_rng(int.from_bytes(digest[:8], "little")).random(num_patches))
    return np.asarray(rows, dtype=np.float32).reshape(len(rows), num_patches)


@dataclass(frozen=True)
class Mask:
    """A batch's mask: the visible patches (``keep``, B x kept, in noise order), where each patch lands back
    (``restore``, B x L) and the masked patches (``masked``, B x L float32, 1 = masked)."""

    keep: np.ndarray
    restore: np.ndarray
    masked: np.ndarray


def mask_from_noise(noise: np.ndarray, kept: int) -> Mask:
    """The mask of per-patch noise: the ``kept`` patches of least noise visible (a stable sort, as torch's argsort
    of distinct floats)."""
    shuffle = np.argsort(noise, axis=1, kind="stable")
    restore = np.argsort(shuffle, axis=1, kind="stable")
    masked = np.ones(noise.shape, np.float32)
    masked[:, :kept] = 0
    return Mask(shuffle[:, :kept].astype(np.int32), restore.astype(np.int32),
                np.take_along_axis(masked, restore, axis=1))


