"""The report's contact sheet: the first images of each image source and split, as the trainers read them (the
pixel shard, after decode, checks, dedup and the square resize) with the caption each is paired with (the
WebDataset tar's ``.txt``, same order), so a reader sees what curation kept at a glance."""

from __future__ import annotations

import base64
import io
import tarfile
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from mindfoundry.data.dataset.image_samples import open_image_samples

#: Images shown per source and split, and the side each is drawn at (nearest-neighbour, so pixels stay pixels).
SHOWN, DRAWN = 24, 64


@dataclass(frozen=True)
class Tile:
    """One image as a base64 PNG and its caption (None for an image-only source)."""

    png: str
    caption: str | None


def contact_sheets(data_dir: Path, images: dict[str, Any]) -> list[tuple[str, str, list[Tile]]]:
    """(source, split, tiles) for every image source and split the manifest's ``images`` section lists."""
    sheets = []
    for split, section in images["splits"].items():
        samples = open_image_samples(data_dir, {"images": images}, split)  # the trainers' reader, its shape checks
        for entry, shard in zip(section["shards"], samples.pixels, strict=True):
            pixels = shard[:SHOWN]
            captions = _captions(data_dir / "images", entry["tars"], len(pixels))
            sheets.append((entry["source"], split, [Tile(_png(p), c) for p, c in zip(pixels, captions, strict=True)]))
    return sheets


def _captions(root: Path, tars: list[dict[str, Any]], count: int) -> list[str | None]:
    """The first ``count`` samples' captions, in tar order (None where a sample has none)."""
    found: dict[str, str | None] = {}
    for entry in tars:
        with tarfile.open(root / entry["path"]) as tar:
            for member in tar:
                key, _, ext = member.name.partition(".")
                if ext == "txt":
                    found[key] = tar.extractfile(member).read().decode("utf-8")
                else:
                    found.setdefault(key, None)
                if len(found) > count:
                    break
        if len(found) > count:
            break
    return list(islice(found.values(), count))


def _png(pixels: np.ndarray) -> str:
    out = io.BytesIO()
    Image.fromarray(np.asarray(pixels)).resize((DRAWN, DRAWN), Image.Resampling.NEAREST).save(out, "PNG")
    return base64.b64encode(out.getvalue()).decode("ascii")
