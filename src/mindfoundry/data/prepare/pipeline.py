"""`mindfoundry prepare`: raw text -> clean -> dedup -> split by document -> BPE tokenizer -> Megatron shards.

Streaming passes over the sources keep memory bounded (see :mod:`mindfoundry.data.clean.curate`): a
pre-pass counts boilerplate lines and decides dedup (hashes and ids only), then one pass feeds
the training split of the curated corpus to the tokenizer trainer and a last one tokenizes every
curated document into its split's shard. Everything is written into a temporary folder that is
renamed into place only when complete; the manifest records what each cleaning block and dedup
removed, per source and why. ``data.workers`` processes do the per-document work of every pass
(:mod:`mindfoundry.data.workers`); the parent reads, decides and writes in corpus order, so the
output is byte-identical for any number of workers.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

import mindfoundry
from mindfoundry.config.load import identity_view
from mindfoundry.config.schema import RunConfig
from mindfoundry.data.clean.curate import Chunk, ChunkResult, CorpusPlan, Curation, CuratedSource, CurationReport, cleaned_documents, curate, curated_sources, plan_corpus
from mindfoundry.data.clean.droplog import DROPS_FILE, DropLog
from mindfoundry.data.document import Document
from mindfoundry.data.dataset.indexed import IndexedDatasetWriter, dtype_for_vocab
from mindfoundry.data.workers import IN_FLIGHT_PER_WORKER, DocumentProgress, PassProgress, WorkerPool, resolve_workers
from mindfoundry.data.dataset.prepared import MANIFEST, SPLITS, TOKENIZER, DataError, PreparedData, load_prepared, read_manifest
from mindfoundry.data.prepare.split import Split, split_documents
from mindfoundry.data.prepare.tokenizer import encode_batch, load_tokenizer, tokenizer_hash, train_tokenizer, with_mask_token


def data_identity(cfg: RunConfig) -> str:
    """What determines the prepared data: the data section, the seed, the vocabulary size and, for the mlm
    objective, the mask token in the tokenizer.

    The mixture only changes the order in which training draws samples, not the shards, so it is
    left out: changing the weights must not force a re-prepare.
    """
    key = {"data": identity_view(_data_section(cfg), "data."), "seed": cfg.seed, "vocab_size": cfg.model.vocab_size}
    if cfg.model.objective == "mlm":  # a clm tokenizer has no mask token (and clm identities stay as they were)
        key["mask_token"] = True
    return _sha256_json(key)


def _data_section(cfg: RunConfig) -> dict[str, Any]:
    """The data config that shapes the shards (cleaning and dedup included; not where they go, not the
    mixture, not how many processes make them: the output is the same for any ``workers``)."""
    return cfg.data.model_dump(mode="json", exclude={"output_dir", "mixture", "workers"})


def _sha256_json(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _training_texts(cfg: RunConfig, curation: Curation, pool: WorkerPool[Curation], stage: PassProgress) -> Iterator[str]:
    """Curated training-split text, round-robin across sources so a byte cap still sees every source."""
    sources = curated_sources(curation)
    # Each source is its own stream (round-robin): they share the pool's read-ahead, each keeping some.
    window = max(IN_FLIGHT_PER_WORKER, -(-IN_FLIGHT_PER_WORKER * pool.workers // len(sources)))

    def train_split(source: CuratedSource) -> Iterator[str]:
        docs = (doc for _, chunk in curate([source], pool, cleaned_documents, stage, window=window) for doc in chunk)
        return (doc.text for split, doc in split_documents(docs, cfg.seed, cfg.data.validation_fraction) if split == "train")

    budget = cfg.data.tokenizer.train_max_bytes
    used = 0
    for group in itertools.zip_longest(*(train_split(source) for source in sources)):
        for text in group:
            if text is None:
                continue
            if budget is not None and used >= budget:
                return
            used += len(text.encode("utf-8"))
            yield text


def _build_tokenizer(cfg: RunConfig, plan: CorpusPlan, progress: DocumentProgress, log: Callable[[str], None]):
    tok_cfg = cfg.data.tokenizer
    mlm = cfg.model.objective == "mlm"
    if tok_cfg.path is not None:
        tok = load_tokenizer(tok_cfg.path)
        if tok.get_vocab_size() > cfg.model.vocab_size:
            raise DataError(f"data.tokenizer.path={tok_cfg.path!r} has {tok.get_vocab_size()} tokens, more than "
                            f"model.vocab_size={cfg.model.vocab_size}: raise model.vocab_size")
        if mlm:
            tok = with_mask_token(tok, cfg.model.vocab_size)
        log(f"loaded tokenizer {tok_cfg.path} ({tok.get_vocab_size()} tokens{', mask token added' if mlm else ''})")
        return tok, {"source": "loaded", "path": tok_cfg.path}
    t0 = time.perf_counter()
    curation = Curation(cfg.data, plan)
    with (WorkerPool(resolve_workers(cfg.data.workers), curation) as pool,
          progress.stage("tokenizer", [src.name for src in cfg.data.sources]) as stage):
        tok = train_tokenizer(_training_texts(cfg, curation, pool, stage), cfg.model.vocab_size, min_frequency=tok_cfg.min_frequency,
                              mask_token=mlm)
    log(f"trained byte-level BPE: {tok.get_vocab_size()} tokens in {time.perf_counter() - t0:.1f}s")
    return tok, {"source": "trained", "min_frequency": tok_cfg.min_frequency, "train_max_bytes": tok_cfg.train_max_bytes}


#: One document of a shard-pass chunk: its split, token ids (ending with EOS), UTF-8 bytes of its text.
Encoded = tuple[Split, np.ndarray, int]


@dataclass(frozen=True)
class ShardWork:
    """What a worker needs to turn a chunk into shard entries (sent once to each worker)."""

    curation: Curation
    tokenizer_path: str
    seed: int
    validation_fraction: float

    @cached_property
    def tokenizer(self) -> Tokenizer:
        """Loaded from the file, not pickled: the file keeps every setting (special-token handling)."""
        return load_tokenizer(self.tokenizer_path)

    def encode(self, docs: list[Document]) -> list[Encoded]:
        """Split and tokenize curated documents, in order (one ``encode_batch`` for the whole chunk)."""
        labelled = list(split_documents(docs, self.seed, self.validation_fraction))
        ids = encode_batch(self.tokenizer, [doc.text for _, doc in labelled])
        return [(split, tokens, len(doc.text.encode("utf-8"))) for (split, doc), tokens in zip(labelled, ids, strict=True)]


def encoded_documents(work: ShardWork, chunk: Chunk) -> ChunkResult[list[Encoded]]:
    """Task: the chunk curated, split and tokenized."""
    return work.curation.apply(chunk, work.encode)


class _SourceShards:
    """One source's train/validation shards, written by the parent in corpus order."""

    def __init__(self, curated: CuratedSource, out: Path, dtype: np.dtype) -> None:
        self.curated = curated
        self.writers = {split: IndexedDatasetWriter(out / split / curated.src.name, dtype) for split in SPLITS}
        self.counts = {split: {"documents": 0, "tokens": 0, "bytes": 0} for split in SPLITS}

    def add(self, encoded: list[Encoded]) -> None:
        for split, ids, size in encoded:
            self.writers[split].add_document(ids)
            counts = self.counts[split]
            counts["documents"] += 1
            counts["tokens"] += len(ids)
            counts["bytes"] += size

    def finish(self, totals: dict, cleaning: CurationReport) -> dict:
        """Finalize the shards, add them to ``totals``; return the source's manifest entry."""
        src, curated = self.curated.src, self.curated
        for split in SPLITS:
            info = self.writers[split].finalize().to_dict()
            del info["path_prefix"]  # the temporary folder's path; "path" is relative to the data folder
            totals[split]["shards"].append(dict(info, path=f"{split}/{src.name}"))
            for k in ("documents", "tokens", "bytes"):
                totals[split][k] += self.counts[split][k]
        kept = sum(c["documents"] for c in self.counts.values())
        _check_source(curated, kept)
        cleaning.add(curated)
        return {
            "name": src.name, "category": src.category, "builtin": src.builtin, "paths": src.paths,
            "stats": curated.stats.counters(), "removed": curated.removed(), "kept": kept,
            "files": curated.stats.files, "splits": self.counts,
        }


def _write_shards(cfg: RunConfig, plan: CorpusPlan, tokenizer_path: Path, dtype: np.dtype, out: Path, totals: dict,
                  cleaning: CurationReport, progress: DocumentProgress) -> list[dict]:
    """Tokenize every curated source into its train/validation shards, logging every document dropped or
    edited on the way (:data:`~mindfoundry.data.clean.droplog.DROPS_FILE`); return their manifest entries.

    Results arrive in corpus order, so each source's shards are finalized as soon as the stream
    moves past it: only one source's files are open at a time.
    """
    work = ShardWork(Curation(cfg.data, plan, log_events=True), str(tokenizer_path), cfg.seed, cfg.data.validation_fraction)
    sources = curated_sources(work.curation)
    entries: list[dict] = []
    shards = _SourceShards(sources[0], out, dtype)
    with (WorkerPool(resolve_workers(cfg.data.workers), work) as pool, DropLog(out / DROPS_FILE) as drop_log,
          progress.stage("shards", [src.name for src in cfg.data.sources]) as stage):
        for curated, encoded in curate(sources, pool, encoded_documents, stage, drop_log=drop_log):
            while shards.curated is not curated:  # the stream moved on: the sources before are complete
                entries.append(shards.finish(totals, cleaning))
                shards = _SourceShards(sources[len(entries)], out, dtype)
            shards.add(encoded)
    entries.append(shards.finish(totals, cleaning))
    for curated in sources[len(entries):]:  # read no document at all: finish() says why
        entries.append(_SourceShards(curated, out, dtype).finish(totals, cleaning))
    return entries


def _check_source(curated: CuratedSource, kept: int) -> None:
    """A source that yields nothing is a mistake: say whether reading or curation emptied it."""
    name, stats = curated.src.name, curated.stats
    if stats.documents == 0:
        notes = "; ".join(stats.notes)
        raise DataError(f"source '{name}' produced no documents (read {len(stats.files)} files, skipped {stats.skipped_empty} empty, "
                        f"{stats.skipped_too_long} too long, {stats.skipped_non_utf8} non-UTF-8, "
                        f"{stats.skipped_missing_text} without the text field"
                        f"{'; ' + notes if notes else ''}): check its paths and format")
    if kept == 0:
        reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(curated.removed().items(), key=lambda kv: -kv[1])[:3])
        raise DataError(f"source '{name}': all {stats.documents} documents it read were removed ({reasons}): "
                        f"relax those limits in data.clean, or set this source's clean.profile (e.g. 'code' or 'none')")


def _source_line(entry: dict) -> str:
    """One log line per source: read, skipped on reading, removed by curation, kept."""
    stats = entry["stats"]
    skipped = {k.removeprefix("skipped_"): n for k, n in stats.items() if k.startswith("skipped_") and n}
    removed = sorted(entry["removed"].items(), key=lambda kv: -kv[1])
    parts = [f"{entry['name']}: read {stats['documents']}"]
    if skipped:
        parts.append("skipped " + ", ".join(f"{n} {reason}" for reason, n in skipped.items()))
    if removed:
        top = ", ".join(f"{n} {reason}" for reason, n in removed[:4])
        parts.append(f"removed {sum(n for _, n in removed)} ({top}{', ...' if len(removed) > 4 else ''})")
    parts.append(f"kept {entry['kept']}")
    return "; ".join(parts)


def prepare_data(cfg: RunConfig, *, overwrite: bool = False, log: Callable[[str], None] = print) -> PreparedData:
    """Prepare cfg.data.output_dir, or reuse it when it already holds data for this exact config."""
    out = Path(cfg.data.output_dir)
    identity = data_identity(cfg)
    if (out / MANIFEST).is_file() and not overwrite:
        existing, _ = read_manifest(out)
        if existing.get("identity") != identity:
            raise DataError(f"'{out}' holds data prepared from a different data config: "
                            "pass --overwrite to rebuild it (the old folder is moved aside) or set data.output_dir")
        log(f"reusing prepared data in {out}")
        return load_prepared(out, cfg.model.vocab_size)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        manifest = {"identity": identity, **_build(cfg, tmp, log)}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        out.rename(out.with_name(f"{out.name}.old-{time.strftime('%Y%m%d-%H%M%S')}"))
    out.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, out)
    t, v = manifest["splits"]["train"], manifest["splits"]["validation"]
    log(f"prepared {out}: train {t['documents']} docs / {t['tokens']:,} tokens, validation {v['documents']} docs / {v['tokens']:,} tokens")
    return load_prepared(out, cfg.model.vocab_size)


def wait_for_prepared(cfg: RunConfig, *, timeout_s: float = 24 * 3600, poll_s: float = 2.0) -> PreparedData:
    """Wait for another process (rank 0 of a launch) to finish preparing cfg.data.output_dir, then load it.

    Preparation ends with one atomic rename, so the manifest appears only when everything is in
    place; this process never writes.
    """
    out = Path(cfg.data.output_dir)
    deadline = time.monotonic() + timeout_s
    while not (out / MANIFEST).is_file():
        if time.monotonic() > deadline:
            raise DataError(f"'{out}' was not prepared within {timeout_s:.0f} s by rank 0: check rank 0's log")
        time.sleep(poll_s)
    existing, _ = read_manifest(out)
    if existing.get("identity") != data_identity(cfg):
        raise DataError(f"'{out}' holds data prepared from a different data config than this rank's: "
                        "all ranks must run the same config")
    return load_prepared(out, cfg.model.vocab_size)


def _build(cfg: RunConfig, tmp: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """The three streaming passes into ``tmp``; return the manifest (without its identity).

    1. plan (:func:`~mindfoundry.data.clean.curate.plan_corpus`): boilerplate lines counted and dedup
       decided over the whole corpus (hashes and ids only);
    2. tokenizer: the training split of the curated corpus fed to the BPE trainer (skipped for a loaded one);
    3. shards: every curated document split and tokenized into its source's train/validation shard.
    Passes 2 and 3 stream the corpus through :func:`~mindfoundry.data.clean.curate.curate` on the worker
    pool with their own task; the plan of pass 1 is what makes them decide the same way.
    """
    start = time.perf_counter()
    dtype = dtype_for_vocab(cfg.model.vocab_size)
    totals = {split: {"documents": 0, "tokens": 0, "bytes": 0, "shards": []} for split in SPLITS}
    cleaning = CurationReport()
    with DocumentProgress(log) as progress:
        plan = plan_corpus(cfg.data, log, progress)
        tok, tok_info = _build_tokenizer(cfg, plan, progress, log)
        tok.save(str(tmp / TOKENIZER))
        tokenizer_done = time.perf_counter()
        sources = _write_shards(cfg, plan, tmp / TOKENIZER, dtype, tmp, totals, cleaning, progress)
    for entry in sources:
        log(_source_line(entry))
    _check_splits(totals, cfg)
    data_section = _data_section(cfg)
    return {
        "format": "mindfoundry.data/1", "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "mindfoundry": mindfoundry.__version__, "seed": cfg.seed, "validation_fraction": cfg.data.validation_fraction,
        "dtype": str(dtype), "vocab_size": cfg.model.vocab_size,
        "tokenizer": dict(tok_info, file=TOKENIZER, sha256=tokenizer_hash(tok), vocab_size=tok.get_vocab_size()),
        "data_config": data_section, "data_config_sha256": _sha256_json(data_section),
        "sources": sources, "splits": totals,
        "cleaning": cleaning.blocks(),
        "dedup": plan.dedup.report if plan.dedup is not None else {"enabled": False},
        "notes": cleaning.notes,
        "timings": {"pre_pass_s": round(plan.seconds, 2), "tokenizer_s": round(tokenizer_done - start - plan.seconds, 2),
                    "shards_s": round(time.perf_counter() - tokenizer_done, 2), "total_s": round(time.perf_counter() - start, 2)},
    }


def _check_splits(totals: dict, cfg: RunConfig) -> None:
    if totals["train"]["documents"] == 0:
        raise DataError("the corpus is empty after reading: no training documents; check data.sources")
    if cfg.data.validation_fraction > 0 and totals["validation"]["documents"] == 0:
        raise DataError(f"no document fell into the validation split (data.validation_fraction={cfg.data.validation_fraction}): "
                        "raise the fraction or add documents")
