"""A split's image-text pairs as the captioner (``objective: caption``) reads them: each image's pixel values and its
caption's token ids, ended with EOS and cut or filled to ``train.seq_len`` with IGNORE_INDEX (so the labels say which
positions carry a loss; the engines feed PAD where they hold IGNORE_INDEX). Images of sources without captions are
left out. ``shuffled`` pairs each caption with another sample's image (a fixed derangement): the held-out loss with
the true images against it says how much the captioner reads the image.
"""

from __future__ import annotations

import numpy as np
from tokenizers import Tokenizer

from mindfoundry.data.dataset.image_samples import ImageSamples
from mindfoundry.data.dataset.packing import IGNORE_INDEX
from mindfoundry.data.dataset.prepared import DataError
from mindfoundry.data.tokenizer import eos_id
from mindfoundry.model.vision_spec import pixel_values


class CaptionSamples:
    """``get_batch(indices)`` -> (pixel values float32 [N, 3, H, W], labels int32 [N, seq_len]) of the captioned
    images (see the module docstring)."""

    def __init__(self, images: ImageSamples, seq_len: int, tokenizer: Tokenizer, shuffled: bool = False) -> None:
        self.images, self.seq_len, self.tokenizer, self.shuffled = images, seq_len, tokenizer, shuffled
        self.eos = eos_id(tokenizer)
        rows = [np.arange(images.starts[s], images.starts[s + 1]) for s, c in enumerate(images.captions) if c]
        self.rows = np.concatenate(rows) if rows else np.zeros(0, np.int64)  # the images with a caption
        if not len(self.rows) and len(images):
            raise DataError(f"no image of sources {images.sources} has a caption: model.objective=caption needs a "
                            "source with modality: image_text")

    def __len__(self) -> int:
        return len(self.rows)

    def with_shuffled_images(self) -> CaptionSamples:
        """The same captions, each with another sample's image."""
        return CaptionSamples(self.images, self.seq_len, self.tokenizer, shuffled=True)

    def labels(self, indices: np.ndarray) -> np.ndarray:
        """int32 [N, seq_len]: each caption's ids, EOS, then IGNORE_INDEX (cut at seq_len)."""
        out = np.full((len(indices), self.seq_len), IGNORE_INDEX, np.int32)
        for row, caption in enumerate(self.images.get_captions(self.rows[np.asarray(indices, np.int64)])):
            ids = np.append(np.asarray(caption, np.int64), self.eos)[:self.seq_len]
            out[row, :len(ids)] = ids
        return out

    def get_batch(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        indices = np.asarray(indices, np.int64)
        shown = (indices + len(self) // 2) % len(self) if self.shuffled else indices  # half the split away
        return pixel_values(self.images.get_pixels(self.rows[shown])), self.labels(indices)

    def bytes_per_token(self) -> float:
        """UTF-8 bytes per token of the captions (EOS counted as a token, as the text splits count it)."""
        captions = self.images.get_captions(self.rows)
        size = sum(len(self.tokenizer.decode(np.asarray(c).tolist()).encode("utf-8")) for c in captions)
        return size / max(sum(len(c) + 1 for c in captions), 1)
