"""A few-shot linear probe of an image encoder: how much of a labelled set's classes a logistic regression reads off
its frozen features when it is shown a few labelled images per class (the low-label regime self-supervision is for),
against the same probe on a randomly initialised encoder of the same shape (what pretraining added).

The labelled set is scikit-learn's handwritten digits (:mod:`mindfoundry.data.images.digits`: 1,797 images,
shipped inside scikit-learn, nothing downloaded), drawn at the encoder's image size. The split is fixed (a stratified
30% held out, seed 0: :func:`mindfoundry.data.images.digits.probe_split`); the regression, scikit-learn's
``LogisticRegression`` on standardised features, is fitted on the first :data:`PER_CLASS` images of each class of
the other 70%, so two encoders are compared on the same footing. (Fitted on all 1,257 images, a random encoder's
features already reach 0.90-0.94 on these digits, which leaves little to compare; with 10 per class it is 0.68.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mindfoundry.data.images.digits import probe_split
from mindfoundry.model.vision_spec import pixel_values

#: Images per call of the feature function (bounded memory whatever the set's size).
BATCH = 64
#: Labelled images per class the probe is fitted on.
PER_CLASS = 10


@dataclass(frozen=True)
class ProbeResult:
    accuracy: float  # on the held-out images
    train_images: int
    test_images: int


def encode(features: Callable[[np.ndarray], np.ndarray], images: np.ndarray) -> np.ndarray:
    """Each uint8 image's features, in batches of :data:`BATCH`."""
    return np.concatenate([features(pixel_values(images[i:i + BATCH])) for i in range(0, len(images), BATCH)])


def linear_probe(features: np.ndarray, labels: np.ndarray) -> ProbeResult:
    """Held-out accuracy of a logistic regression on standardised ``features``, fitted on :data:`PER_CLASS` images of
    each class (:func:`probe_split`)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    fit, held_out = probe_split(labels)
    fit = np.concatenate([fit[labels[fit] == c][:PER_CLASS] for c in np.unique(labels)])
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000))
    model.fit(features[fit], labels[fit])
    return ProbeResult(float(model.score(features[held_out], labels[held_out])), len(fit), len(held_out))
