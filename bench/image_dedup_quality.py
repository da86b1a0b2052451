"""Near-duplicate removal on real images with labelled copies: precision and recall of `prepare`'s image dedup (the
same function its dedup stage runs), the rule chosen on one half of the images and measured on the other.

    .venv/bin/python bench/image_sources.py --fetch
    .venv/bin/python bench/image_dedup_quality.py

The images (bench/image_sources.py): one Noto emoji of each skin-tone group and the GIMP manual's figures, decoded
as `prepare` decodes them, exact duplicates among them (a figure used twice) kept once and, by a measure of their
own (the correlation of 16 x 16 thumbnails, above 0.9), images alike an earlier one left out: the originals are
distinct. Each image gets four copies, the kinds the issue names: resized (half, or double when small), re-encoded
(JPEG quality 50), cropped (3% off every side) and recoloured (brighter, less saturated). The images are cut in two
halves by a hash of their name: on the "rules" half every near_distance from 0 to 20 is tried and the largest whose
precision is at least 0.99 chosen; on the "held-out" half it is only measured.

A drop is correct when the image it was dropped for (the nearest earlier kept one) comes from the same original; recall
is the share of copies dropped correctly. The split: pairs of kept images within split_distance that land on both
sides, for `prepare`'s split by cluster and for a split of each image on its own."""

from __future__ import annotations

import argparse
import hashlib
import io
import time
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageEnhance

from image_sources import emoji, gimp_figures
from mindfoundry.data.images.clusters import copies_of, near_pairs, split_clusters
from mindfoundry.data.images.decode import ImageLimits, ImageRejected, decode
from mindfoundry.data.images.hashes import perceptual_hash, pixel_key

LIMITS = ImageLimits(min_side=16, max_aspect=4.0, max_pixels=40_000_000)


@dataclass
class Item:
    origin: int  # the original image it is (a copy of)
    kind: str  # "original", "resized", "reencoded", "cropped", "recoloured"
    key: int
    phash: int


def originals() -> list[tuple[str, np.ndarray]]:
    """(name, RGB pixels) of the originals: one emoji per group, every decodable GIMP figure, exact copies once."""
    found, seen = [], set()
    groups = set()
    for name, group, data in emoji():
        if group not in groups:
            groups.add(group)
            found.append((f"emoji/{name}", decode(data, LIMITS).pixels))
    for path in gimp_figures():
        try:
            found.append((f"gimp/{path.name}", decode(path.read_bytes(), LIMITS).pixels))
        except ImageRejected:
            continue
    unique = []
    for name, pixels in found:
        key = pixel_key(pixels)
        if key not in seen:
            seen.add(key)
            unique.append((name, pixels))
    return distinct(unique)


def thumbnail(pixels: np.ndarray, side: int = 16) -> np.ndarray:
    """The image at side x side (box filter), each colour channel centred and scaled to unit length: a measure of
    likeness independent of the perceptual hash (correlation, blind to brightness and contrast)."""
    t = np.asarray(Image.fromarray(pixels).resize((side, side), Image.Resampling.BOX), np.float64).reshape(-1, 3)
    t -= t.mean(axis=0)
    return (t / np.maximum(np.linalg.norm(t, axis=0), 1e-6)).reshape(-1)


def distinct(images: list[tuple[str, np.ndarray]], most_alike: float = 0.9) -> list[tuple[str, np.ndarray]]:
    """The images none of which is alike an earlier kept one (mean channel correlation of their thumbnails above
    ``most_alike``): the manual holds a dialog in several near-identical screenshots and the font an emoji in
    several near-identical forms, which are copies for any reader, not distinct originals to label."""
    thumbs = np.stack([thumbnail(p) for _, p in images])
    keep: list[int] = []
    for i in range(len(images)):
        if not keep or (thumbs[keep] @ thumbs[i]).max() / 3 <= most_alike:
            keep.append(i)
    return [images[i] for i in keep]


def copies(pixels: np.ndarray) -> dict[str, np.ndarray]:
    image = Image.fromarray(pixels)
    h, w = pixels.shape[:2]
    scale = 0.5 if min(h, w) >= 64 else 2.0
    out = io.BytesIO()
    image.save(out, "JPEG", quality=50)
    cut_h, cut_w = max(round(h * 0.03), 1), max(round(w * 0.03), 1)
    return {
        "resized": np.asarray(image.resize((max(int(w * scale), 1), max(int(h * scale), 1)),
                                           Image.Resampling.BICUBIC)),
        "reencoded": decode(out.getvalue(), LIMITS).pixels,
        "cropped": pixels[cut_h:h - cut_h, cut_w:w - cut_w],
        "recoloured": np.asarray(ImageEnhance.Color(ImageEnhance.Brightness(image).enhance(1.2)).enhance(0.7)),
    }


def items(images: list[tuple[str, np.ndarray]]) -> list[Item]:
    """The originals first (corpus order), then their copies."""
    out = [Item(i, "original", pixel_key(p), perceptual_hash(p)) for i, (_, p) in enumerate(images)]
    for i, (_, pixels) in enumerate(images):
        out += [Item(i, kind, pixel_key(c), perceptual_hash(c)) for kind, c in copies(pixels).items()]
    return out


def score(group: list[Item], distance: int) -> dict[str, float]:
    keys = np.array([it.key for it in group], np.uint64)
    hashes = np.array([it.phash for it in group], np.uint64)
    kept_by, _ = copies_of(keys, hashes, exact=True, near=True, near_distance=distance)
    dropped = np.flatnonzero(kept_by != np.arange(len(group)))
    correct = sum(group[i].origin == group[kept_by[i]].origin for i in dropped)
    copies_total = sum(it.kind != "original" for it in group)
    by_kind = {kind: float(np.mean([group[kept_by[i]].origin == group[i].origin and kept_by[i] != i
                                    for i in range(len(group)) if group[i].kind == kind]))
               for kind in ("resized", "reencoded", "cropped", "recoloured")}
    return {"precision": correct / len(dropped) if len(dropped) else 1.0, "recall": correct / copies_total,
            "dropped": int(len(dropped)), "wrong": int(len(dropped) - correct), **by_kind}


def leakage(group: list[Item], split_distance: int, near_distance: int, fraction: float = 0.1) -> dict[str, int]:
    """Pairs of kept images within ``split_distance`` on both sides: by cluster (prepare's rule) and per image."""
    keys = np.array([it.key for it in group], np.uint64)
    hashes = np.array([it.phash for it in group], np.uint64)
    kept_by, _ = copies_of(keys, hashes, exact=True, near=True, near_distance=near_distance)
    kept = np.flatnonzero(kept_by == np.arange(len(group)))
    first, second = near_pairs(hashes[kept], split_distance)

    def held_out(key: int) -> bool:
        return int.from_bytes(hashlib.sha256(key.to_bytes(8, "little")).digest()[:8], "little") / 2**64 < fraction

    cluster_side = {int(g): held_out(int(keys[g])) for g in set(split_clusters(hashes, kept, split_distance))}
    by_cluster = np.array([cluster_side[int(g)] for g in split_clusters(hashes, kept, split_distance)])
    per_image = np.array([held_out(int(keys[k])) for k in kept])
    return {"pairs": int(len(first)), "across_by_cluster": int((by_cluster[first] != by_cluster[second]).sum()),
            "across_per_image": int((per_image[first] != per_image[second]).sum())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split-distance", type=int, default=12)
    args = parser.parse_args()
    start = time.perf_counter()
    images = originals()
    halves = {"rules": [], "held_out": []}
    for name, pixels in images:
        half = "rules" if hashlib.sha256(name.encode()).digest()[0] % 2 == 0 else "held_out"
        halves[half].append((name, pixels))
    groups = {half: items(found) for half, found in halves.items()}
    print(f"{len(images)} originals ({sum(n.startswith('emoji/') for n, _ in images)} emoji, "
          f"{sum(n.startswith('gimp/') for n, _ in images)} GIMP figures), 4 copies each; "
          f"{time.perf_counter() - start:.0f} s to decode and hash")
    print("distance  rules: precision recall  held-out: precision recall")
    chosen = 0
    for distance in range(0, 21):
        rules, held = score(groups["rules"], distance), score(groups["held_out"], distance)
        print(f"{distance:8d}  {rules['precision']:16.4f} {rules['recall']:6.4f}  {held['precision']:18.4f} "
              f"{held['recall']:6.4f}")
        if rules["precision"] >= 0.99:
            chosen = distance
    result = score(groups["held_out"], chosen)
    print(f"chosen on the rules half: near_distance={chosen}")
    print("held-out half at it: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                                               for k, v in result.items()))
    print("split (held-out half, split_distance %d): %s" % (args.split_distance, leakage(
        groups["held_out"], args.split_distance, chosen)))


if __name__ == "__main__":
    main()
