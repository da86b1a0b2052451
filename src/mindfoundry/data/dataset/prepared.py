"""A prepared data folder: manifest, tokenizer and Megatron shards, opened and checked for training.

Layout::

    DATA/manifest.json                 provenance: sources + sha256, counts, tokenizer hash, seed
    DATA/tokenizer.json                byte-level BPE (Hugging Face `tokenizers` format)
    DATA/train/SOURCE.{bin,idx}        one Megatron indexed shard per source and split
    DATA/validation/SOURCE.{bin,idx}
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from mindfoundry.data.dataset.indexed import IndexedDataset, ShardError, verify_tokens
from mindfoundry.data.dataset.packing import PackedSamples
from mindfoundry.data.prepare.tokenizer import load_tokenizer, pad_id, tokenizer_hash
from mindfoundry.errors import MindFoundryError

MANIFEST = "manifest.json"
TOKENIZER = "tokenizer.json"
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
    shards: dict[str, list[IndexedDataset]]

    def packed(self, split: str, seq_len: int) -> PackedSamples:
        return PackedSamples(self.shards[split], seq_len, pad_id(self.tokenizer))

    def bytes_per_token(self, split: str) -> float:
        s = self.manifest["splits"][split]
        return s["bytes"] / max(s["tokens"], 1)


def load_prepared(root: str | Path, vocab_size: int) -> PreparedData:
    """Open DATA for training with a model of `vocab_size`; every inconsistency is a DataError."""
    root = Path(root)
    mpath = root / MANIFEST
    if not mpath.is_file():
        raise DataError(f"no prepared data at '{root}' ({MANIFEST} missing): run `mindfoundry prepare CONFIG` first")
    raw = mpath.read_bytes()
    manifest = json.loads(raw)
    tokenizer = load_tokenizer(root / TOKENIZER)
    if tokenizer_hash(tokenizer) != manifest["tokenizer"]["sha256"]:
        raise DataError(f"{root / TOKENIZER} does not match the manifest's tokenizer hash: re-run `mindfoundry prepare --overwrite`")
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
            if ds.num_tokens != info["num_tokens"] or len(ds) != info["num_documents"]:
                raise DataError(f"shard '{root / info['path']}' has {ds.num_tokens} tokens / {len(ds)} documents, "
                                f"the manifest says {info['num_tokens']} / {info['num_documents']}: re-run `mindfoundry prepare --overwrite`")
            try:
                verify_tokens(ds, vocab_size)
            except ShardError as exc:
                raise DataError(str(exc)) from None
            shards[split].append(ds)
    return PreparedData(root, manifest, hashlib.sha256(raw).hexdigest(), raw, tokenizer, shards)
