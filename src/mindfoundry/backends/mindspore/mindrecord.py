"""Export prepared documents to MindRecord, MindSpore's native dataset format.

MindFoundry trains from the Megatron ``.bin/.idx`` shards; MindRecord is for pipelines built on
``mindspore.dataset.MindDataset`` (sharded reading with ``num_shards``/``shard_id``, shuffling,
workers), e.g. on Ascend clusters. One row per document::

    tokens    int32, shape [-1]   token ids, ending with EOS (as in the shards)
    source    string              source name
    category  string              data category
    split     string              "train" or "validation"
    doc_index int64               index of the document in its .bin/.idx shard

Curated images (image sources) go to ``SPLIT.images.mindrecord*``, one row per image in the order of the prepared
shards::

    image     bytes               the encoded image, as the WebDataset tar holds it (JPEG, PNG or WebP)
    caption   int32, shape [-1]   the caption's token ids, ending with EOS (empty for ``modality: image``)
    source    string              source name
    key       string              where the image came from (source:path:member or record)

with header and page sizes set from the data (MindSpore's defaults, 16 MB and 32 MB, would pad a few MB of small
images to tens of MB).

Layout of OUT (``SPLIT.mindrecord`` is a single file when ``shards == 1``, else
``SPLIT.mindrecord0`` .. ``SPLIT.mindrecord{shards-1}``, each with its ``.db`` index)::

    OUT/train.mindrecord*        OUT/validation.mindrecord*        OUT/export.json
    OUT/train.images.mindrecord*  OUT/validation.images.mindrecord*  (with image sources)

Everything is written under a temporary name next to OUT and renamed into place when complete,
so a crash never leaves a half-written export that looks complete; an existing OUT is refused.
"""

from __future__ import annotations

import json
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from mindspore.mindrecord import FileWriter

from mindfoundry.data.dataset.prepared import IMAGES, SPLITS, read_manifest
from mindfoundry.data.dataset.validate import open_shard
from mindfoundry.errors import OutputExistsError
from mindfoundry.storage.commit import staged_folder
from mindfoundry.storage.location import Location
from mindfoundry.storage.resolve import locate

__all__ = ["EXPORT_MANIFEST", "IMAGE_SCHEMA", "SCHEMA", "export_mindrecord", "mindrecord_files"]

SCHEMA: dict[str, dict[str, Any]] = {
    "tokens": {"type": "int32", "shape": [-1]},
    "source": {"type": "string"},
    "category": {"type": "string"},
    "split": {"type": "string"},
    "doc_index": {"type": "int64"},
}
IMAGE_SCHEMA: dict[str, dict[str, Any]] = {
    "image": {"type": "bytes"},
    "caption": {"type": "int32", "shape": [-1]},
    "source": {"type": "string"},
    "key": {"type": "string"},
}
EXPORT_MANIFEST = "export.json"
# Documents handed to FileWriter per call: bounds memory while keeping calls few.
_ROWS_PER_WRITE = 2048


def mindrecord_files(out_dir: str | Path, split: str) -> list[Path]:
    """The data files of one split in an export, in shard order (what MindDataset takes)."""
    manifest = json.loads((Path(out_dir) / EXPORT_MANIFEST).read_text(encoding="utf-8"))
    return [Path(out_dir) / name for name in manifest["splits"][split]["files"]]


def export_mindrecord(prepared_data_dir: str | Path, out_dir: str | Path | Location, shards: int = 1) -> Location:
    """Write every document of both splits into MindRecord files under ``out_dir`` (a folder, or a URL: written on
    this node, then committed there); return it."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    root, out = Path(prepared_data_dir), locate(out_dir)
    if out.exists():
        raise OutputExistsError(f"'{out}' already exists: choose another output folder or delete it first")
    manifest, _ = read_manifest(root)
    with staged_folder(out) as tmp:
        splits = {split: _write_split(root, manifest, split, tmp, shards) for split in SPLITS}
        summary = {"format": "mindfoundry.mindrecord/1", "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "data_identity": manifest["identity"], "schema": SCHEMA, "shards": shards, "splits": splits}
        if "images" in manifest:
            summary["image_schema"] = IMAGE_SCHEMA
            summary["images"] = {split: _write_images(root, manifest, split, tmp, shards) for split in SPLITS}
        (tmp / EXPORT_MANIFEST).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return out


def _write_split(root: Path, manifest: dict[str, Any], split: str, out: Path, shards: int) -> dict[str, Any]:
    """One split's documents, source by source, into ``shards`` MindRecord files."""
    writer = FileWriter(str(out / f"{split}.mindrecord"), shard_num=shards, overwrite=False)
    writer.add_schema(SCHEMA, f"mindfoundry {split} documents")
    categories = {s["name"]: s["category"] or s["name"] for s in manifest["sources"]}
    documents = tokens = 0
    for info in manifest["splits"][split]["shards"]:
        name = info["path"].split("/", 1)[1]
        ds = open_shard(root / info["path"])
        for begin in range(0, len(ds), _ROWS_PER_WRITE):
            rows = [{"tokens": np.asarray(ds[i], dtype=np.int32), "source": name, "category": categories[name],
                     "split": split, "doc_index": i} for i in range(begin, min(begin + _ROWS_PER_WRITE, len(ds)))]
            writer.write_raw_data(rows)
        documents += len(ds)
        tokens += ds.num_tokens
    writer.commit()
    files = sorted((p.name for p in out.glob(f"{split}.mindrecord*") if p.suffix != ".db"), key=_shard_number)
    return {"documents": documents, "tokens": tokens, "files": files}


def _shard_number(name: str) -> int:
    """0 for ``x.mindrecord``, k for ``x.mindrecordk``: orders the files as the writer numbered them."""
    digits = name.rsplit(".mindrecord", 1)[1]
    return int(digits) if digits else 0



def _write_images(root: Path, manifest: dict[str, Any], split: str, out: Path, shards: int) -> dict[str, Any]:
    """One split's curated images, source by source, into ``shards`` MindRecord files sized for the data."""
    entries = manifest["images"]["splits"][split]["shards"]
    tars = [root / IMAGES / tar["path"] for entry in entries for tar in entry["tars"]]
    largest = max((member.size for path in tars for member in _members(path)), default=0)
    total = sum(path.stat().st_size for path in tars)
    writer = FileWriter(str(out / f"{split}.images.mindrecord"), shard_num=shards, overwrite=False)
    writer.add_schema(IMAGE_SCHEMA, f"mindfoundry {split} images")
    page = _power_of_two(max(1 << 15, 4 * largest), 1 << 28)  # a row never spans pages: room for the largest
    writer.set_page_size(page)
    writer.set_header_size(_power_of_two(max(1 << 16, 512 * (total // page + 1)), 1 << 27))  # an entry per page
    images = 0
    for entry in entries:
        captions = open_shard(root / IMAGES / entry["captions"]["path"]) if "captions" in entry else None
        rows = []
        for index, (image, key) in enumerate(_tar_images([root / IMAGES / t["path"] for t in entry["tars"]])):
            caption = np.asarray(captions[index], dtype=np.int32) if captions is not None else np.zeros(0, np.int32)
            rows.append({"image": image, "caption": caption, "source": entry["source"], "key": key})
            if len(rows) == _ROWS_PER_WRITE:
                writer.write_raw_data(rows)
                rows = []
        if rows:
            writer.write_raw_data(rows)
        images += entry["images"]
    writer.commit()
    files = sorted((p.name for p in out.glob(f"{split}.images.mindrecord*") if p.suffix != ".db"), key=_shard_number)
    return {"images": images, "files": files, "page_size": page}


def _members(path: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(path) as tar:
        return tar.getmembers()


def _tar_images(paths: list[Path]) -> Iterator[tuple[bytes, str]]:
    """(image bytes, the sample's id) of every sample of our WebDataset tars, in order."""
    for path in paths:
        with tarfile.open(path) as tar:
            image = None
            for member in tar:
                stem, _, ext = member.name.partition(".")
                handle = tar.extractfile(member)
                data = handle.read() if handle is not None else b""
                if ext in ("jpg", "png", "webp"):
                    image = data
                elif ext == "json" and image is not None:
                    yield image, json.loads(data)["id"]
                    image = None


def _power_of_two(at_least: int, at_most: int) -> int:
    return min(1 << max(at_least - 1, 1).bit_length(), at_most)
