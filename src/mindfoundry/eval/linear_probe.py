"""A linear probe of an image encoder: how much of a labelled set's classes a logistic regression reads off its frozen
features, against the same probe on a randomly initialised encoder of the same shape (what pretraining added).

The labelled set is scikit-learn's handwritten digits (1,797 images of 8 x 8 pixels, 17 grey levels, shipped inside
scikit-learn, nothing downloaded), drawn at the encoder's image size (nearest neighbour: each pixel a square block)
in white on black, RGB. The split is fixed (a stratified 30% held out, seed 0) and the regression is scikit-learn's
``LogisticRegression`` on standardised features, so two encoders are compared on the same footing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mindfoundry.errors import MindFoundryError
from mindfoundry.model.vision_spec import pixel_values

#: Images per call of the feature function (bounded memory whatever the set's size).
BATCH = 64


class ProbeUnavailable(MindFoundryError, RuntimeError):
    """The probe needs scikit-learn (its data and its regression)."""


@dataclass(frozen=True)
class ProbeResult:
    accuracy: float  # on the held-out images
    train_images: int
    test_images: int


def digits_images(size: int) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as uint8 (n, size, size, 3) images and their labels (0-9)."""
    try:
        from sklearn.datasets import load_digits
    except ModuleNotFoundError:
        raise ProbeUnavailable("the digits probe needs scikit-learn: pip install 'mindfoundry[eval]'") from None
    from PIL import Image

    digits = load_digits()
    grey = (digits.images * (255 / 16)).round().astype(np.uint8)
    images = np.stack([np.asarray(Image.fromarray(g).resize((size, size), Image.Resampling.NEAREST).convert("RGB"))
                       for g in grey])
    return images, digits.target.astype(np.int64)


def encode(features: Callable[[np.ndarray], np.ndarray], images: np.ndarray) -> np.ndarray:
    """Each uint8 image's features, in batches of :data:`BATCH`."""
    return np.concatenate([features(pixel_values(images[i:i + BATCH])) for i in range(0, len(images), BATCH)])


def linear_probe(features: np.ndarray, labels: np.ndarray) -> ProbeResult:
    """Held-out accuracy of a logistic regression on standardised ``features`` (the fixed split of the module
    docstring)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x_train, x_test, y_train, y_test = train_test_split(features, labels, test_size=0.3, random_state=0,
                                                        stratify=labels)
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000))
    model.fit(x_train, y_train)
    return ProbeResult(float(model.score(x_test, y_test)), len(y_train), len(y_test))
