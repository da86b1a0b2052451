"""Images per second per core of `prepare`'s image read stage (decode, checks, exact key, perceptual hashes and
look, the square pixels, the stored bytes, the captions through the text cleaner) beside a plain PIL loop doing the
same per-image work, and peak memory of the image stages at 1x, 4x and 8x the images.

    .venv/bin/python bench/image_sources.py --fetch
    .venv/bin/python bench/image_throughput.py [--images 2000]

The images: the GIMP manual's figures and Noto emoji (bench/image_sources.py), written as files with sidecar captions;
the larger corpora repeat them under other names. Figures from the manifest's own timings (task CPU seconds, the
peak RSS of the processes that ran each stage).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml
from PIL import Image, ImageOps

from image_sources import emoji, gimp_figures

SIZE = 64


def corpus(folder: Path, count: int, repeat: int) -> int:
    """``count`` images (GIMP figures, then emoji) written ``repeat`` times under other names, each with a caption;
    how many files."""
    folder.mkdir(parents=True)
    blobs = [(p.stem, p.read_bytes(), p.suffix) for p in gimp_figures()]
    blobs += [(name, data, ".png") for name, _, data in emoji()]
    blobs = blobs[:count]
    for copy in range(repeat):
        for i, (name, data, suffix) in enumerate(blobs):
            stem = f"{copy:02d}-{i:05d}"
            (folder / f"{stem}{suffix}").write_bytes(data)
            (folder / f"{stem}.txt").write_text(f"the figure {name.replace('-', ' ')}")
    return len(blobs) * repeat


def plain_loop(folder: Path) -> tuple[int, float]:
    """The same per-image work written plainly with PIL and numpy: decode, upright, RGB on white, size checks, the
    square resize, sha256 of the pixels, the 64-bit DCT hashes of the whole image and two centres, the look (luma
    and chroma thumbnails); (images, CPU seconds)."""
    n, k = 32, np.arange(32)
    dct = np.cos(np.pi * (2 * k[None, :] + 1) * k[:, None] / (2 * n)) * np.sqrt(2 / n)
    dct[0] /= np.sqrt(2)
    start, count = time.process_time(), 0
    for path in sorted(folder.glob("*")):
        if path.suffix == ".txt":
            continue
        image = ImageOps.exif_transpose(Image.open(io.BytesIO(path.read_bytes())))
        if image.mode in ("RGBA", "LA", "P"):
            rgba = image.convert("RGBA")
            image = Image.alpha_composite(Image.new("RGBA", rgba.size, "white"), rgba)
        pixels = np.asarray(image.convert("RGB"))
        h, w = pixels.shape[:2]
        if min(h, w) < 16 or max(h, w) > 4 * min(h, w):
            continue
        scale = SIZE / min(h, w)
        small = Image.fromarray(pixels).resize((max(SIZE, round(w * scale)), max(SIZE, round(h * scale))),
                                               Image.Resampling.BICUBIC)
        np.asarray(small.crop(((small.width - SIZE) // 2, (small.height - SIZE) // 2,
                               (small.width + SIZE) // 2, (small.height + SIZE) // 2)))
        hashlib.sha256(pixels.tobytes()).digest()
        full, grey = Image.fromarray(pixels), Image.fromarray(pixels).convert("L")
        for keep in (1.0, 0.94, 0.88):  # the whole image's and two centres' DCT hashes
            cut_w, cut_h = w * (1 - keep) / 2, h * (1 - keep) / 2
            thumb = grey.resize((32, 32), Image.Resampling.LANCZOS, box=(cut_w, cut_h, w - cut_w, h - cut_h))
            low = (dct @ np.asarray(thumb, float) @ dct.T)[:8, :8].ravel()
            np.packbits(low > np.median(low))
        ycc = full.convert("YCbCr")  # the look: luma at 32 x 32, chroma at 16 x 16
        np.concatenate([np.asarray(ycc.getchannel(c).resize((side, side), Image.Resampling.BOX)).ravel()
                        for c, side in ((0, 32), (1, 16), (2, 16))])
        count += 1
    return count, time.process_time() - start


def prepare(folder: Path, run: Path) -> dict:
    """`mindfoundry prepare` of the folder as one image_text source (two worker processes: each stage's peak memory
    is its tasks' own); its manifest."""
    from mindfoundry.cli.main import main

    config = run.parent / f"{run.name}.yaml"
    config.write_text(yaml.safe_dump({
        "name": run.name, "run_dir": str(run), "model": {"vocab_size": 512, "d_model": 32, "n_layers": 1, "n_heads": 2,
                                                         "max_seq_len": 64},
        "data": {"sources": [{"name": "figures", "paths": [str(folder)], "modality": "image_text"}],
                 "images": {"size": SIZE}, "workers": 2},
        "train": {"steps": 1, "seq_len": 32, "micro_batch_size": 1}, "optim": {"warmup_steps": 0}}))
    if main(["prepare", str(config)]) != 0:
        sys.exit("prepare failed")
    import json

    return json.loads((run / "data" / "manifest.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--repeats", type=int, nargs="+", default=[1, 4, 8], help="corpus sizes, in copies of it")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="image-throughput-"))
    try:
        for repeat in args.repeats:
            folder = root / f"x{repeat}"
            files = corpus(folder, args.images, repeat)
            manifest = prepare(folder, root / f"run{repeat}")
            stages = manifest["timings"]["stages"]
            read = stages["image_read"]
            line = (f"{repeat}x: {files} images; image_read {files / read['cpu_s']:.0f} images/s per core "
                    f"(peak RSS {read['peak_rss_mib']} MiB), image_dedup peak RSS "
                    f"{stages['image_dedup']['peak_rss_mib']} MiB, image_shards peak RSS "
                    f"{stages['image_shards']['peak_rss_mib']} MiB")
            if repeat == args.repeats[0]:
                count, cpu = plain_loop(folder)
                line += f"; plain PIL loop {count / cpu:.0f} images/s per core"
            print(line, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
