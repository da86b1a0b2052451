"""Near-duplicate removal on real images with labelled copies: precision and recall of `prepare`'s image dedup (the
same function its dedup stage runs), the rule chosen on one half of the images and measured on the other.

    .venv/bin/python bench/image_sources.py --fetch
    .venv/bin/python bench/image_dedup_quality.py

The images (bench/image_sources.py): one Noto emoji of each group (an emoji's skin-tone forms are one group, by
the font's own ligature table) and the GIMP manual's figures, decoded as `prepare` decodes them, exact duplicates
among them (a figure used twice) kept once and, by a measure of their own (the correlation of 16 x 16 thumbnails,
above 0.9; flat figures by their colour), images alike an earlier one left out: the originals are distinct. Each
image gets four copies, the kinds the issue names: resized (half, or double when small), re-encoded (JPEG quality
50), cropped (3% off every side) and recoloured (brighter, less saturated). The images are cut in two halves by a
hash of their name: on the "rules" half every pair of settings of `DISTANCES` x `LIKENESS` is tried and the one with
the largest recall whose precision is at least `CHOOSE_PRECISION` chosen; on the "held-out" half it is only
measured.

A drop is correct when the image it was dropped for (the most alike earlier kept one) comes from the same original;
recall is the share of copies dropped correctly. The split: pairs of kept images within split_distance that land
on both sides, for `prepare`'s split by cluster and for a split of each image on its own."""

from __future__ import annotations

import argparse
import hashlib
import io
import time
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageEnhance

from image_sources import emoji, gimp_figures
from mindfoundry.data.images.clusters import (
    Candidates,
    copies_of,
    first_copies,
    near_candidates,
    near_pairs,
    split_clusters,
)
from mindfoundry.data.images.decode import ImageLimits, ImageRejected, decode
from mindfoundry.data.images.hashes import fingerprint, pixel_key

LIMITS = ImageLimits(min_side=16, max_aspect=4.0, max_pixels=40_000_000)
#: The settings tried on the rules half: hash distances of the candidates and likeness thresholds.
DISTANCES = (6, 8, 10, 12)
LIKENESS = tuple(round(0.80 + 0.01 * i, 2) for i in range(20))
#: The precision the rules half must reach for a setting to be chosen: the target (0.99) plus a margin of about two
#: standard errors of a precision measured on ~6,000 drops whose errors come five at a time (an original and its
#: four copies dropped for a look-alike original).
CHOOSE_PRECISION = 0.995


@dataclass
class Item:
    origin: int  # the original image it is (a copy of)
    kind: str  # "original", "resized", "reencoded", "cropped", "recoloured"
    key: int
    hashes: tuple[int, ...]
    look: np.ndarray


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


def thumbnail(pixels: np.ndarray, side: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """The image at side x side (box filter): each colour channel centred and scaled to unit length (a measure of
    likeness independent of `prepare`'s: correlation, blind to brightness and contrast), and the channels' means."""
    t = np.asarray(Image.fromarray(pixels).resize((side, side), Image.Resampling.BOX), np.float64).reshape(-1, 3)
    mean = t.mean(axis=0)
    t -= mean
    return (t / np.maximum(np.linalg.norm(t, axis=0), 1e-6)).reshape(-1), mean


def distinct(images: list[tuple[str, np.ndarray]], most_alike: float = 0.9) -> list[tuple[str, np.ndarray]]:
    """The images none of which is alike an earlier kept one (mean channel correlation of their thumbnails above
    ``most_alike``, or, for two flat images, means within 8 of 255): the manual holds a dialog in several
    near-identical screenshots and blank figures, the font an emoji in several near-identical forms, which are
    copies for any reader, not distinct originals to label."""
    thumbs, means = zip(*(thumbnail(p) for _, p in images))
    thumbs, means = np.stack(thumbs), np.stack(means)
    flat = np.abs(thumbs).sum(axis=1) == 0
    keep: list[int] = []
    for i in range(len(images)):
        alike = (thumbs[keep] @ thumbs[i]) / 3 > most_alike
        if flat[i]:
            alike |= flat[keep] & (np.abs(means[keep] - means[i]).max(axis=1) <= 8)
        if not alike.any():
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
    def item(origin: int, kind: str, pixels: np.ndarray) -> Item:
        found = fingerprint(pixels)
        return Item(origin, kind, pixel_key(pixels), found.hashes, found.look)

    out = [item(i, "original", p) for i, (_, p) in enumerate(images)]
    for i, (_, pixels) in enumerate(images):
        out += [item(i, kind, c) for kind, c in copies(pixels).items()]
    return out


def candidates(group: list[Item], distance: int) -> Candidates:
    """The pairs `prepare`'s dedup judges among the images that are no exact copy (the function its stage runs),
    with their likeness."""
    hashes = np.array([it.hashes for it in group], np.uint64)
    looks = np.stack([it.look for it in group])
    exact = exact_twins(group)
    return near_candidates(hashes, looks.__getitem__, distance, among=np.flatnonzero(exact == np.arange(len(group))))


def exact_twins(group: list[Item]) -> np.ndarray:
    return first_copies(np.array([it.key for it in group], np.uint64))


def kept_by_of(group: list[Item], near: Candidates, alike: float) -> np.ndarray:
    """What `prepare`'s dedup decides for the images at likeness ``alike`` (the function its stage runs)."""
    return copies_of(exact_twins(group), near, alike).kept_by


def score(group: list[Item], near: Candidates, alike: float) -> dict[str, float]:
    kept_by = kept_by_of(group, near, alike)
    dropped = np.flatnonzero(kept_by != np.arange(len(group)))
    correct = sum(group[i].origin == group[kept_by[i]].origin for i in dropped)
    copies_total = sum(it.kind != "original" for it in group)
    by_kind = {kind: float(np.mean([group[kept_by[i]].origin == group[i].origin and kept_by[i] != i
                                    for i in range(len(group)) if group[i].kind == kind]))
               for kind in ("resized", "reencoded", "cropped", "recoloured")}
    return {"precision": correct / len(dropped) if len(dropped) else 1.0, "recall": correct / copies_total,
            "dropped": int(len(dropped)), "wrong": int(len(dropped) - correct), **by_kind}


def leakage(group: list[Item], near: Candidates, alike: float, split_distance: int,
            fraction: float = 0.1) -> dict[str, int]:
    """Pairs of kept images within ``split_distance`` on both sides: by cluster (prepare's rule) and per image."""
    keys = np.array([it.key for it in group], np.uint64)
    hashes = np.array([it.hashes[0] for it in group], np.uint64)
    kept_by = kept_by_of(group, near, alike)
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
    print("near_distance near_likeness  rules: precision recall  held-out: precision recall")
    best = (-1.0, 0, 0.0)
    found = {}
    for distance in DISTANCES:
        found[distance] = {half: candidates(group, distance) for half, group in groups.items()}
        for alike in LIKENESS:
            rules = score(groups["rules"], found[distance]["rules"], alike)
            held = score(groups["held_out"], found[distance]["held_out"], alike)
            print(f"{distance:13d} {alike:13.2f}  {rules['precision']:16.4f} {rules['recall']:6.4f}  "
                  f"{held['precision']:18.4f} {held['recall']:6.4f}")
            if rules["precision"] >= CHOOSE_PRECISION and rules["recall"] > best[0]:
                best = (rules["recall"], distance, alike)
    _, distance, alike = best
    result = score(groups["held_out"], found[distance]["held_out"], alike)
    print(f"chosen on the rules half: near_distance={distance}, near_likeness={alike:.2f}")
    print("held-out half at it: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                                               for k, v in result.items()))
    print("split (held-out half, split_distance %d): %s" % (args.split_distance, leakage(
        groups["held_out"], found[distance]["held_out"], alike, args.split_distance)))

if __name__ == "__main__":
    main()
