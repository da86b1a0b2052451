"""`mindfoundry prepare`: raw text -> split by document -> BPE tokenizer -> Megatron shards + manifest.

Two streaming passes over the sources keep memory bounded: the first feeds training-split text
to the tokenizer trainer, the second tokenizes every document into its split's shard. Everything
is written into a temporary folder that is renamed into place only when complete.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator

import mindfoundry
from mindfoundry.config.schema import RunConfig, SourceConfig
from mindfoundry.data.document import Document
from mindfoundry.data.indexed import IndexedDatasetWriter, dtype_for_vocab
from mindfoundry.data.prepared import MANIFEST, SPLITS, TOKENIZER, DataError, PreparedData, load_prepared
from mindfoundry.data.sources import SourceStats, read_builtin, read_files
from mindfoundry.data.split import split_documents
from mindfoundry.data.tokenizer import encode_batch, load_tokenizer, tokenizer_hash, train_tokenizer

ENCODE_BATCH = 512


def data_identity(cfg: RunConfig) -> str:
    """What determines the prepared data: the data section, the seed and the vocabulary size."""
    key = {"data": cfg.data.model_dump(mode="json", exclude={"output_dir"}), "seed": cfg.seed, "vocab_size": cfg.model.vocab_size}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _capped(docs: Iterable[Document], max_documents: int | None, max_bytes: int | None) -> Iterator[Document]:
    """First documents of a file source up to the caps (built-ins sample across the whole source instead)."""
    total = 0
    for i, doc in enumerate(docs):
        if (max_documents is not None and i >= max_documents) or (max_bytes is not None and total >= max_bytes):
            return
        total += len(doc.text.encode("utf-8"))
        yield doc


def read_source(src: SourceConfig, stats: SourceStats) -> Iterator[Document]:
    """Documents of one configured source, tagged with its category."""
    if src.builtin is not None:
        docs = read_builtin(src.builtin, stats=stats, max_documents=src.max_documents, max_bytes=src.max_bytes)
    else:
        docs = _capped(
            read_files(src.paths, name=src.name, category=src.category or src.name, text_field=src.text_field,
                       txt_mode=src.txt_mode, stats=stats),
            src.max_documents, src.max_bytes,
        )
    for doc in docs:
        doc.category = src.category or doc.category
        yield doc


def _training_texts(cfg: RunConfig) -> Iterator[str]:
    """Training-split text, round-robin across sources so a byte cap still sees every source."""
    streams = [
        (d.text for split, d in split_documents(read_source(s, SourceStats()), cfg.seed, cfg.data.validation_fraction) if split == "train")
        for s in cfg.data.sources
    ]
    budget = cfg.data.tokenizer.train_max_bytes
    used = 0
    for group in itertools.zip_longest(*streams):
        for text in group:
            if text is None:
                continue
            if budget is not None and used >= budget:
                return
            used += len(text.encode("utf-8"))
            yield text


def _build_tokenizer(cfg: RunConfig, log: Callable[[str], None]):
    tok_cfg = cfg.data.tokenizer
    if tok_cfg.path is not None:
        tok = load_tokenizer(tok_cfg.path)
        if tok.get_vocab_size() > cfg.model.vocab_size:
            raise DataError(f"data.tokenizer.path={tok_cfg.path!r} has {tok.get_vocab_size()} tokens, more than "
                            f"model.vocab_size={cfg.model.vocab_size}: raise model.vocab_size")
        log(f"loaded tokenizer {tok_cfg.path} ({tok.get_vocab_size()} tokens)")
        return tok, {"source": "loaded", "path": tok_cfg.path}
    t0 = time.perf_counter()
    tok = train_tokenizer(_training_texts(cfg), cfg.model.vocab_size, min_frequency=tok_cfg.min_frequency)
    log(f"trained byte-level BPE: {tok.get_vocab_size()} tokens in {time.perf_counter() - t0:.1f}s")
    return tok, {"source": "trained", "min_frequency": tok_cfg.min_frequency, "train_max_bytes": tok_cfg.train_max_bytes}


def _write_source(src: SourceConfig, cfg: RunConfig, tok, dtype, out: Path, totals: dict) -> dict:
    """Tokenize one source into its train/validation shards; return its manifest entry."""
    stats = SourceStats()
    writers = {split: IndexedDatasetWriter(out / split / src.name, dtype) for split in SPLITS}
    counts = {split: {"documents": 0, "tokens": 0, "bytes": 0} for split in SPLITS}
    pending: dict[str, list[str]] = {split: [] for split in SPLITS}

    def flush(split: str) -> None:
        for ids in encode_batch(tok, pending[split]):
            writers[split].add_document(ids)
            counts[split]["tokens"] += len(ids)
        pending[split].clear()

    for split, doc in split_documents(read_source(src, stats), cfg.seed, cfg.data.validation_fraction):
        pending[split].append(doc.text)
        counts[split]["documents"] += 1
        counts[split]["bytes"] += len(doc.text.encode("utf-8"))
        if len(pending[split]) >= ENCODE_BATCH:
            flush(split)
    shards = {}
    for split in SPLITS:
        flush(split)
        info = writers[split].finalize()
        shards[split] = dict(info.to_dict(), path=f"{split}/{src.name}")
        for k in ("documents", "tokens", "bytes"):
            totals[split][k] += counts[split][k]
        totals[split]["shards"].append(shards[split])
    if stats.documents == 0:
        raise DataError(f"source '{src.name}' produced no documents (read {len(stats.files)} files, "
                        f"skipped {stats.skipped_empty} empty, {stats.skipped_non_utf8} non-UTF-8): check its paths and format")
    return {
        "name": src.name, "category": src.category, "builtin": src.builtin, "paths": src.paths,
        "stats": {k: v for k, v in vars(stats).items() if k != "files"}, "files": stats.files,
        "splits": counts,
    }


def prepare_data(cfg: RunConfig, *, overwrite: bool = False, log: Callable[[str], None] = print) -> PreparedData:
    """Prepare cfg.data.output_dir, or reuse it when it already holds data for this exact config."""
    out = Path(cfg.data.output_dir)
    identity = data_identity(cfg)
    if (out / MANIFEST).is_file() and not overwrite:
        existing = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
        if existing.get("identity") != identity:
            raise DataError(f"'{out}' holds data prepared from a different data config: "
                            "pass --overwrite to rebuild it (the old folder is moved aside) or set data.output_dir")
        log(f"reusing prepared data in {out}")
        return load_prepared(out, cfg.model.vocab_size)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        tok, tok_info = _build_tokenizer(cfg, log)
        tok.save(str(tmp / TOKENIZER))
        dtype = dtype_for_vocab(cfg.model.vocab_size)
        totals = {split: {"documents": 0, "tokens": 0, "bytes": 0, "shards": []} for split in SPLITS}
        sources = [_write_source(src, cfg, tok, dtype, tmp, totals) for src in cfg.data.sources]
        _check_splits(totals, cfg)
        manifest = {
            "format": "mindfoundry.data/1", "identity": identity, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "mindfoundry": mindfoundry.__version__, "seed": cfg.seed, "validation_fraction": cfg.data.validation_fraction,
            "dtype": str(dtype), "vocab_size": cfg.model.vocab_size,
            "tokenizer": dict(tok_info, file=TOKENIZER, sha256=tokenizer_hash(tok), vocab_size=tok.get_vocab_size()),
            "sources": sources, "splits": totals,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        out.rename(out.with_name(f"{out.name}.old-{time.strftime('%Y%m%d-%H%M%S')}"))
    out.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, out)
    t, v = totals["train"], totals["validation"]
    log(f"prepared {out}: train {t['documents']} docs / {t['tokens']:,} tokens, validation {v['documents']} docs / {v['tokens']:,} tokens")
    return load_prepared(out, cfg.model.vocab_size)


def _check_splits(totals: dict, cfg: RunConfig) -> None:
    if totals["train"]["documents"] == 0:
        raise DataError("the corpus is empty after reading: no training documents; check data.sources")
    if cfg.data.validation_fraction > 0 and totals["validation"]["documents"] == 0:
        raise DataError(f"no document fell into the validation split (data.validation_fraction={cfg.data.validation_fraction}): "
                        "raise the fraction or add documents")
