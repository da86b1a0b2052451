"""The masks of masked image modelling (``objective: mae``), computed in the data layer as functions of (seed,
sample position), as the text objective's masks are (:mod:`.masking`): both engines, every data-parallel layout and
every resume mask a sample alike. A sample's patches are sorted by their noise; the first ``kept``
(:attr:`mindfoundry.model.vision_spec.VisionSpec.kept`) are visible, the rest masked -- the rule of MAE and of
Hugging Face's ``ViTMAEForPreTraining``, which takes this noise as its ``noise`` argument.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from mindfoundry.data.dataset.streams import TRAIN
from mindfoundry.model.vision_spec import pixel_values


def mae_noise(seed: int, positions: np.ndarray, num_patches: int, stream: int = TRAIN) -> np.ndarray:
    """(len(positions), num_patches) float32 uniform noise, each row drawn from ``PCG64([seed, stream, position])``
    (the text masks' generator): a function of the run's seed, the stream and that sample's position in it alone."""
    rows = [np.random.Generator(np.random.PCG64([seed, stream, position])).random(num_patches, dtype=np.float32)
            for position in np.asarray(positions, dtype=np.int64).ravel().tolist()]
    return np.asarray(rows, dtype=np.float32).reshape(len(rows), num_patches)


def mask_labels(noise: np.ndarray, kept: int) -> np.ndarray:
    """The labels of a batch under ``objective: mae``, int32 (N, kept + L): each row the ``kept`` visible patches (least
    noise first, a stable sort, as torch's argsort of distinct floats), then where each of the L patches lands in that
    order (a patch is masked when it lands at ``kept`` or later). The engines gather with them and sort nothing."""
    shuffle = np.argsort(noise, axis=1, kind="stable")
    restore = np.argsort(shuffle, axis=1, kind="stable")
    return np.concatenate([shuffle[:, :kept], restore], axis=1).astype(np.int32)


@dataclass(frozen=True)
class PatchMasking:
    """The masking of one stream of image samples (``objective: mae``): :meth:`apply` turns the uint8 pixel rows at
    some positions into the encoder's input and the rows' :func:`mask_labels`."""

    seed: int
    num_patches: int
    kept: int
    stream: int = TRAIN
    #: The label of a padding row: every patch lands before ``kept``, so none is masked and the row scores nothing.
    pad_label: int = 0

    def for_stream(self, stream: int) -> PatchMasking:
        return replace(self, stream=stream)

    def apply(self, pixels: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(pixel values float32 [N, 3, H, W], labels int32 [N, kept + L])`` for uint8 rows ``pixels`` [N, H, W, 3]
        at sample ``positions`` [N]."""
        noise = mae_noise(self.seed, positions, self.num_patches, self.stream)
        return pixel_values(pixels), mask_labels(noise, self.kept)

    def scored(self, labels: np.ndarray) -> int:
        """How many patches of these labels carry a loss (the masked ones)."""
        return int((labels[..., self.kept:] >= self.kept).sum())
