"""`mindfoundry data validate`: check every shard of a prepared folder before spending compute on it.

``load_prepared`` already refuses a folder that cannot train (bad headers, wrong counts, ids
outside the vocab) at the first problem. Validation goes further and reports *every* problem of
*every* shard at once, plus what training would not notice: documents without their EOS, EOS
inside a document (a false document boundary), empty documents, shards too small for one
sample, bytes that changed since ``prepare`` (sha256), duplicate documents and validation
documents that also appear in training.

Framework-free on purpose.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich import box
from rich.table import Table

from mindfoundry.data.dataset.indexed import IndexedDataset, ShardError
from mindfoundry.data.dataset.prepared import IMAGES, SPLITS, TOKENIZER, DataError, read_manifest, shard_hash_problems
from mindfoundry.data.tokenizer import eos_id, load_tokenizer, tokenizer_hash
from mindfoundry.storage.commit import sha256_file

__all__ = ["ShardReport", "ValidationReport", "open_shard", "render_validation", "validate_prepared"]

# Tokens scanned per step, so that a shard of any size is checked in bounded memory.
_SCAN_CHUNK = 1 << 24


@dataclass
class ShardReport:
    """Statistics and problems of one shard; ``problems`` fail validation, ``warnings`` do not."""

    split: str
    source: str
    category: str
    path: str  # shard prefix (ROOT/SPLIT/SOURCE), what every message names
    documents: int = 0
    tokens: int = 0
    samples: int = 0
    lengths: dict[str, float] = field(default_factory=dict)  # min / median / mean / max tokens per document
    duplicate_ratio: float = 0.0
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        return "fail" if self.problems else "warn" if self.warnings else "pass"


@dataclass
class ValidationReport:
    """Every shard's report plus problems of the folder as a whole (tokenizer, totals, split leaks)."""

    root: Path
    shards: list[ShardReport]
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and all(not s.problems for s in self.shards)

    def messages(self) -> list[str]:
        """One line per problem, each naming the shard (or the folder) it is about."""
        out = [f"{self.root}: {p}" for p in self.problems]
        out += [f"{s.path}: {p}" for s in self.shards for p in s.problems]
        return out


def open_shard(prefix: Path) -> IndexedDataset:
    """Open one shard for reading, turning a broken shard into a DataError that says how to diagnose it."""
    try:
        return IndexedDataset(prefix)
    except ShardError as exc:
        raise DataError(f"{exc} (`mindfoundry data validate CONFIG` reports every problem of every shard)") from None


def validate_prepared(
    root: str | Path, *, vocab_size: int | None = None, seq_len: int | None = None
) -> ValidationReport:
    """Check a prepared folder; ``vocab_size`` is the model's, ``seq_len`` the training sample length."""
    root = Path(root)
    manifest, _ = read_manifest(root)
    report = ValidationReport(root, [])
    try:
        tok = load_tokenizer(root / TOKENIZER)
    except (OSError, ValueError) as exc:
        report.problems.append(f"tokenizer unusable: {exc}")
        return report
    if tokenizer_hash(tok) != manifest["tokenizer"]["sha256"]:
        report.problems.append(f"{TOKENIZER} differs from the one the shards were made with (manifest sha256)")
    vocab = tok.get_vocab_size()
    if vocab_size is not None and vocab > vocab_size:
        report.problems.append(
            f"the tokenizer has {vocab} tokens but model.vocab_size={vocab_size}: raise model.vocab_size"
        )
    folder = _Folder(root, manifest, vocab, eos_id(tok), seq_len)
    sources = {s["name"]: s for s in manifest["sources"]}
    hashes: dict[str, Counter[bytes]] = {split: Counter() for split in SPLITS}
    for split in SPLITS:
        for info in manifest["splits"][split]["shards"]:
            source = sources[info["path"].split("/", 1)[1]]
            shard = ShardReport(split, source["name"], source["category"] or source["name"], str(root / info["path"]))
            _check_shard(folder, info, source["splits"][split], shard, hashes[split])
            report.shards.append(shard)
    report.problems += _split_problems(manifest, report.shards, hashes, seq_len)
    for split in SPLITS if "images" in manifest else ():
        for entry in manifest["images"]["splits"][split]["shards"]:
            report.shards.append(_check_images(folder, split, entry, manifest["images"]["settings"]["size"]))
    return report


def _check_images(folder: _Folder, split: str, entry: dict[str, Any], size: int) -> ShardReport:
    """One image source's shards of one split: the pixel shard's bytes, dtype and shape, the tars' bytes, and the
    captions (one per image, ids in range, each ending with EOS)."""
    images = folder.root / IMAGES
    pixels = images / entry["pixels"]
    shard = ShardReport(split, entry["source"], "images", str(pixels), documents=entry["images"])
    if not pixels.is_file():
        shard.problems.append("missing: re-run `mindfoundry prepare --overwrite`")
        return shard
    if sha256_file(pixels) != entry["pixels_sha256"]:
        shard.problems.append("changed since it was prepared (sha256 differs from the manifest): re-run "
                              "`mindfoundry prepare --overwrite`")
    else:
        array = np.load(pixels, mmap_mode="r")
        if array.dtype != np.uint8 or array.shape != (entry["images"], size, size, 3):
            shard.problems.append(f"holds {array.dtype} {array.shape}, the manifest says uint8 "
                                  f"({entry['images']}, {size}, {size}, 3)")
    for tar in entry["tars"]:
        path = images / tar["path"]
        if not path.is_file() or sha256_file(path) != tar["sha256"]:
            shard.problems.append(f"{tar['path']} is missing or changed since it was prepared (sha256): re-run "
                                  "`mindfoundry prepare --overwrite`")
    if "captions" in entry:
        try:
            captions = IndexedDataset(images / entry["captions"]["path"])
        except ShardError as exc:
            shard.problems.append(f"captions cannot be opened: {exc}")
            return shard
        shard.tokens = captions.num_tokens
        if len(captions) != entry["images"]:
            shard.problems.append(f"{len(captions)} captions for {entry['images']} images")
        shard.problems += [f"captions: {p}" for p in shard_hash_problems(captions, entry["captions"])]
        shard.problems += [f"captions: {p}" for p in _token_problems(captions, folder.vocab, folder.eos)]
    return shard


@dataclass(frozen=True)
class _Folder:
    """What every shard of a folder is checked against."""

    root: Path
    manifest: dict[str, Any]
    vocab: int
    eos: int
    seq_len: int | None


def _check_shard(folder: _Folder, info: dict[str, Any], source_counts: dict[str, int], shard: ShardReport,
                 split_hashes: Counter[bytes]) -> None:
    """Fill one shard's report and add its document hashes to its split's; an unreadable shard gets that one problem."""
    try:
        ds = IndexedDataset(folder.root / info["path"])
    except ShardError as exc:
        shard.problems.append(f"cannot be opened: {exc}")
        return
    shard.documents, shard.tokens = len(ds), ds.num_tokens
    shard.problems += _count_problems(ds, info, source_counts)
    shard.problems += shard_hash_problems(ds, info)
    shard.problems += _dtype_problems(ds, folder.manifest["dtype"], folder.vocab)
    shard.problems += _token_problems(ds, folder.vocab, folder.eos)
    _length_stats(ds, shard, folder.seq_len)
    doc_hashes = _document_hashes(ds)
    counts = Counter(doc_hashes)
    shard.duplicate_ratio = (len(doc_hashes) - len(counts)) / max(len(doc_hashes), 1)
    split_hashes.update(counts)


def _count_problems(ds: IndexedDataset, info: dict[str, Any], source_counts: dict[str, int]) -> list[str]:
    """The shard must hold what the manifest says, both in its shard list and in its source entry."""
    out = []
    for where, docs, toks in (("shard list", info["num_documents"], info["num_tokens"]),
                              ("source entry", source_counts["documents"], source_counts["tokens"])):
        if (len(ds), ds.num_tokens) != (docs, toks):
            out.append(
                f"holds {len(ds)} documents / {ds.num_tokens} tokens but the manifest's {where} says {docs} / {toks}"
            )
    return out


def _dtype_problems(ds: IndexedDataset, manifest_dtype: str, vocab: int) -> list[str]:
    out = []
    if ds.dtype.name != np.dtype(manifest_dtype).name:
        out.append(f"dtype {ds.dtype.name} differs from the manifest's {manifest_dtype}")
    if np.iinfo(ds.dtype).max < vocab - 1:
        out.append(f"dtype {ds.dtype.name} cannot hold token ids up to {vocab - 1} (vocab {vocab})")
    return out


def _token_problems(ds: IndexedDataset, vocab: int, eos: int) -> list[str]:
    """Ids in range; EOS ends every document and appears nowhere else; no document is empty."""
    out = []
    eos_count = 0
    if ds.num_tokens:
        lo, hi, eos_count = _scan(ds.tokens(), eos)
        if lo < 0 or hi >= vocab:
            out.append(f"token ids span {lo}..{hi}, outside the vocab 0..{vocab - 1}")
    lengths = ds.sequence_lengths
    empty = int((lengths <= 1).sum())
    if empty:
        first = int(np.argmax(lengths <= 1))
        out.append(f"{empty} empty documents (no tokens besides EOS), the first is document {first}")
    ends = np.cumsum(lengths, dtype=np.int64)[lengths > 0] - 1
    missing = int((np.asarray(ds.tokens()[ends]) != eos).sum())
    if missing:
        out.append(f"{missing} documents do not end with EOS (id {eos})")
    inside = eos_count - (ends.size - missing)
    if inside:
        out.append(f"EOS (id {eos}) occurs {inside} times inside documents: false document boundaries")
    return out


def _scan(tokens: np.ndarray, eos: int) -> tuple[int, int, int]:
    """Min id, max id and EOS count, chunk by chunk."""
    lo, hi, count = int(tokens[0]), int(tokens[0]), 0
    for start in range(0, tokens.size, _SCAN_CHUNK):
        chunk = np.asarray(tokens[start : start + _SCAN_CHUNK])
        lo, hi = min(lo, int(chunk.min())), max(hi, int(chunk.max()))
        count += int((chunk == eos).sum())
    return lo, hi, count


def _length_stats(ds: IndexedDataset, shard: ShardReport, seq_len: int | None) -> None:
    """Document length statistics, and the packed sample count a training shard needs to be non-zero."""
    lengths = ds.sequence_lengths
    if lengths.size:
        shard.lengths = {"min": int(lengths.min()), "median": float(np.median(lengths)),
                         "mean": float(lengths.mean()), "max": int(lengths.max())}
    if seq_len is None:
        return
    shard.samples = _num_samples(ds.num_tokens, seq_len)
    if shard.samples == 0 and ds.num_tokens:
        shard.warnings.append(
            f"too small for one sample of seq_len={seq_len} ({ds.num_tokens} tokens): a mixture never draws from it"
        )


def _num_samples(tokens: int, seq_len: int) -> int:
    """Packed samples in a stream of ``tokens`` (each sample needs seq_len + 1 tokens, sharing one)."""
    return 0 if tokens < 2 else -(-(tokens - 1) // seq_len)


def _document_hashes(ds: IndexedDataset) -> list[bytes]:
    """A 16-byte blake2b digest of each document's token bytes: exact duplicates collide."""
    raw = memoryview(ds.tokens()).cast("B") if ds.num_tokens else memoryview(b"")
    item = ds.dtype.itemsize
    return [hashlib.blake2b(raw[int(p) : int(p) + int(n) * item], digest_size=16).digest()
            for p, n in zip(ds.sequence_pointers, ds.sequence_lengths)]


def _split_problems(manifest: dict[str, Any], shards: list[ShardReport], hashes: dict[str, Counter[bytes]],
                    seq_len: int | None) -> list[str]:
    """Consistent per-split totals in the manifest, a trainable train split, no validation document in training.

    Each shard was already checked against its own manifest entry, so the totals are checked
    against the entries: one broken shard is reported once, not again as a wrong total.
    """
    out = []
    for split in SPLITS:
        total = manifest["splits"][split]
        entries = manifest["splits"][split]["shards"]
        listed = (sum(e["num_documents"] for e in entries), sum(e["num_tokens"] for e in entries))
        if listed != (total["documents"], total["tokens"]):
            out.append(f"manifest.json: the {split} totals ({total['documents']} documents / {total['tokens']} tokens) "
                       f"differ from the sum of its shard entries ({listed[0]} / {listed[1]})")
    text = manifest.get("sources")  # image sources alone train on the image shards, not on text samples
    if text and seq_len is not None and _num_samples(sum(s.tokens for s in shards if s.split == "train"),
                                                     seq_len) == 0:
        out.append(f"the train split is too small for one sample of seq_len={seq_len}: add data or lower train.seq_len")
    leaked = sum(n for h, n in hashes["validation"].items() if h in hashes["train"])
    if leaked:
        out.append(
            f"{leaked} validation documents also appear in the train split: held-out metrics would be optimistic"
        )
    return out


def render_validation(report: ValidationReport) -> Table:
    """The pass/fail table, one row per shard."""
    table = Table(title=f"data validation: {report.root}", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0))
    for col in ("split", "source", "category", "docs", "tokens", "samples", "doc len min/med/max", "dup", "status"):
        table.add_column(col, justify="left" if col in ("split", "source", "category", "status") else "right")
    colors = {"pass": "green", "warn": "yellow", "fail": "red"}
    for s in report.shards:
        lengths = "/".join(f"{s.lengths[k]:.0f}" for k in ("min", "median", "max")) if s.lengths else "-"
        table.add_row(s.split, s.source, s.category, f"{s.documents:,}", f"{s.tokens:,}", f"{s.samples:,}",
                      lengths, f"{100 * s.duplicate_ratio:.1f}%", f"[{colors[s.status]}]{s.status}[/]")
    return table
