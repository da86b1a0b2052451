"""A prepared data folder: manifest, tokenizer and Megatron shards, opened and checked for training.

Layout::

    DATA/manifest.json                 provenance: sources + sha256, counts, tokenizer hash, seed
    DATA/tokenizer.json                byte-level BPE (Hugging Face `tokenizers` format)
    DATA/train/SOURCE.{bin,idx}        one Megatron indexed shard per source and split
    DATA/validation/SOURCE.{bin,idx}

DATA may be a URL (``s3://bucket/prefix``): the same objects, committed by ``commit.json`` (their sha256) written
last. Training reads a node-local copy (:func:`local_copy`): fetched once per node into ``data.cache_dir`` while the
other processes of the node wait, each object checked against the marker, and reused by every later start while the
marker is unchanged; the shards' sha256 are checked against the manifest at every start, as for a local folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from mindfoundry.config.schema import RunConfig
from mindfoundry.data.dataset.indexed import IndexedDataset, ShardError, verify_tokens
from mindfoundry.data.dataset.packing import PackedSamples
from mindfoundry.data.tokenizer import pad_id, read_tokenizer, tokenizer_hash
from mindfoundry.errors import MindFoundryError
from mindfoundry.storage.cache import cache_folder
from mindfoundry.storage.commit import fetch, is_committed, refetch, sha256_file
from mindfoundry.storage.location import Location
from mindfoundry.storage.resolve import locate

MANIFEST = "manifest.json"
TOKENIZER = "tokenizer.json"
#: The folder of the curated images: images/SPLIT/SOURCE/NNNNN.tar (WebDataset), SOURCE.pixels.npy, SOURCE.captions.*
IMAGES = "images"
SPLITS = ("train", "validation")


class DataError(MindFoundryError, RuntimeError):
    """Prepared data is missing, stale or inconsistent; the message says what to run."""


@dataclass
class PreparedData:
    root: Path
    manifest: dict[str, Any]
    manifest_sha256: str
    manifest_bytes: bytes  # copied into every checkpoint, so provenance travels with the weights
    tokenizer: Tokenizer
    tokenizer_bytes: bytes  # tokenizer.json as the run read it: every checkpoint carries these, whatever the file holds
    shards: dict[str, list[IndexedDataset]]

    def packed(self, split: str, seq_len: int) -> PackedSamples:
        return PackedSamples(self.shards[split], seq_len, pad_id(self.tokenizer))

    def bytes_per_token(self, split: str) -> float:
        s = self.manifest["splits"][split]
        return s["bytes"] / max(s["tokens"], 1)


def prepared_location(cfg: RunConfig) -> Location:
    """Where this config's prepared data lives: ``data.output_dir``, a folder or a URL (the one place that says)."""
    return locate(cfg.data.output_dir, cfg.storage)


def is_prepared(where: Location) -> bool:
    """Whether ``where`` holds finished prepared data: a committed folder (:mod:`mindfoundry.storage.commit`) with its
    manifest."""
    return is_committed(where) and (where / MANIFEST).is_file()


def prepared_identity(where: Location) -> str | None:
    """The data identity the finished prepared data at ``where`` was made for; DataError for a damaged manifest."""
    return read_manifest(where)[0].get("identity")


def _cache(cfg: RunConfig) -> Path:
    return cache_folder("data", str(prepared_location(cfg)), cfg.data.cache_dir)


def local_copy(cfg: RunConfig) -> Path:
    """This config's prepared folder on this machine: ``data.output_dir`` itself, or for a URL its node-local copy
    (see the module docstring)."""
    return fetch(prepared_location(cfg), _cache(cfg))


def open_prepared(cfg: RunConfig, log: Callable[[str], None] = print) -> PreparedData:
    """:func:`load_prepared` of this config's prepared data, wherever it lives. A node-local copy found damaged (its
    shards' sha256 no longer those of the manifest) is dropped and fetched again, once, said in one line."""
    try:
        return load_prepared(local_copy(cfg), cfg.model.vocab_size)
    except DataError as exc:
        again = refetch(prepared_location(cfg), _cache(cfg))
        if again is None:
            raise
        log(f"this node's copy of {prepared_location(cfg)} was damaged ({exc}): dropped and fetched again")
        return load_prepared(again, cfg.model.vocab_size)


def shard_hash_problems(ds: IndexedDataset, info: dict[str, Any]) -> list[str]:
    """sha256 of a shard's two files against the manifest: catches bytes changed since `prepare` (bit rot,
    edits: a flipped token bit, a removed EOS), which every other check can miss."""
    return [
        f"{path.name} changed since it was prepared (sha256 differs from the manifest): re-run `mindfoundry prepare "
        "--overwrite`"
        for path, key in ((ds.bin_path, "bin_sha256"), (ds.idx_path, "idx_sha256"))
        if sha256_file(path) != info.get(key)
    ]


def read_manifest(root: Path | Location) -> tuple[dict[str, Any], bytes]:
    """The folder's manifest (and its bytes; a folder or a URL), checked for what training reads; DataError saying how
    to fix it."""
    path = locate(root) / MANIFEST
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"no prepared data at '{root}' ({MANIFEST} missing): run `mindfoundry prepare CONFIG` "
                        "first") from None
    redo = "re-run `mindfoundry prepare --overwrite`"
    try:
        manifest = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"{path} is not valid JSON ({exc}): it is damaged; {redo}") from None
    splits = manifest.get("splits") if isinstance(manifest, dict) else None
    if not isinstance(splits, dict) or any(
        not isinstance(splits.get(s), dict) or not isinstance(splits[s].get("shards"), list) for s in SPLITS
    ):
        raise DataError(
            f"{path} has no 'splits' with train and validation shard lists: not a complete manifest; {redo}"
        )
    if not isinstance(manifest.get("tokenizer"), dict) or "sha256" not in manifest["tokenizer"]:
        raise DataError(f"{path} has no tokenizer hash: not a complete manifest; {redo}")
    for split in SPLITS:
        for info in splits[split]["shards"]:
            rel = info.get("path") if isinstance(info, dict) else None
            if (
                not isinstance(rel, str)
                or Path(rel).is_absolute()
                or ".." in Path(rel).parts
                or not rel.startswith(f"{split}/")
            ):
                raise DataError(f"{path} lists a {split} shard at {rel!r}: shards live inside the data folder, "
                                f"under {split}/; the manifest is damaged or was edited; {redo}")
    return manifest, raw


def data_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between the data a checkpoint was trained on (its data_manifest.json, ``old``) and prepared data
    (``new``): the tokenizer, and each source whose shards differ, with the source files added, removed or changed;
    [] when both hold the same tokens (timings and the paths the sources were read from may differ)."""
    out = []
    tokenizers = [m.get("tokenizer", {}).get("sha256") for m in (old, new)]
    if tokenizers[0] != tokenizers[1]:
        out.append(f"the tokenizer differs (sha256 {str(tokenizers[0])[:12]}... -> {str(tokenizers[1])[:12]}...: its "
                   "ids mean other strings)")
    shards = [_shard_sums(m) for m in (old, new)]  # {"train/NAME": (bin sha256, idx sha256)}
    changed = sorted({path.split("/", 1)[-1] for path in shards[0].keys() | shards[1].keys()
                      if shards[0].get(path) != shards[1].get(path)})
    files = [{s.get("name"): _relative_files(s.get("files", [])) for s in m.get("sources", [])} for m in (old, new)]
    for name in changed:
        before, after = files[0].get(name, {}), files[1].get(name, {})
        what = file_changes(after.keys() - before.keys(), before.keys() - after.keys(),
                            {f for f in before.keys() & after.keys() if before[f] != after[f]})
        if what:
            out.append(f"source {name}: {what}")
        elif tokenizers[0] == tokenizers[1]:  # (with another tokenizer every shard differs: said above)
            out.append(f"source {name}'s shards differ (its cleaning or dedup gave other documents)")
    return out


def file_changes(added: set[str], removed: set[str], changed: set[str]) -> str:
    """"N file(s) added (a, b, c, ...), ..." for the groups that are not empty ('' when none is): how a source's files
    differ, in the words of every message that says so."""
    return ", ".join(f"{len(group)} file(s) {verb} ({', '.join(sorted(group)[:3])}{', ...' if len(group) > 3 else ''})"
                     for verb, group in (("added", added), ("removed", removed), ("changed", changed)) if group)


def _shard_sums(manifest: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    return {info.get("path"): (info.get("bin_sha256"), info.get("idx_sha256"))
            for split in SPLITS for info in manifest.get("splits", {}).get(split, {}).get("shards", [])}


def _relative_files(files: list[dict[str, Any]]) -> dict[str, str]:
    """A manifest source's files by their path below the source's common folder (the corpus may have moved): their
    sha256."""
    paths = [str(f.get("path", "")) for f in files]
    root = os.path.commonpath([posixpath.dirname(p) for p in paths]) if len(paths) > 1 else (
        posixpath.dirname(paths[0]) if paths else "")
    return {posixpath.relpath(p, root) if root else p: str(f.get("sha256")) for p, f in zip(paths, files)}


def load_prepared(root: str | Path, vocab_size: int) -> PreparedData:
    """Open DATA for training with a model of `vocab_size`; every inconsistency is a DataError.

    The cheap checks of `data validate` run here, at every start: the manifest's structure, each
    shard's counts, its files' sha256 and its token range (a shard `data validate` rejects is not
    trained on)."""
    root = Path(root)
    manifest, raw = read_manifest(root)
    tokenizer, tokenizer_bytes = read_tokenizer(root / TOKENIZER)
    if tokenizer_hash(tokenizer) != manifest["tokenizer"]["sha256"]:
        raise DataError(
            f"{root / TOKENIZER} does not match the manifest's tokenizer hash: re-run `mindfoundry prepare --overwrite`"
        )
    if tokenizer.get_vocab_size() > vocab_size:
        raise DataError(
            f"the tokenizer in '{root}' has {tokenizer.get_vocab_size()} tokens but model.vocab_size={vocab_size}: "
            "raise model.vocab_size or prepare the data again with this config"
        )
    shards: dict[str, list[IndexedDataset]] = {}
    for split in SPLITS:
        shards[split] = []
        for info in manifest["splits"][split]["shards"]:
            try:
                ds = IndexedDataset(root / info["path"])
            except ShardError as exc:
                raise DataError(str(exc)) from None
            if ds.num_tokens != info.get("num_tokens") or len(ds) != info.get("num_documents"):
                raise DataError(
                    f"shard '{root / info['path']}' has {ds.num_tokens} tokens / {len(ds)} documents, "
                    f"the manifest says {info.get('num_tokens')} / {info.get('num_documents')}: re-run `mindfoundry "
                    "prepare --overwrite`"
                )
            problems = shard_hash_problems(ds, info)
            if problems:
                raise DataError(f"shard '{root / info['path']}': {problems[0]}")
            try:
                verify_tokens(ds, vocab_size)
            except ShardError as exc:
                raise DataError(str(exc)) from None
            shards[split].append(ds)
    return PreparedData(root, manifest, hashlib.sha256(raw).hexdigest(), raw, tokenizer, tokenizer_bytes, shards)
