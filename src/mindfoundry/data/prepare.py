"""`mindfoundry prepare`: raw text -> clean -> dedup -> split by document -> BPE tokenizer -> Megatron shards.

Streaming passes over the sources keep memory bounded (see :mod:`mindfoundry.data.curate`): a
pre-pass counts boilerplate lines and decides dedup (hashes and ids only), then one pass feeds
the training split of the curated corpus to the tokenizer trainer and a last one tokenizes every
curated document into its split's shard. Everything is written into a temporary folder that is
renamed into place only when complete; the manifest records what each cleaning block and dedup
removed, per source and why.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import mindfoundry
from mindfoundry.config.schema import RunConfig, SourceConfig
from mindfoundry.data.curate import CurationReport, CorpusPlan, CuratedSource, plan_corpus
from mindfoundry.data.indexed import IndexedDatasetWriter, dtype_for_vocab
from mindfoundry.data.prepared import MANIFEST, SPLITS, TOKENIZER, DataError, PreparedData, load_prepared
from mindfoundry.data.split import split_documents
from mindfoundry.data.tokenizer import encode_batch, load_tokenizer, tokenizer_hash, train_tokenizer

ENCODE_BATCH = 512


def data_identity(cfg: RunConfig) -> str:
    """What determines the prepared data: the data section, the seed and the vocabulary size.

    The mixture only changes the order in which training draws samples, not the shards, so it is
    left out: changing the weights must not force a re-prepare.
    """
    key = {"data": _data_section(cfg), "seed": cfg.seed, "vocab_size": cfg.model.vocab_size}
    return _sha256_json(key)


def _data_section(cfg: RunConfig) -> dict[str, Any]:
    """The data config that shapes the shards (cleaning and dedup included; not where they go, not the mixture)."""
    return cfg.data.model_dump(mode="json", exclude={"output_dir", "mixture"})


def _sha256_json(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _training_texts(cfg: RunConfig, plan: CorpusPlan) -> Iterator[str]:
    """Curated training-split text, round-robin across sources so a byte cap still sees every source."""
    streams = [
        (d.text for split, d in split_documents(CuratedSource(cfg.data, s, plan).documents(), cfg.seed, cfg.data.validation_fraction)
         if split == "train")
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


def _build_tokenizer(cfg: RunConfig, plan: CorpusPlan, log: Callable[[str], None]):
    tok_cfg = cfg.data.tokenizer
    if tok_cfg.path is not None:
        tok = load_tokenizer(tok_cfg.path)
        if tok.get_vocab_size() > cfg.model.vocab_size:
            raise DataError(f"data.tokenizer.path={tok_cfg.path!r} has {tok.get_vocab_size()} tokens, more than "
                            f"model.vocab_size={cfg.model.vocab_size}: raise model.vocab_size")
        log(f"loaded tokenizer {tok_cfg.path} ({tok.get_vocab_size()} tokens)")
        return tok, {"source": "loaded", "path": tok_cfg.path}
    t0 = time.perf_counter()
    tok = train_tokenizer(_training_texts(cfg, plan), cfg.model.vocab_size, min_frequency=tok_cfg.min_frequency)
    log(f"trained byte-level BPE: {tok.get_vocab_size()} tokens in {time.perf_counter() - t0:.1f}s")
    return tok, {"source": "trained", "min_frequency": tok_cfg.min_frequency, "train_max_bytes": tok_cfg.train_max_bytes}


def _write_source(src: SourceConfig, cfg: RunConfig, plan: CorpusPlan, tok, dtype, out: Path, totals: dict,
                  cleaning: CurationReport) -> dict:
    """Tokenize one curated source into its train/validation shards; return its manifest entry."""
    curated = CuratedSource(cfg.data, src, plan)
    writers = {split: IndexedDatasetWriter(out / split / src.name, dtype) for split in SPLITS}
    counts = {split: {"documents": 0, "tokens": 0, "bytes": 0} for split in SPLITS}
    pending: dict[str, list[str]] = {split: [] for split in SPLITS}

    def flush(split: str) -> None:
        for ids in encode_batch(tok, pending[split]):
            writers[split].add_document(ids)
            counts[split]["tokens"] += len(ids)
        pending[split].clear()

    for split, doc in split_documents(curated.documents(), cfg.seed, cfg.data.validation_fraction):
        pending[split].append(doc.text)
        counts[split]["documents"] += 1
        counts[split]["bytes"] += len(doc.text.encode("utf-8"))
        if len(pending[split]) >= ENCODE_BATCH:
            flush(split)
    for split in SPLITS:
        flush(split)
        shard = dict(writers[split].finalize().to_dict(), path=f"{split}/{src.name}")
        for k in ("documents", "tokens", "bytes"):
            totals[split][k] += counts[split][k]
        totals[split]["shards"].append(shard)
    kept = sum(c["documents"] for c in counts.values())
    _check_source(curated, kept)
    cleaning.add(curated)
    return {
        "name": src.name, "category": src.category, "builtin": src.builtin, "paths": src.paths,
        "stats": curated.stats.counters(), "removed": curated.removed(), "kept": kept,
        "files": curated.stats.files, "splits": counts,
    }


def _check_source(curated: CuratedSource, kept: int) -> None:
    """A source that yields nothing is a mistake: say whether reading or curation emptied it."""
    name, stats = curated.src.name, curated.stats
    if stats.documents == 0:
        notes = "; ".join(stats.notes)
        raise DataError(f"source '{name}' produced no documents (read {len(stats.files)} files, skipped {stats.skipped_empty} empty, "
                        f"{stats.skipped_non_utf8} non-UTF-8, {stats.skipped_missing_text} without the text field"
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


def _build(cfg: RunConfig, tmp: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Pre-pass, tokenizer and shards into ``tmp``; return the manifest (without its identity)."""
    start = time.perf_counter()
    plan = plan_corpus(cfg.data, log)
    tok, tok_info = _build_tokenizer(cfg, plan, log)
    tok.save(str(tmp / TOKENIZER))
    tokenizer_done = time.perf_counter()
    dtype = dtype_for_vocab(cfg.model.vocab_size)
    totals = {split: {"documents": 0, "tokens": 0, "bytes": 0, "shards": []} for split in SPLITS}
    cleaning = CurationReport()
    sources = [_write_source(src, cfg, plan, tok, dtype, tmp, totals, cleaning) for src in cfg.data.sources]
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
