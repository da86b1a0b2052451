"""The curated corpus: every source read, cleaned by its profile, and deduplicated corpus-wide.

``prepare`` reads the corpus several times rather than holding it in memory, so every read must
produce exactly the same documents. The pre-pass (:func:`plan_corpus`) decides everything that
needs the whole corpus and keeps only hashes and ids:

1. boilerplate: document frequency of normalized lines, over the text as the boilerplate block
   sees it (after the blocks before it), for the sources whose profile runs that block;
2. dedup: every cleaned document goes through :class:`~mindfoundry.data.dedup.Deduplicator`,
   which returns the ids to drop.

Every later read (tokenizer training, shard writing) is a :class:`CuratedSource`: the source read
again, cleaned with the same blocks and the same boilerplate lines, then filtered by the same
dedup decisions, so the tokenizer and the shards see the identical cleaned corpus.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from mindfoundry.config.schema import CLEAN_BLOCKS, DataConfig, SourceConfig
from mindfoundry.data.blocks.base import BlockStats
from mindfoundry.data.blocks.boilerplate import LineCounter
from mindfoundry.data.blocks.pipeline import CleaningPipeline, active_sections, build_pipeline, resolve_profile
from mindfoundry.data.dedup import DedupResult, Deduplicator
from mindfoundry.data.document import Document
from mindfoundry.data.sources import SourceStats, read_builtin, read_files


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
    """Each block's settings for this source: its own override section, else ``data.clean``'s."""
    return {name: (getattr(src.clean, name) or getattr(data.clean, name)).model_dump() for name in CLEAN_BLOCKS}


def runs_block(data: DataConfig, src: SourceConfig, block: str) -> bool:
    """Whether ``block`` is in this source's profile and enabled for it."""
    return block in active_sections(clean_settings(data, src), clean_profile(data, src))


@dataclass
class CorpusPlan:
    """What the pre-pass decided about the whole corpus (hashes and ids only, no text)."""

    frequent_lines: frozenset[int] = frozenset()
    dedup: DedupResult | None = None
    seconds: float = 0.0


class CuratedSource:
    """One read of one source: read, clean, drop what dedup dropped. Counters fill as it streams."""

    def __init__(self, data: DataConfig, src: SourceConfig, plan: CorpusPlan, *, until: str | None = None) -> None:
        self.src = src
        self.plan = plan
        self.stats = SourceStats()
        self.profile = clean_profile(data, src)
        self.pipeline: CleaningPipeline = build_pipeline(
            clean_settings(data, src), self.profile, frequent_lines=plan.frequent_lines, until=until
        )

    def documents(self) -> Iterator[Document]:
        docs = self.pipeline.run(read_source(self.src, self.stats))
        dedup = self.plan.dedup
        return docs if dedup is None else (doc for doc in docs if dedup.keeps(doc))

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


def plan_corpus(data: DataConfig, log: Callable[[str], None]) -> CorpusPlan:
    """The pre-pass: boilerplate line counts, then dedup decisions over the cleaned corpus."""
    start = time.perf_counter()
    plan = CorpusPlan(frequent_lines=_frequent_lines(data))
    if plan.frequent_lines:
        log(f"boilerplate: {len(plan.frequent_lines)} lines occur in >= {data.clean.boilerplate.min_documents} documents")
    if data.dedup.enabled:
        plan.dedup = _deduplicate(data, plan)
        report = plan.dedup.report
        log(f"dedup: {report['documents']} documents, removed {report['exact']['removed']} exact and "
            f"{report['near']['removed']} near duplicates ({report['near']['clusters']} clusters) "
            f"in {report['seconds']:.1f}s")
    plan.seconds = time.perf_counter() - start
    return plan


def _frequent_lines(data: DataConfig) -> frozenset[int]:
    """Keys of boilerplate lines, counted over the sources that run the boilerplate block."""
    sources = [src for src in data.sources if runs_block(data, src, "boilerplate")]
    if not sources:
        return frozenset()
    settings = data.clean.boilerplate
    counter = LineCounter(settings.min_line_chars)
    for src in sources:
        counter.add_all(doc.text for doc in CuratedSource(data, src, CorpusPlan(), until="boilerplate").documents())
    return counter.frequent(settings.min_documents)


def _deduplicate(data: DataConfig, plan: CorpusPlan) -> DedupResult:
    """Dedup decisions over the corpus as cleaned with the boilerplate lines of ``plan``."""
    deduplicator = Deduplicator(**data.dedup.model_dump(exclude={"enabled"}))

    def cleaned_corpus() -> Iterator[Document]:
        return itertools.chain.from_iterable(CuratedSource(data, src, plan).documents() for src in data.sources)

    deduplicator.add_all(cleaned_corpus())
    return deduplicator.finish(reread=cleaned_corpus)


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
