"""Export prepared documents to MindRecord, MindSpore's native dataset format.

MindFoundry trains from the Megatron ``.bin/.idx`` shards; MindRecord is for pipelines built on
``mindspore.dataset.MindDataset`` (sharded reading with ``num_shards``/``shard_id``, shuffling,
workers), e.g. on Ascend clusters. One row per document::

    tokens    int32, shape [-1]   token ids, ending with EOS (as in the shards)
    source    string              source name
    category  string              data category
    split     string              "train" or "validation"
    doc_index int64               index of the document in its .bin/.idx shard

Layout of OUT (``SPLIT.mindrecord`` is a single file when ``shards == 1``, else
``SPLIT.mindrecord0`` .. ``SPLIT.mindrecord{shards-1}``, each with its ``.db`` index)::

    OUT/train.mindrecord*        OUT/validation.mindrecord*        OUT/export.json

Everything is written under a temporary name next to OUT and renamed into place when complete,
so a crash never leaves a half-written export that looks complete; an existing OUT is refused.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from mindspore.mindrecord import FileWriter

from mindfoundry.data.dataset.prepared import SPLITS, read_manifest
from mindfoundry.data.dataset.validate import open_shard
from mindfoundry.errors import OutputExistsError
from mindfoundry.storage.commit import staged_folder
from mindfoundry.storage.location import Location
from mindfoundry.storage.resolve import locate

__all__ = ["EXPORT_MANIFEST", "SCHEMA", "export_mindrecord", "mindrecord_files"]

SCHEMA: dict[str, dict[str, Any]] = {
    "tokens": {"type": "int32", "shape": [-1]},
    "source": {"type": "string"},
    "category": {"type": "string"},
    "split": {"type": "string"},
    "doc_index": {"type": "int64"},
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

