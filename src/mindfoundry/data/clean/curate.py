"""The curated corpus: every source read, cleaned by its profile, and deduplicated corpus-wide.

``prepare`` reads the corpus several times rather than holding it in memory, so every read must
produce exactly the same documents. The pre-pass (:func:`plan_corpus`) decides everything that
needs the whole corpus and keeps only hashes and ids:

1. boilerplate: document frequency of normalized lines, over the text as the boilerplate block
   sees it (after the blocks before it), for the sources whose profile runs that block;
2. dedup: every cleaned document is signed (exact key, MinHash) and goes through
   :meth:`Deduplicator.add_signed`, which returns the ids to drop.

Every later read (tokenizer training, shard writing) reads each source again, cleans it with the
same blocks and the same boilerplate lines, then filters it by the same dedup decisions, so the
tokenizer and the shards see the identical cleaned corpus.

Each read is a pass of :func:`curate`: the parent reads the sources in order and cuts them into
:class:`Chunk` s; a task (cleaning plus a per-document step: line keys, signatures, tokens) runs
on each chunk in ``data.workers`` processes (:mod:`mindfoundry.data.workers`) and its results
come back in corpus order, so every order-dependent decision is made in the parent, as with one
process, and the output does not depend on the number of workers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, TypeVar

import numpy as np

from mindfoundry.config.clean import CLEAN_BLOCKS
from mindfoundry.config.data import DataConfig, DedupConfig, SourceConfig
from mindfoundry.data.clean.base import BlockStats, event
from mindfoundry.data.clean.boilerplate import FrequentLines, LineCounter
from mindfoundry.data.clean.pipeline import CleaningPipeline, active_sections, build_pipeline, resolve_profile, with_profile
from mindfoundry.data.clean.dedup import DedupResult, Deduplicator, Signer, exact_key
from mindfoundry.data.document import Document
from mindfoundry.data.workers import DocumentProgress, PassProgress, WorkerPool, resolve_workers
from mindfoundry.data.ingest.builtin import read_builtin
from mindfoundry.data.ingest.files import FileLedger, SourceStats, read_files

R = TypeVar("R")

#: A chunk ends after this many documents or this many characters, whichever comes first.
CHUNK_DOCUMENTS = 512
CHUNK_CHARS = 256 * 1024


def _capped(docs: Iterable[Document], max_documents: int | None, max_bytes: int | None) -> Iterator[Document]:
    """First documents of a file source up to the caps (built-ins sample across the whole source instead)."""
    total = 0
    for i, doc in enumerate(docs):
        if (max_documents is not None and i >= max_documents) or (max_bytes is not None and total >= max_bytes):
            return
        total += len(doc.text.encode("utf-8"))
        yield doc


def read_source(src: SourceConfig, stats: SourceStats) -> Iterator[Document]:
    """Documents of one configured source, as read (before cleaning), tagged with its category."""
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


def clean_profile(data: DataConfig, src: SourceConfig) -> str:
    """The source's concrete cleaning profile (``none`` when ``data.clean.enabled`` is false)."""
    if not data.clean.enabled:
        return "none"
    return resolve_profile(src.clean.profile, src.category or src.name)


def clean_settings(data: DataConfig, src: SourceConfig) -> dict[str, dict[str, Any]]:
    """Each block's settings for this source: its own override section (already completed from ``data.clean``),
    else ``data.clean``'s with what the source's profile sets (:func:`with_profile`)."""
    profile = clean_profile(data, src)
    settings = {}
    for name in CLEAN_BLOCKS:
        own = getattr(src.clean, name)
        settings[name] = own.model_dump() if own is not None else with_profile(getattr(data.clean, name).model_dump(), name, profile)
    return settings


def runs_block(data: DataConfig, src: SourceConfig, block: str) -> bool:
    """Whether ``block`` is in this source's profile and enabled for it."""
    return block in active_sections(clean_settings(data, src), clean_profile(data, src))


@dataclass
class CorpusPlan:
    """What the pre-pass decided about the whole corpus (hashes and ids only, no text)."""

    frequent_lines: FrequentLines = FrequentLines()
    dedup: DedupResult | None = None
    seconds: float = 0.0
    files: FileLedger = field(default_factory=FileLedger)  # what every pass must find the source files to be


def chunked(docs: Iterable[Document]) -> Iterator[list[Document]]:
    """Consecutive documents, at most :data:`CHUNK_DOCUMENTS` or about :data:`CHUNK_CHARS` of text
    per chunk: big enough to amortize sending it to a worker, small enough to balance the load."""
    chunk: list[Document] = []
    chars = 0
    for doc in docs:
        chunk.append(doc)
        chars += len(doc.text)
        if len(chunk) >= CHUNK_DOCUMENTS or chars >= CHUNK_CHARS:
            yield chunk
            chunk, chars = [], 0
    if chunk:
        yield chunk


@dataclass(frozen=True)
class Chunk:
    """Consecutive documents of source number ``source``, as read (the unit a worker curates)."""

    source: int
    documents: list[Document]


@dataclass
class ChunkResult(Generic[R]):
    """A task's value for one chunk, with what the parent adds up: block counters and documents read."""

    source: int
    value: R
    block_stats: list[BlockStats]
    read: int
    events: list[dict[str, Any]] = field(default_factory=list)  # drop-log lines, when the curation logs them


@dataclass(frozen=True)
class Curation:
    """How to curate any chunk of the corpus: the data config, the pre-pass decisions made so far,
    and the block to stop before (the boilerplate pre-pass). Sent once to each worker."""

    data: DataConfig
    plan: CorpusPlan
    until: str | None = None
    log_events: bool = False  # collect a drop-log line per dropped or edited document (the shard pass)

    def pipeline(self, src: SourceConfig) -> CleaningPipeline:
        """The blocks of ``src``'s profile, with the corpus-wide boilerplate lines."""
        pipeline = build_pipeline(clean_settings(self.data, src), clean_profile(self.data, src),
                                  frequent_lines=self.plan.frequent_lines, until=self.until)
        for block in pipeline.blocks:
            block.log_events = self.log_events
        return pipeline

    def apply(self, chunk: Chunk, then: Callable[[list[Document]], R]) -> ChunkResult[R]:
        """Clean ``chunk`` with its source's blocks, drop what dedup dropped, and give the rest to ``then``.

        Blocks keep no state from one document to the next (only counters), so a fresh pipeline
        per chunk yields what one pipeline over the whole source would, and the counters add up.
        """
        pipeline = self.pipeline(self.data.sources[chunk.source])
        dedup = self.plan.dedup
        cleaned = list(pipeline.run(chunk.documents))
        kept = [doc for doc in cleaned if dedup is None or dedup.keeps(doc)]
        events = [e for block in pipeline.blocks for e in block.events]
        if self.log_events and dedup is not None and len(kept) < len(cleaned):
            events += [dedup_event(doc, dedup, self.data.dedup.threshold) for doc in cleaned if not dedup.keeps(doc)]
        order = {(doc.path, doc.record): i for i, doc in enumerate(chunk.documents)}
        events.sort(key=lambda e: order.get((e["path"], e["record"]), 0))
        return ChunkResult(chunk.source, then(kept), [block.stats for block in pipeline.blocks], len(chunk.documents), events)


def dedup_event(doc: Document, dedup: DedupResult, threshold: float) -> dict[str, Any]:
    """The drop-log line of a document dedup dropped: the twin that stays and their Jaccard similarity."""
    twin = dedup.twins[doc.id]
    return event(doc, "dedup", "drop", twin.kind, twin.jaccard, 1.0 if twin.kind == "exact" else threshold, doc.text,
                 kept=twin.kept, jaccard=None if twin.jaccard is None else round(twin.jaccard, 4))


def cleaned_documents(curation: Curation, chunk: Chunk) -> ChunkResult[list[Document]]:
    """Task: the curated documents of a chunk (tokenizer training, exact dedup verification)."""
    return curation.apply(chunk, list)


def line_counts(curation: Curation, chunk: Chunk) -> ChunkResult[LineCounter]:
    """Task: document frequency of the chunk's boilerplate-candidate lines (keys only)."""

    def count(docs: list[Document]) -> LineCounter:
        settings = curation.data.clean.boilerplate
        counter = LineCounter(settings.min_line_chars, settings.edge_lines)
        for doc in docs:
            counter.add(doc.text, doc.source)
        return counter

    return curation.apply(chunk, count)


def signed_documents(curation: Curation, chunk: Chunk) -> ChunkResult[Signatures]:
    """Task: exact-dedup keys and MinHash signatures of the chunk's cleaned documents."""
    return curation.apply(chunk, partial(sign_documents, curation.data.dedup))


class CuratedSource:
    """The parent's side of one read of one source: it reads the documents (so reading counters
    fill here) and adds up the block counters of the chunks that workers curated."""

    def __init__(self, curation: Curation, index: int) -> None:
        self.index = index
        self.src = curation.data.sources[index]
        self.plan = curation.plan
        self.stats = SourceStats(ledger=curation.plan.files)
        self.profile = clean_profile(curation.data, self.src)
        self.pipeline = curation.pipeline(self.src)  # counters only: documents go through the tasks' pipelines

    def chunks(self) -> Iterator[Chunk]:
        """The source read in order, in chunks (the reading counters fill as they are drawn)."""
        return (Chunk(self.index, docs) for docs in chunked(read_source(self.src, self.stats)))

    def add(self, result: ChunkResult[Any]) -> None:
        """Count what a chunk's pipeline did into this source's blocks."""
        for block, stats in zip(self.pipeline.blocks, result.block_stats, strict=True):
            block.stats.merge(stats)

    def removed(self) -> dict[str, int]:
        """``{"block.reason": documents}`` for every non-zero drop, cleaning then dedup."""
        out = {
            f"{block}.{reason}": n
            for block, stats in self.pipeline.report().items()
            for reason, n in stats["dropped"].items()
        }
        if self.plan.dedup is not None:
            by_source = self.plan.dedup.report["removed_by_source"].get(self.src.name, {})
            out.update({f"dedup.{kind}": n for kind, n in sorted(by_source.items())})
        return {key: n for key, n in out.items() if n}


def curate(sources: Sequence[CuratedSource], pool: WorkerPool[Any], task: Callable[[Any, Chunk], ChunkResult[R]],
           progress: PassProgress, *, window: int | None = None,
           drop_log: Callable[[list[dict[str, Any]]], None] | None = None) -> Iterator[tuple[CuratedSource, R]]:
    """``task`` over every chunk of ``sources`` on ``pool``: each chunk's value with its source, in corpus order.

    One stream over all the sources keeps the workers busy across source boundaries. ``drop_log``
    receives each chunk's drop-log lines, in corpus order.
    """
    by_index = {source.index: source for source in sources}
    chunks = (chunk for source in sources for chunk in source.chunks())
    for result in pool.map(task, chunks, window=window):
        source = by_index[result.source]
        source.add(result)
        if drop_log is not None:
            drop_log(result.events)
        progress.advance(source.src.name, result.read)
        yield source, result.value


def curated_sources(curation: Curation, indices: Iterable[int] | None = None) -> list[CuratedSource]:
    """A fresh read of the given sources (all, by default), in config order."""
    return [CuratedSource(curation, i) for i in (range(len(curation.data.sources)) if indices is None else indices)]


def plan_corpus(data: DataConfig, log: Callable[[str], None], progress: DocumentProgress) -> CorpusPlan:
    """The pre-pass: boilerplate line counts, then dedup decisions over the cleaned corpus."""
    start = time.perf_counter()
    workers = resolve_workers(data.workers)
    files = FileLedger()
    plan = CorpusPlan(frequent_lines=_frequent_lines(data, workers, progress, files), files=files)
    if plan.frequent_lines:
        settings = data.clean.boilerplate
        log(f"boilerplate: {len(plan.frequent_lines.body)} lines occur in >= {settings.min_documents} documents, "
            f"{len(plan.frequent_lines.edges)} header/footer lines open or close >= {settings.min_source_share:.0%} of their source's")
    if data.dedup.enabled:
        plan.dedup = _deduplicate(data, plan, workers, progress)
        report = plan.dedup.report
        log(f"dedup: {report['documents']} documents, removed {report['exact']['removed']} exact and "
            f"{report['near']['removed']} near duplicates ({report['near']['clusters']} clusters) "
            f"in {report['seconds']:.1f}s")
    plan.seconds = time.perf_counter() - start
    return plan


def _frequent_lines(data: DataConfig, workers: int, progress: DocumentProgress, files: FileLedger) -> FrequentLines:
    """Keys of boilerplate lines, counted over the sources that run the boilerplate block."""
    curation = Curation(data, CorpusPlan(files=files), until="boilerplate")
    sources = curated_sources(curation, [i for i, src in enumerate(data.sources) if runs_block(data, src, "boilerplate")])
    if not sources:
        return FrequentLines()
    settings = data.clean.boilerplate
    counter = LineCounter(settings.min_line_chars, settings.edge_lines)
    with WorkerPool(workers, curation) as pool, progress.stage("boilerplate lines", [s.src.name for s in sources]) as stage:
        for _, counts in curate(sources, pool, line_counts, stage):
            counter.merge(counts)
    return counter.frequent(settings.min_documents, settings.min_source_share)


def _deduplicate(data: DataConfig, plan: CorpusPlan, workers: int, progress: DocumentProgress) -> DedupResult:
    """Dedup decisions over the corpus as cleaned with the boilerplate lines of ``plan``: workers
    sign the documents, the parent decides in corpus order."""
    deduplicator = Deduplicator(**data.dedup.model_dump(exclude={"enabled"}))
    curation = Curation(data, plan)
    names = [src.name for src in data.sources]

    with WorkerPool(workers, curation) as pool:
        def cleaned_corpus() -> Iterator[Document]:
            with progress.stage("dedup verify", names) as stage:
                for _, docs in curate(curated_sources(curation), pool, cleaned_documents, stage):
                    yield from docs

        with progress.stage("dedup", names) as stage:
            for _, signatures in curate(curated_sources(curation), pool, signed_documents, stage):
                for i, doc in enumerate(signatures.documents):  # chunk signing time counted once
                    deduplicator.add_signed(doc.id, doc.origin, doc.exact_key, doc.signature, signatures.seconds if i == 0 else 0.0)
        return deduplicator.finish(reread=cleaned_corpus)


@dataclass(frozen=True, slots=True)
class SignedDocument:
    """What dedup needs of one cleaned document, computed in a worker (never its text)."""

    id: str
    origin: dict[str, str | int]
    exact_key: int | None  # None when exact dedup is off
    signature: np.ndarray | None  # None when near dedup is off


@dataclass
class Signatures:
    """A chunk's documents, signed, and the seconds signing took (part of dedup's reported time)."""

    documents: list[SignedDocument]
    seconds: float


def sign_documents(settings: DedupConfig, docs: list[Document]) -> Signatures:
    """The exact key and MinHash signature of each document, computed as :class:`Deduplicator` does."""
    start = time.perf_counter()
    signer = Signer(shingle=settings.shingle, char_ngram=settings.char_ngram, word_ngram=settings.word_ngram,
                    num_perm=settings.num_perm, seed=settings.seed)
    signed = [SignedDocument(doc.id, doc.origin(), exact_key(doc.text) if settings.exact else None,
                             signer.sign(doc.text) if settings.near else None) for doc in docs]
    return Signatures(signed, time.perf_counter() - start)


@dataclass
class CurationReport:
    """What the shard-writing pass saw per source: cleaning block counts (and sums), read notes."""

    sources: dict[str, dict[str, Any]] = field(default_factory=dict)
    totals: dict[str, BlockStats] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, curated: CuratedSource) -> None:
        self.sources[curated.src.name] = {"profile": curated.profile, "blocks": curated.pipeline.report()}
        for block in curated.pipeline.blocks:
            self.totals.setdefault(block.name, BlockStats()).merge(block.stats)
        self.notes.extend(curated.stats.notes)

    def blocks(self) -> dict[str, Any]:
        """Per-source profile and block counts, and each block's counts summed over sources."""
        return {"sources": self.sources, "totals": {name: stats.to_dict() for name, stats in self.totals.items()}}
