"""scikit-learn's handwritten digits (1,797 images of 8 x 8 pixels, 17 grey levels, shipped inside scikit-learn,
nothing downloaded) as RGB images: the labelled set of the image encoders' linear probe
(:mod:`mindfoundry.eval.linear_probe`) and, its fitted part only, images of the demo corpus -- so the probe's
held-out images are never trained on. :func:`probe_split` is the one place that splits them.
"""

from __future__ import annotations

import numpy as np

from mindfoundry.errors import MindFoundryError

#: The digits' names, for captions.
NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


class DigitsUnavailable(MindFoundryError, RuntimeError):
    """scikit-learn (which ships the digits) is not installed."""


def digits_images(size: int) -> tuple[np.ndarray, np.ndarray]:
    """The digits as uint8 (1797, size, size, 3) images, white on black, resized bicubic, and their labels (0-9)."""
    try:
        from sklearn.datasets import load_digits
    except ModuleNotFoundError:
        raise DigitsUnavailable("the digits come with scikit-learn: pip install 'mindfoundry[eval]'") from None
    from PIL import Image

    digits = load_digits()
    grey = (digits.images * (255 / 16)).round().astype(np.uint8)
    images = np.stack([np.asarray(Image.fromarray(g).resize((size, size), Image.Resampling.BICUBIC).convert("RGB"))
                       for g in grey])
    return images, digits.target.astype(np.int64)


def probe_split(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The indices the probe may fit on and those it holds out (a stratified 30%, seed 0), each sorted."""
    from sklearn.model_selection import train_test_split

    fit, held_out = train_test_split(np.arange(len(labels)), test_size=0.3, random_state=0, stratify=labels)
    return np.sort(fit), np.sort(held_out)
