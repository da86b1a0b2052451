"""The curated images of a prepared split as training samples: every image source's pixel shard (the square uint8
pixels ``prepare`` wrote, memory-mapped, never decoded again) as one indexed set, with each pair's caption token
ids, read by index.

A sample's index runs over the sources in manifest order, then each source's rows; a run maps global position ``p``
to an index through :class:`mindfoundry.data.dataset.packing.SampleOrder` (a seeded permutation per epoch,
:class:`mindfoundry.data.dataset.loader.OrderedSamples`), the text samples' rule, so a run resumes at any image
exactly and data-parallel ranks partition a global batch as they do for text. The masks of ``objective: mae`` are
the positions' (:mod:`mindfoundry.data.dataset.image_masking`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mindfoundry.data.dataset.indexed import IndexedDataset
from mindfoundry.data.dataset.prepared import DataError


@dataclass
class ImageSamples:
    """One split's images (see the module docstring): ``pixels[s]`` the (n_s, size, size, 3) uint8 shard of source
    ``sources[s]``, ``captions[s]`` its caption ids (None for an image-only source)."""

    sources: list[str]
    pixels: list[np.ndarray]
    captions: list[IndexedDataset | None]

    def __post_init__(self) -> None:
        self.starts = np.cumsum([0, *(len(p) for p in self.pixels)])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _rows(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) and (indices.min() < 0 or indices.max() >= len(self)):
            raise IndexError(f"image indices must lie in [0, {len(self)})")
        source = np.searchsorted(self.starts, indices, side="right") - 1
        return source, indices - self.starts[source]

    def get_pixels(self, indices: np.ndarray) -> np.ndarray:
        """(len(indices), size, size, 3) uint8: the images at ``indices``, in that order."""
        source, rows = self._rows(indices)
        return np.stack([self.pixels[s][r] for s, r in zip(source, rows, strict=True)])

    def get_batch(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the images at ``indices``, those indices): the trainers' sample reader
        (:class:`mindfoundry.data.dataset.loader.OrderedSamples` orders them as it orders token windows)."""
        indices = np.asarray(indices, dtype=np.int64)
        return self.get_pixels(indices), indices

    def get_captions(self, indices: np.ndarray) -> list[np.ndarray | None]:
        """Each image's caption token ids (None where its source has no captions)."""
        source, rows = self._rows(indices)
        return [None if self.captions[s] is None else np.asarray(self.captions[s][int(r)])
                for s, r in zip(source, rows, strict=True)]


def open_image_samples(root: Path, manifest: dict[str, Any], split: str) -> ImageSamples:
    """The image samples of ``split`` in the prepared folder ``root``; a pixel shard whose shape is not the one the
    manifest records is a :class:`DataError` naming it (`data validate` checks their sha256)."""
    images = manifest.get("images")
    if not images:
        raise DataError(f"'{root}' holds no images (no image source was prepared): add a source with modality "
                        "image or image_text and run `mindfoundry prepare`")
    size = images["settings"]["size"]
    sources, pixels, captions = [], [], []
    for entry in images["splits"][split]["shards"]:
        path = root / "images" / entry["pixels"]
        try:
            array = np.load(path, mmap_mode="r")
        except (OSError, ValueError) as exc:
            raise DataError(f"pixel shard '{path}' cannot be read ({exc}): re-run `mindfoundry prepare --overwrite`"
                            ) from None
        if array.dtype != np.uint8 or array.shape != (entry["images"], size, size, 3):
            raise DataError(f"pixel shard '{path}' is {array.dtype} {array.shape}, the manifest says uint8 "
                            f"({entry['images']}, {size}, {size}, 3): re-run `mindfoundry prepare --overwrite`")
        sources.append(entry["source"])
        pixels.append(array)
        captions.append(IndexedDataset(root / "images" / entry["captions"]["path"]) if "captions" in entry else None)
    return ImageSamples(sources, pixels, captions)
