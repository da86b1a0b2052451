"""The cleaning stages of `prepare`: read and clean each input once, count boilerplate lines in between.

1. :class:`ReadStage`, a task per read task: read the documents, run the blocks before the
   boilerplate block, store what they keep (:mod:`.docstore`) and, for the sources that run the
   boilerplate block, the document frequency of their lines as key runs (:mod:`.keyruns`: map);
2. :class:`BoilerplateStage`, a task per key range: add up the counts of every read task and keep
   the keys of boilerplate lines (reduce by key partition);
3. :class:`CleanStage`, a task per read task: run the rest of the blocks on the stored documents
   with those keys, store the cleaned corpus, and sign it for dedup: exact keys and the LSH band
   keys as key runs, the MinHash signatures as an array (row = the document's row in the store).

Every stage writes drop-log lines numbered by document ordinal; nothing re-reads a raw file or
re-runs a block.
"""

from __future__ import annotations

import heapq
import itertools
import time
from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from mindfoundry.config.data_config import DedupConfig
from mindfoundry.data.clean.boilerplate import FrequentLines, document_keys, frequent_body, frequent_in_source
from mindfoundry.data.clean.curate import CUT, chunked, clean_chunk, runs_block, source_pipeline
from mindfoundry.data.clean.dedup import Signer, band_keys, comparison_salts, exact_key
from mindfoundry.data.clean.droplog import read_numbered, write_numbered
from mindfoundry.data.clean.shingling import shingle_ngram, unit_values
from mindfoundry.data.clean.templates import (
    Templates,
    covered_shingles,
    document_spans,
    site_documents,
    site_number,
    template_key,
)
from mindfoundry.data.document import Document
from mindfoundry.data.execute.stage import Stage
from mindfoundry.data.execute.workdir import WorkDir
from mindfoundry.data.ingest.files import SourceStats
from mindfoundry.data.ingest.inputs import read_input
from mindfoundry.data.prepare.corpus import BOILERPLATE, CLEAN, READ, TEMPLATES, Corpus
from mindfoundry.data.prepare.docstore import DocReader, DocWriter
from mindfoundry.data.prepare.keyruns import gather, groups, key_range, write_run
from mindfoundry.data.prepare.results import BoilerplateResult, CleanResult, ReadResult, TemplateResult

DOCS, EVENTS, SIGNATURES = "docs", "events.jsonl", "signatures.npy"
NEW_EVENTS = "events.this-stage.jsonl"  # the clean stage's own lines, before they merge with the read stage's


class ReadStage(Stage[ReadResult]):
    """Read + the blocks before boilerplate + line counts (see the module docstring)."""

    name, result_type = READ, ReadResult

    def __init__(self, work: WorkDir, corpus: Corpus) -> None:
        super().__init__(work)
        self.corpus = corpus

    def tasks(self) -> int:
        return len(self.corpus.inputs)

    def run(self, task: int, out: Path) -> ReadResult:
        data, src = self.corpus.data, self.corpus.source(task)
        stats = SourceStats()
        pipeline = source_pipeline(data, src, "before")
        settings = data.clean.boilerplate
        counting = runs_block(data, src, CUT)
        keys = {"body": array("Q"), "edges": array("Q")}  # one entry per (document, distinct line): 8 bytes each
        counted = 0
        sample, dedup = self.corpus.template_sample(task), data.dedup
        spans: list[np.ndarray] = []  # the distinct template-span keys of each sampled document
        sites: Counter[int] = Counter()  # sampled documents per site number (templates are per site)
        store = DocWriter(out / DOCS, src.name, src.resolved_category())

        def cleaned() -> Iterator[tuple[int, dict[str, Any]]]:
            """Store what the blocks keep, take its line keys; the drop-log lines, chunk by chunk (written as they
            come)."""
            nonlocal counted
            for chunk in chunked(enumerate(read_input(self.corpus.inputs[task], src, stats, self.corpus.storage))):
                kept, lines = clean_chunk(pipeline, chunk)
                for ordinal, doc in kept:
                    store.add(doc, ordinal)
                    if len(spans) < sample:
                        site = template_key(doc.source, doc.site)
                        spans.append(document_spans(unit_values(doc.text, dedup.shingle), dedup.templates.ngram, site))
                        sites[site_number(site)] += 1
                    found = (
                        document_keys(doc.text, doc.source, settings.min_line_chars, settings.edge_lines)
                        if counting
                        else None
                    )
                    if found is not None:
                        counted += 1
                        keys["body"].extend(found[0])
                        keys["edges"].extend(found[1])
                yield from lines

        lines = write_numbered(out / EVENTS, cleaned())
        result = ReadResult(documents=stats.documents, kept=store.close(), stats=stats.counters(), files=stats.files,
                            notes=stats.notes, blocks=pipeline.report(), lines=lines)
        if counting:  # document frequency of each line key in this task (map-side counts), as key runs
            result = replace(result, line_documents=counted, line_entries=sum(
                write_run(out, name, *np.unique(np.frombuffer(found, np.uint64), return_counts=True))
                for name, found in keys.items()
            ))
        if sample:  # document frequency of each template-span key in this task's sample
            result = replace(result, span_documents=len(spans), span_sites={str(k): n for k, n in sites.items()},
                             span_entries=write_run(
                out, "spans", *np.unique(np.concatenate([np.zeros(0, np.uint64), *spans]), return_counts=True)))
        return result


class BoilerplateStage(Stage[BoilerplateResult]):
    """The document frequency of every line key and template-span key, added up over the read tasks, one key range
    per task."""

    name, result_type = BOILERPLATE, BoilerplateResult

    def __init__(self, work: WorkDir, corpus: Corpus, partitions: int,
                 counted: dict[str, tuple[list[int], dict[str | int, int]]]) -> None:
        super().__init__(work)
        self.corpus, self.partitions = corpus, partitions
        # "line" / "span": the read tasks that counted them, and per source (lines) or site number (spans) the
        # documents they counted
        self.counted = counted

    def tasks(self) -> int:
        return self.partitions

    def run(self, task: int, out: Path) -> BoilerplateResult:
        lines, templates = self.corpus.data.clean.boilerplate, self.corpus.data.dedup.templates
        low, high = key_range(task, self.partitions)
        found = {name: np.zeros(0, np.uint64) for name in ("body", "edges", "spans")}
        if "line" in self.counted:
            folders = [self.work.task(READ, t) for t in self.counted["line"][0]]
            keys, counts, _ = _summed(*gather(folders, "body", low, high))
            found["body"] = keys[frequent_body(counts, lines.min_documents)]
            found["edges"] = self._in_source("line", "edges", low, high, lines.min_documents, lines.min_source_share)
        if "span" in self.counted:
            found["spans"] = self._in_source("span", "spans", low, high, templates.min_documents, templates.min_share)
        for name, keys in found.items():
            np.save(out / f"{name}.npy", keys)
        return BoilerplateResult(**{name: len(keys) for name, keys in found.items()})

    def _in_source(self, counted: str, run: str, low: int, high: int | None, min_documents: int,
                   min_share: float) -> np.ndarray:
        """The keys of run ``run`` in ``[low, high)`` that recur in their source (edge lines: keys are salted per
        source) or site (template spans: a key's low bits are its site's number, templates.site_documents)."""
        tasks, documents = self.counted[counted]
        keys, counts, first_runs = _summed(*gather([self.work.task(READ, t) for t in tasks], run, low, high))
        if counted == "span":
            sources = site_documents(keys, documents)
        else:
            sources = np.array([documents[self.corpus.inputs[tasks[r]].source] for r in first_runs], dtype=np.int64)
        return keys[frequent_in_source(counts, sources, min_documents, min_share)]


def _summed(keys: np.ndarray, counts: np.ndarray, runs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each distinct key once, sorted, with the sum of its counts and the first run it came from (edge keys
    name their source: every run a key comes from reads that source)."""
    order = np.argsort(keys, kind="stable")
    keys, counts, runs = keys[order], counts[order], runs[order]
    starts, _ = groups(keys)
    return keys[starts], np.add.reduceat(counts, starts) if len(starts) else counts[:0], runs[starts]


def _found(work: WorkDir, partitions: int, name: str) -> np.ndarray:
    """The keys of kind ``name`` the :class:`BoilerplateStage` found (its key ranges are in order: already sorted)."""
    return np.concatenate([np.zeros(0, np.uint64), *(np.load(work.task(BOILERPLATE, t) / f"{name}.npy")
                                                     for t in range(partitions))])


def frequent_lines(work: WorkDir, partitions: int) -> FrequentLines:
    """The boilerplate line keys the :class:`BoilerplateStage` found."""
    return FrequentLines(_found(work, partitions, "body"), _found(work, partitions, "edges"))


class TemplateStage(Stage[TemplateResult]):
    """A task per read task: the template shingles of its sampled documents (those inside template spans)."""

    name, result_type = TEMPLATES, TemplateResult

    def __init__(self, work: WorkDir, corpus: Corpus, partitions: int) -> None:
        super().__init__(work)
        self.corpus, self.partitions = corpus, partitions

    def tasks(self) -> int:
        return len(self.corpus.inputs)

    def run(self, task: int, out: Path) -> TemplateResult:
        dedup = self.corpus.data.dedup
        spans, sample = _found(self.work, self.partitions, "spans"), self.corpus.template_sample(task)
        ngram = shingle_ngram(dedup.shingle, dedup.char_ngram, dedup.word_ngram)
        found = [np.zeros(0, np.uint64)]
        for _, doc in itertools.islice(DocReader(self.work.task(READ, task) / DOCS), sample):
            found.append(covered_shingles(unit_values(doc.text, dedup.shingle), ngram, spans, dedup.templates.ngram,
                                          template_key(doc.source, doc.site)))
        shingles = np.unique(np.concatenate(found))
        np.save(out / "shingles.npy", shingles)
        return TemplateResult(shingles=len(shingles))


def template_shingles(work: WorkDir, corpus: Corpus) -> Templates | None:
    """Every source's template shingles, as the :class:`TemplateStage` found them (None when not discounted)."""
    if not corpus.data.dedup.discounts_templates:
        return None
    return Templates(np.unique(np.concatenate(
        [np.load(work.task(TEMPLATES, t) / "shingles.npy") for t in range(len(corpus.inputs))])))


class CleanStage(Stage[CleanResult]):
    """The blocks from boilerplate on, then the dedup keys and signatures (see the module docstring)."""

    name, result_type = CLEAN, CleanResult

    def __init__(self, work: WorkDir, corpus: Corpus, boilerplate_partitions: int) -> None:
        super().__init__(work)
        self.corpus, self.boilerplate_partitions = corpus, boilerplate_partitions

    def tasks(self) -> int:
        return len(self.corpus.inputs)

    def run(self, task: int, out: Path) -> CleanResult:
        data, src = self.corpus.data, self.corpus.source(task)
        lines = (
            frequent_lines(self.work, self.boilerplate_partitions) if runs_block(data, src, CUT) else FrequentLines()
        )
        pipeline = source_pipeline(data, src, "from", lines)
        read = self.work.task(READ, task)
        store = DocWriter(out / DOCS, src.name, src.resolved_category())
        signing = Signing(self.corpus.data.dedup, template_shingles(self.work, self.corpus))
        reader = DocReader(read / DOCS)

        def cleaned() -> Iterator[tuple[int, dict[str, Any]]]:
            """Store and sign what the blocks keep; the drop-log lines, chunk by chunk (written as they come)."""
            for chunk in chunked(reader):
                kept, lines = clean_chunk(pipeline, chunk)
                for ordinal, doc in kept:
                    store.add(doc, ordinal)
                    signing.add(doc)
                yield from lines

        write_numbered(out / NEW_EVENTS, cleaned())
        kept_count = store.close()
        signing.write(out)
        events = write_numbered(out / EVENTS, heapq.merge(read_numbered(read / EVENTS), read_numbered(out / NEW_EVENTS),
                                                          key=lambda item: item[0]))
        (out / NEW_EVENTS).unlink()
        return CleanResult(documents=len(reader), kept=kept_count, chars=store.chars, blocks=pipeline.report(),
                           lines=events, sign_seconds=round(signing.seconds, 3))


class Signing:
    """A task's dedup keys, document by document: exact keys and MinHash signatures (packed, 4 bytes a value), then
    the LSH band keys (key runs whose value is the row; salted with each document's language, so near-duplicates
    are looked for within a language) and the signatures (one array) that the dedup stages read."""

    def __init__(self, settings: DedupConfig, templates: Templates | None) -> None:
        self.settings = settings
        self.signer = Signer.of(settings, templates)
        self.exact_keys = array("Q")
        self.signatures = array("I")
        # a (document row, salt) per comparison group of each document, in corpus order (a page of mixed scripts has
        # two), so a bucket lists its documents in corpus order
        self.group_rows, self.salts = array("Q"), array("Q")
        self.seconds = 0.0

    def add(self, doc: Document) -> None:
        if not self.settings.enabled:
            return
        start = time.perf_counter()
        if self.settings.exact:
            self.exact_keys.append(exact_key(doc.text))
        if self.settings.near:
            self.signatures.frombytes(self.signer.sign(doc.text, template_key(doc.source, doc.site))
                                      .astype(np.uint32).tobytes())
            salts = comparison_salts(doc.text, doc.language)
            self.group_rows.extend([len(self.signatures) // self.settings.num_perm - 1] * len(salts))
            self.salts.extend(salts)
        self.seconds += time.perf_counter() - start

    def write(self, out: Path) -> None:
        settings = self.settings
        if not settings.enabled:
            return
        start = time.perf_counter()
        if settings.exact:
            keys = np.frombuffer(self.exact_keys, dtype=np.uint64)
            write_run(out, "exact", keys, np.arange(len(keys), dtype=np.uint64))
        if settings.near:
            signatures = np.frombuffer(self.signatures, dtype=np.uint32).reshape(-1, settings.num_perm)
            np.save(out / SIGNATURES, signatures)
            group_rows = np.frombuffer(self.group_rows, dtype=np.uint64)
            salts = np.frombuffer(self.salts, dtype=np.uint64)
            for band, keys in enumerate(band_keys(signatures[group_rows], settings.bands, settings.rows, salts)):
                write_run(out, f"band{band:03d}", keys, group_rows)
        self.seconds += time.perf_counter() - start

