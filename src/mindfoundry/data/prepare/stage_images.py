"""The image stages of `prepare`: image sources (``modality: image_text`` or ``image``) read, judged, deduplicated,
split by near-duplicate cluster and written as shards, staged and resumable like the text stages.

1. :class:`ImageReadStage`, a task per image read task: every sample of its files decoded once
   (:mod:`mindfoundry.data.images.decode`), judged (decode check, size, aspect, bomb limit, caption), hashed (exact
   pixel key, perceptual hashes and look) and kept as: the square uint8 pixels the trainers read (``pixels.u8``),
   the bytes a WebDataset sample holds (the file's own bytes when any reader decodes them to these pixels, else a
   PNG of them), the captions and where each sample came from; a drop-log line for every sample it does not keep.
2. :class:`ImageDedupStage`, one task over every kept image, in corpus order: exact copies (equal pixels) and near
   copies (perceptual hashes within ``near_distance`` and looks ``near_likeness`` alike,
   :mod:`mindfoundry.data.images.clusters`) dropped, the first copy kept; the rest clustered within
   ``split_distance`` and each cluster sent to one side of the split by a keyed hash of its first image (variants of
   an image never land on both sides).
3. :class:`ImageShardStage`, a task per (image source, split), after the tokenizer (which learns from the training
   captions too): the curated WebDataset tars in img2dataset's layout, the pixel shard (``.npy``, n x size x size x
   3) and, for pairs, the captions' token ids as a Megatron shard in the same order.
"""

from __future__ import annotations

import hashlib
import heapq
import io
import json
import struct
import tarfile
import unicodedata
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from mindfoundry.config.data_config import DataConfig, SourceConfig
from mindfoundry.data.clean.curate import clean_chunk, clean_profile, clean_settings
from mindfoundry.data.clean.droplog import read_numbered, write_numbered
from mindfoundry.data.clean.profiles import CleaningPipeline, build_pipeline
from mindfoundry.data.dataset.indexed import dtype_for_vocab
from mindfoundry.data.dataset.prepared import SPLITS
from mindfoundry.data.dataset.shard_writer import IndexedDatasetWriter
from mindfoundry.data.document import Document
from mindfoundry.data.execute.stage import Stage
from mindfoundry.data.execute.workdir import WorkDir
from mindfoundry.data.images.clusters import copies_of, first_copies, near_candidates, split_clusters
from mindfoundry.data.images.decode import ImageLimits, ImageRejected, decode, square
from mindfoundry.data.images.hashes import HASH_CROPS, fingerprint, pixel_key
from mindfoundry.data.images.likeness import LOOK_BYTES
from mindfoundry.data.images.sources import ImageSample, image_samples
from mindfoundry.data.ingest.files import SourceStats
from mindfoundry.data.ingest.listing import FileLedger
from mindfoundry.data.prepare.corpus import IMAGE_DEDUP, IMAGE_READ, IMAGE_SHARDS, Corpus
from mindfoundry.data.prepare.results import ImageDedupResult, ImageReadResult, ImageShardResult
from mindfoundry.data.tokenizer import encode_batch, worker_tokenizer
from mindfoundry.storage.commit import sha256_file
from mindfoundry.storage.resolve import locate

PIXELS, STORED, STORED_INDEX, META, KEYS, HASHES, LOOKS, EVENTS = (
    "pixels.u8", "stored.bin", "stored.idx.npy", "meta.jsonl", "keys.npy", "phash.npy", "looks.u8", "events.jsonl")
#: Samples per WebDataset tar (img2dataset's default).
TAR_SAMPLES = 10_000
#: The split decision of each kept image of a read task: dropped by dedup, or the side it is on.
DROPPED, TRAIN, VALIDATION = 0, 1, 2


def drop_line(sample_key: str, path: str, record: int, source: str, reason: str, detail: str,
              caption: str | None, **extra: Any) -> dict[str, Any]:
    """The drop-log line of an image: block ``image``, the reason and what was found."""
    return {"source": source, "path": path, "record": record, "block": "image", "reason": reason, "action": "drop",
            "value": None, "threshold": None, "excerpt": detail[:200], "key": sample_key,
            "chars": len(caption or ""), **extra}


#: The text cleaner's blocks that judge a caption: what a short text can be judged by (length, repetition and quality
#: rules are for documents).
CAPTION_SECTIONS = ("mojibake", "control_chars", "nfkc", "junk", "language")


def caption_pipeline(data: DataConfig, src: SourceConfig) -> CleaningPipeline:
    """The blocks a source's captions go through (its settings, the prose profile; none when cleaning is off), each
    keeping a drop-log line of what it drops or edits."""
    profile = "none" if clean_profile(data, src) == "none" else "prose"
    pipeline = build_pipeline(clean_settings(data, src), profile, sections=CAPTION_SECTIONS)
    for block in pipeline.blocks:
        block.log_events = True
    return pipeline


def clean_caption(text: str | None) -> str | None:
    """A caption as it is kept: NFC, every run of white space one space, trimmed."""
    return None if text is None else " ".join(unicodedata.normalize("NFC", text).split())


class ImageReadStage(Stage[ImageReadResult]):
    """Decode, judge, hash and store each sample of one image read task (see the module docstring)."""

    name, result_type = IMAGE_READ, ImageReadResult

    def __init__(self, work: WorkDir, corpus: Corpus) -> None:
        super().__init__(work)
        self.corpus = corpus

    def tasks(self) -> int:
        return len(self.corpus.images)

    def run(self, task: int, out: Path) -> ImageReadResult:
        images, storage = self.corpus.data.images, self.corpus.storage
        listed, src = self.corpus.images[task], self.corpus.image_source(task)
        limits = ImageLimits(images.min_side, images.max_aspect, images.max_pixels)
        stats = SourceStats(ledger=FileLedger())
        for path, size, version in listed.files:
            stats.ledger.expect(locate(path, storage), size, version)
        files = [locate(path, storage) for path, _, _ in listed.files]
        captions = caption_pipeline(self.corpus.data, src)
        reasons: Counter[str] = Counter()
        keys, hashes, offsets, lines = [], [], [0], []
        read = 0
        with open(out / PIXELS, "wb") as pixels, open(out / STORED, "wb") as stored, \
                open(out / LOOKS, "wb") as looks, open(out / META, "w", encoding="utf-8") as meta:
            for ordinal, sample in enumerate(image_samples(files, locate(listed.root, storage), src, stats)):
                read += 1
                caption = clean_caption(sample.caption)
                if sample.problem is None and caption is not None:
                    caption, events = self._judged(captions, caption, sample, src, ordinal)
                    lines.extend(events)
                    if caption is None:
                        reasons[f"caption_{events[-1][1]['block']}"] += 1
                        continue
                try:
                    if sample.problem is not None:
                        raise ImageRejected(*sample.problem)
                    if caption is not None and len(caption) > images.caption_max_chars:
                        raise ImageRejected("caption_too_long", f"{len(caption):,} characters > caption_max_chars "
                                            f"{images.caption_max_chars:,}: {caption[:100]}")
                    decoded = decode(sample.data, limits)
                except ImageRejected as rejected:
                    reasons[rejected.reason] += 1
                    lines.append((ordinal, drop_line(sample.key, sample.path, sample.record, src.name,
                                                     rejected.reason, rejected.detail, caption)))
                    continue
                pixels.write(square(decoded.pixels, images.size).tobytes())
                kept_bytes = sample.data if decoded.plain and decoded.format in ("JPEG", "PNG", "WEBP") else _png(
                    decoded.pixels)
                stored.write(kept_bytes)
                offsets.append(offsets[-1] + len(kept_bytes))
                keys.append(pixel_key(decoded.pixels))
                found = fingerprint(decoded.pixels)
                hashes.append(found.hashes)
                looks.write(found.look.tobytes())
                height, width = decoded.pixels.shape[:2]
                meta.write(json.dumps({"key": sample.key, "caption": caption, "path": sample.path,
                                       "record": sample.record, "ordinal": ordinal, "width": width, "height": height,
                                       "ext": _extension(kept_bytes)}, ensure_ascii=False) + "\n")
        np.save(out / KEYS, np.array(keys, dtype=np.uint64))
        np.save(out / HASHES, np.array(hashes, dtype=np.uint64).reshape(-1, len(HASH_CROPS)))
        np.save(out / STORED_INDEX, np.array(offsets, dtype=np.int64))
        write_numbered(out / EVENTS, lines)
        return ImageReadResult(documents=read, read=read, kept=len(keys), reasons=dict(reasons),
                               stored_bytes=offsets[-1])

    @staticmethod
    def _judged(pipeline: CleaningPipeline, caption: str, sample: ImageSample, src: SourceConfig,
                ordinal: int) -> tuple[str | None, list[tuple[int, dict[str, Any]]]]:
        """The caption as the text cleaner leaves it (None: dropped, the pair with it) and its drop-log lines."""
        doc = Document(text=caption, id=sample.key, source=src.name, category=src.resolved_category(),
                       path=sample.path, record=sample.record)
        kept, events = clean_chunk(pipeline, [(ordinal, doc)])
        return (kept[0][1].text if kept else None), events


def _png(pixels: np.ndarray) -> bytes:
    """Pixels as a PNG, compressed fast (the tars are for reading; level 1 takes a fifth of the default's time)."""
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG", compress_level=1)
    return out.getvalue()


def _extension(data: bytes) -> str:
    """The file extension a WebDataset member of these bytes takes (img2dataset's: jpg, png, webp)."""
    return "jpg" if data[:3] == b"\xff\xd8\xff" else "webp" if data[8:12] == b"WEBP" else "png"


class ImageDedupStage(Stage[ImageDedupResult]):
    """Exact and near copies across every image read task, and the split by cluster (see the module docstring)."""

    name, result_type = IMAGE_DEDUP, ImageDedupResult

    def __init__(self, work: WorkDir, corpus: Corpus, seed: int) -> None:
        super().__init__(work)
        self.corpus, self.seed = corpus, seed

    def tasks(self) -> int:
        return 1

    def run(self, task: int, out: Path) -> ImageDedupResult:
        settings = self.corpus.data.images
        reads = [self.work.task(IMAGE_READ, t) for t in range(len(self.corpus.images))]
        keys = [np.load(folder / KEYS) for folder in reads]
        sizes = [len(k) for k in keys]
        every_key = np.concatenate(keys) if keys else np.zeros(0, np.uint64)
        hashes = (np.concatenate([np.load(folder / HASHES) for folder in reads]) if reads
                  else np.zeros((0, len(HASH_CROPS)), np.uint64))
        count = len(every_key)
        starts = np.cumsum([0, *sizes])
        exact = first_copies(every_key) if settings.exact else np.arange(count)
        near = (near_candidates(hashes, _Looks(reads, starts), settings.near_distance,
                                among=np.flatnonzero(exact == np.arange(count))) if settings.near else None)
        copies = copies_of(exact, near, settings.near_likeness)
        kept_by = copies.kept_by
        kept = np.flatnonzero(kept_by == np.arange(count))
        groups = split_clusters(hashes[:, 0], kept, settings.split_distance)
        sides = np.full(count, DROPPED, dtype=np.int8)
        sides[kept] = [VALIDATION if self._held_out(int(every_key[g])) else TRAIN for g in groups]
        dropped = np.flatnonzero(kept_by != np.arange(count))
        metas = _some_metas(reads, starts, np.concatenate([dropped, kept_by[dropped]]))
        removed: Counter[str] = Counter()  # by kind: exact, near
        by_source: Counter[str] = Counter()
        for t, folder in enumerate(reads):
            low, high = starts[t], starts[t + 1]
            np.save(out / f"sides-{t:06d}.npy", sides[low:high])
            lines = []
            for row in np.flatnonzero(kept_by[low:high] != np.arange(low, high)):
                twin = int(kept_by[low + row])
                kind = "near" if copies.bits[low + row] >= 0 else "exact"
                removed[kind] += 1
                by_source[self.corpus.image_source(t).name] += 1
                lines.append(self._line(metas, starts, t, int(row), twin, kind, float(copies.likeness[low + row]),
                                        int(copies.bits[low + row])))
            write_numbered(out / f"{EVENTS}-{t:06d}", lines)
        clusters = len(set(groups.tolist()))
        return ImageDedupResult(documents=count, kept=len(kept), exact=removed["exact"], near=removed["near"],
                                clusters=clusters, validation=int((sides == VALIDATION).sum()),
                                removed_by_source=dict(by_source))

    def _held_out(self, key: int) -> bool:
        """Whether the cluster whose first image has pixel key ``key`` is held out (a keyed hash of the key)."""
        digest = hashlib.sha256(struct.pack("<QQ", self.seed & (2**64 - 1), key)).digest()
        return int.from_bytes(digest[:8], "little") / 2**64 < self.corpus.data.validation_fraction

    def _line(self, metas: dict[int, dict[str, Any]], starts: np.ndarray, task: int, row: int, twin: int, kind: str,
              alike: float, bits: int) -> tuple[int, dict[str, Any]]:
        meta, other = metas[int(starts[task]) + row], metas[twin]
        twin_task = int(np.searchsorted(starts, twin, side="right") - 1)
        src = self.corpus.image_source(task).name
        line = drop_line(meta["key"], meta["path"], meta["record"], src, kind,
                         f"a copy of {other['key']}" + (f" (likeness {alike:.3f}, hashes {bits} bits apart)"
                                                        if kind == "near" else ""),
                         meta["caption"], kept={"source": self.corpus.image_source(twin_task).name,
                                                "path": other["path"], "record": other["record"]})
        if kind == "near":
            line.update(value=round(alike, 4), threshold=self.corpus.data.images.near_likeness)
        return meta["ordinal"], line


class _Looks:
    """The looks of any images (numbered corpus-wide), read from the read tasks' files as they are asked for: each
    file mapped for one call only, so a corpus of many read tasks never holds a descriptor per task."""

    def __init__(self, reads: list[Path], starts: np.ndarray) -> None:
        self.reads, self.starts = reads, starts

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        tasks = np.searchsorted(self.starts, rows, side="right") - 1
        out = np.empty((len(rows), LOOK_BYTES), np.uint8)
        for t in np.unique(tasks):
            chosen = tasks == t
            looks = np.memmap(self.reads[t] / LOOKS, dtype=np.uint8, mode="r").reshape(-1, LOOK_BYTES)
            out[chosen] = looks[rows[chosen] - self.starts[t]]
            del looks
        return out


def _some_metas(reads: list[Path], starts: np.ndarray, wanted: np.ndarray) -> dict[int, dict[str, Any]]:
    """The metadata of the images numbered ``wanted`` (corpus-wide), read task by task: only those are held (a
    drop-log line names the image and its kept twin), never the whole corpus's."""
    wanted_set, found = set(wanted.tolist()), {}
    tasks = set((np.searchsorted(starts, wanted, side="right") - 1).tolist())
    for t, folder in enumerate(reads):
        if t not in tasks:
            continue
        with open(folder / META, encoding="utf-8") as fh:
            for row, line in enumerate(fh):
                if int(starts[t]) + row in wanted_set:
                    found[int(starts[t]) + row] = json.loads(line)
    return found


def _metas(folder: Path) -> list[dict[str, Any]]:
    with open(folder / META, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def kept_captions(work: WorkDir, corpus: Corpus, task: int, side: int) -> Iterator[str]:
    """The captions of image read task ``task`` that are on ``side`` of the split, in order."""
    sides = np.load(work.task(IMAGE_DEDUP, 0) / f"sides-{task:06d}.npy")
    for meta, where in zip(_metas(work.task(IMAGE_READ, task)), sides, strict=True):
        if where == side and meta["caption"] is not None:
            yield meta["caption"]


class ImageShardStage(Stage[ImageShardResult]):
    """One image source's shards of one split (see the module docstring)."""

    name, result_type = IMAGE_SHARDS, ImageShardResult

    def __init__(self, work: WorkDir, corpus: Corpus, tokenizer: Path, vocab_size: int) -> None:
        super().__init__(work)
        self.corpus, self.tokenizer, self.vocab_size = corpus, tokenizer, vocab_size

    def tasks(self) -> int:
        return len(self.corpus.image_sources) * len(SPLITS)

    def run(self, task: int, out: Path) -> ImageShardResult:
        index, split_index = divmod(task, len(SPLITS))
        source = self.corpus.image_sources[index]
        src, split = self.corpus.data.sources[source], SPLITS[split_index]
        side, size = (TRAIN, VALIDATION)[split_index], self.corpus.data.images.size
        rows = [(t, np.flatnonzero(np.load(self.work.task(IMAGE_DEDUP, 0) / f"sides-{t:06d}.npy") == side))
                for t in self.corpus.image_tasks_of(source)]
        count = sum(len(r) for _, r in rows)
        folder = out / split
        folder.mkdir()
        pixels = np.lib.format.open_memmap(folder / f"{src.name}.pixels.npy", mode="w+", dtype=np.uint8,
                                           shape=(count, size, size, 3))
        captions = (IndexedDatasetWriter(folder / f"{src.name}.captions", dtype_for_vocab(self.vocab_size))
                    if src.modality == "image_text" else None)
        tok = worker_tokenizer(self.tokenizer) if captions is not None else None
        tars = _TarWriter(folder / src.name)
        done = 0
        for t, kept in rows:
            read = self.work.task(IMAGE_READ, t)
            stored = np.memmap(read / PIXELS, dtype=np.uint8, mode="r").reshape(-1, size, size, 3)
            offsets = np.load(read / STORED_INDEX)
            metas = _metas(read)
            with open(read / STORED, "rb") as blobs:
                for row in kept:
                    meta = metas[row]
                    pixels[done] = stored[row]
                    blobs.seek(offsets[row])
                    tars.add(done, blobs.read(offsets[row + 1] - offsets[row]), meta, src.name)
                    if captions is not None:
                        captions.add_document(encode_batch(tok, [meta["caption"]])[0])
                    done += 1
        pixels.flush()
        del pixels
        shards = {"pixels": f"{split}/{src.name}.pixels.npy", "tars": tars.close()}
        if captions is not None:
            info = captions.finalize().to_dict()
            shards["captions"] = {k: v for k, v in info.items() if k != "path_prefix"} | {
                "path": f"{split}/{src.name}.captions"}
        shards["pixels_sha256"] = sha256_file(folder / f"{src.name}.pixels.npy")
        return ImageShardResult(documents=count, source=src.name, split=split, images=count, shards=shards)


class _TarWriter:
    """WebDataset tars in img2dataset's layout: ``KEY.jpg|png|webp``, ``KEY.txt`` (the caption), ``KEY.json`` (where
    the sample came from), :data:`TAR_SAMPLES` samples per tar, byte-identical for the same samples (member times and
    owners fixed)."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.tar, self.files = folder, None, []
        folder.mkdir()

    def add(self, index: int, data: bytes, meta: dict[str, Any], source: str) -> None:
        if index % TAR_SAMPLES == 0:
            self._close_tar()
            self.tar = tarfile.open(self.folder / f"{index // TAR_SAMPLES:05d}.tar", "w", format=tarfile.USTAR_FORMAT)
        key = f"{index:09d}"
        members = [(f"{key}.{meta['ext']}", data)]
        if meta["caption"] is not None:
            members.append((f"{key}.txt", meta["caption"].encode("utf-8")))
        members.append((f"{key}.json", json.dumps({"key": key, "source": source, "id": meta["key"],
                                                   "caption": meta["caption"], "width": meta["width"],
                                                   "height": meta["height"]}, ensure_ascii=False).encode("utf-8")))
        for name, blob in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(blob), 0, 0o644
            self.tar.addfile(info, io.BytesIO(blob))

    def _close_tar(self) -> None:
        if self.tar is not None:
            self.tar.close()
            self.files.append(Path(self.tar.name))
            self.tar = None

    def close(self) -> list[dict[str, Any]]:
        self._close_tar()
        return [{"path": f"{self.folder.parent.name}/{self.folder.name}/{f.name}", "sha256": sha256_file(f),
                 "bytes": f.stat().st_size} for f in self.files]


@dataclass(frozen=True)
class ImageCuration:
    """What the image read and dedup stages found: each read task's result and the corpus-wide decision."""

    read: list[ImageReadResult]
    decided: ImageDedupResult


def images_manifest(corpus: Corpus, images: ImageCuration, shards: list[ImageShardResult]) -> dict[str, Any]:
    """The manifest's ``images`` section: the settings, each image source (its files, what it read, kept and dropped
    and why), dedup and the split, and each split's shards with their sha256."""
    sources = []
    for source in corpus.image_sources:
        src, tasks = corpus.data.sources[source], corpus.image_tasks_of(source)
        reasons: Counter[str] = Counter()
        for t in tasks:
            reasons.update(images.read[t].reasons)
        sources.append({
            "name": src.name, "modality": src.modality, "category": src.resolved_category(),
            "files": [{"path": path, "bytes": size, "version": version}
                      for t in tasks for path, size, version in corpus.images[t].files],
            "read": sum(images.read[t].read for t in tasks), "kept": sum(images.read[t].kept for t in tasks)
            - images.decided.removed_by_source.get(src.name, 0), "dropped": dict(sorted(reasons.items())),
            "dedup_removed": images.decided.removed_by_source.get(src.name, 0)})
    splits: dict[str, Any] = {split: {"images": 0, "shards": []} for split in SPLITS}
    for result in shards:
        splits[result.split]["images"] += result.images
        splits[result.split]["shards"].append({"source": result.source, "images": result.images, **result.shards})
    d = images.decided
    return {"settings": corpus.data.images.model_dump(mode="json"), "sources": sources, "splits": splits,
            "dedup": {"images": d.documents, "kept": d.kept, "exact": d.exact, "near": d.near,
                      "split_clusters": d.clusters, "validation": d.validation}}


def image_drop_parts(work: WorkDir, corpus: Corpus, task: int) -> Iterator[dict[str, Any]]:
    """The drop-log lines of image read task ``task``: what reading refused and what dedup removed, in read order."""
    yield from (line for _, line in heapq.merge(
        read_numbered(work.task(IMAGE_READ, task) / EVENTS),
        read_numbered(work.task(IMAGE_DEDUP, 0) / f"{EVENTS}-{task:06d}"), key=lambda item: item[0]))
