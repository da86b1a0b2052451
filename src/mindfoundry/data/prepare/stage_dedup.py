"""The dedup stages of `prepare`: candidates by key partition, one decision step over pairs only.

The rule is that of the in-memory reference (bench/dedup_reference.py's ``Deduplicator``), so the decisions are the same
as deciding in memory: exact copies first (the first in corpus order stays), then near-duplicates
among the documents that are nobody's exact copy, where a document is dropped when it matches an
earlier document that is itself kept. Here every step holds a share of the corpus's keys, or only
pairs:

1. :class:`ExactStage`, a task per range of exact keys: documents sharing a key, the first kept;
   the others' refs (keyed by ref, so a task's drops are a range) with the kept one's;
2. :class:`BandStage`, a task per (LSH band, key range): documents sharing a band key are
   candidates (an exact copy is left out, as it never enters the in-memory index); every pair in
   such a bucket, keyed by its later document (datatrove's MinHash buckets do the same with
   sorted signature files);
3. :class:`PairStage`, a task per read task: the candidate pairs whose later document is in it,
   each once however many bands proposed it, verified as ``data.dedup.verify`` says (signature
   agreement, exact shingle Jaccard from the stored texts, or none);
4. :class:`DecideStage`, one task: the verified pairs in corpus order through
   :func:`~mindfoundry.data.clean.dedup.first_kept_wins`; it holds pairs and decisions, never
   documents. It writes the near drops (keyed by ref) and the manifest's dedup report.

:class:`Dedup` is what later stages ask: which rows of a read task dedup dropped, and why.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mindfoundry.data.clean.dedup import Clusters, Pair, Signer, first_kept_wins, jaccard, signature_similarity
from mindfoundry.data.clean.keysets import in_sorted
from mindfoundry.data.clean.templates import template_key
from mindfoundry.data.document import origin_name
from mindfoundry.data.execute.stage import R, Stage
from mindfoundry.data.execute.workdir import WorkDir
from mindfoundry.data.prepare.corpus import (
    BANDS,
    CLEAN,
    DECIDE,
    EXACT,
    PAIRS,
    Corpus,
    ref_row,
    ref_task,
    refs,
    split_refs,
    task_refs,
)
from mindfoundry.data.prepare.docstore import DocReader
from mindfoundry.data.prepare.keyruns import gather, groups, key_range, read_range, write_run
from mindfoundry.data.prepare.results import BandResult, DecideResult, ExactResult, PairResult
from mindfoundry.data.prepare.stage_clean import DOCS, SIGNATURES, template_shingles


class _DedupStage(Stage[R]):
    """What the dedup stages share: the corpus and the reading of the clean stage's runs as refs."""

    def __init__(self, work: WorkDir, corpus: Corpus) -> None:
        super().__init__(work)
        self.corpus = corpus
        self.settings = corpus.data.dedup

    def _gather_refs(self, run: str, low: int, high: int | None) -> tuple[np.ndarray, np.ndarray]:
        """(keys, refs) of every read task's run ``run`` in ``[low, high)``, sorted by key then ref."""
        folders = [self.work.task(CLEAN, t) for t in range(len(self.corpus.inputs))]
        keys, rows, tasks = gather(folders, run, low, high)
        named = refs(tasks, rows)
        order = np.lexsort((named, keys))
        return keys[order], named[order]


class ExactStage(_DedupStage[ExactResult]):
    """Exact copies within one range of exact keys (see the module docstring)."""

    name, result_type = EXACT, ExactResult

    def __init__(self, work: WorkDir, corpus: Corpus, partitions: int) -> None:
        super().__init__(work, corpus)
        self.partitions = partitions

    def tasks(self) -> int:
        return self.partitions

    def run(self, task: int, out: Path) -> ExactResult:
        keys, named = self._gather_refs("exact", *key_range(task, self.partitions))
        starts, ends = groups(keys)
        clusters = Clusters(self.settings.max_examples)
        dropped, kept = [], []
        for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
            if end - start > 1:
                copies = named[start + 1:end]
                dropped.append(copies)
                kept.append(np.full(len(copies), named[start], dtype=np.uint64))
                clusters.add(int(named[start]), [int(c) for c in copies])
        dropped_refs = np.concatenate(dropped) if dropped else np.zeros(0, np.uint64)
        write_run(out, "dropped", dropped_refs, np.concatenate(kept) if kept else np.zeros(0, np.uint64))
        by_source = Counter(self.corpus.inputs[ref_task(r)].source for r in dropped_refs.tolist())
        return ExactResult(entries=len(keys), dropped=len(dropped_refs), clusters=clusters.to_json(),
                           by_source={str(s): n for s, n in sorted(by_source.items())})


def exact_dropped(work: WorkDir, partitions: int, named: np.ndarray) -> np.ndarray:
    """Which of ``named`` (refs) the exact stage dropped: a binary search in each partition's sorted drops
    (memory-mapped, so nothing grows with the corpus)."""
    hit = np.zeros(len(named), dtype=bool)
    for task in range(partitions):
        hit |= in_sorted(np.load(work.task(EXACT, task) / "dropped.keys.npy", mmap_mode="r"), named)
    return hit


class BandStage(_DedupStage[BandResult]):
    """Candidate pairs of one LSH band within one key range (see the module docstring)."""

    name, result_type = BANDS, BandResult

    def __init__(self, work: WorkDir, corpus: Corpus, ranges: int, exact_partitions: int) -> None:
        super().__init__(work, corpus)
        self.ranges, self.exact_partitions = ranges, exact_partitions

    def tasks(self) -> int:
        return self.settings.bands * self.ranges

    def run(self, task: int, out: Path) -> BandResult:
        band, part = divmod(task, self.ranges)
        keys, named = self._gather_refs(f"band{band:03d}", *key_range(part, self.ranges))
        indexed = ~exact_dropped(self.work, self.exact_partitions, named)  # an exact copy is never indexed
        keys, named = keys[indexed], named[indexed]
        starts, ends = groups(keys)
        earlier, later = [], []
        for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
            if end - start > 1:
                first, second = np.triu_indices(end - start, 1)
                earlier.append(named[start:end][first])
                later.append(named[start:end][second])
        later_refs = np.concatenate(later) if later else np.zeros(0, np.uint64)
        write_run(out, "pairs", later_refs, np.concatenate(earlier) if earlier else np.zeros(0, np.uint64))
        return BandResult(entries=len(keys), pairs=len(later_refs))


class PairStage(_DedupStage[PairResult]):
    """The candidate pairs of one read task's documents (as the later of two), each once, verified."""

    name, result_type = PAIRS, PairResult

    def __init__(self, work: WorkDir, corpus: Corpus, band_tasks: int) -> None:
        super().__init__(work, corpus)
        self.band_tasks = band_tasks

    def tasks(self) -> int:
        return len(self.corpus.inputs)

    def run(self, task: int, out: Path) -> PairResult:
        later, earlier, _ = gather(
            [self.work.task(BANDS, t) for t in range(self.band_tasks)], "pairs", *task_refs(task)
        )
        pairs = np.unique(np.stack([later, earlier], axis=1), axis=0) if len(later) else np.zeros((0, 2), np.uint64)
        scores = self._scores(pairs)
        keep = np.ones(len(pairs), dtype=bool) if self.settings.verify == "none" else scores >= self.settings.threshold
        np.save(out / "verified.npy", pairs[keep])
        np.save(out / "scores.npy", scores[keep])
        return PairResult(candidates=len(pairs), verified=int(keep.sum()))

    def _scores(self, pairs: np.ndarray) -> np.ndarray:
        """Each pair's Jaccard: estimated from the signatures, computed from the stored texts, or NaN (verify: none)."""
        if self.settings.verify == "none" or not len(pairs):
            return np.full(len(pairs), np.nan)
        if self.settings.verify == "signature":
            return signature_similarity(self._signatures(pairs[:, 1]), self._signatures(pairs[:, 0]))
        signing = Signer.of(self.settings, template_shingles(self.work, self.corpus))
        hashes: dict[int, np.ndarray] = {}

        def shingles(ref: int) -> np.ndarray:
            if ref not in hashes:
                task = ref_task(ref)
                doc = DocReader(self.work.task(CLEAN, task) / DOCS).document(ref_row(ref))
                hashes[ref] = signing.hashes(doc.text, template_key(doc.source, doc.site))
            return hashes[ref]

        return np.array([jaccard(shingles(int(b)), shingles(int(a))) for a, b in pairs.tolist()])

    def _signatures(self, named: np.ndarray) -> np.ndarray:
        """The signatures of refs, read task by task from the memory-mapped arrays."""
        out = np.zeros((len(named), self.settings.num_perm), dtype=np.uint32)
        tasks, rows = split_refs(named)
        for task in np.unique(tasks).tolist():
            chosen = tasks == task
            out[chosen] = np.load(self.work.task(CLEAN, task) / SIGNATURES, mmap_mode="r")[rows[chosen]]
        return out


class DecideStage(_DedupStage[DecideResult]):
    """The near-duplicate decisions over all verified pairs, and the dedup report (see the module docstring)."""

    name, result_type = DECIDE, DecideResult

    def __init__(self, work: WorkDir, corpus: Corpus, exact_partitions: int, cleaned: int, pairs: bool) -> None:
        super().__init__(work, corpus)
        self.exact_partitions, self.cleaned, self.pairs = exact_partitions, cleaned, pairs

    def tasks(self) -> int:
        return 1

    def run(self, task: int, out: Path) -> DecideResult:
        near = first_kept_wins(self._verified()) if self.pairs else {}
        dropped = np.array(sorted(near), dtype=np.uint64)
        write_run(out, "near", dropped, np.array([near[d][0] for d in dropped.tolist()], dtype=np.uint64))
        write_run(
            out, "near_scores", dropped, np.array([_score(near[d][1]) for d in dropped.tolist()], dtype=np.float64)
        )
        return DecideResult(report=self._report(near))

    def _verified(self) -> Iterator[Pair]:
        """Every verified (earlier, later, score) in corpus order of the later document, then the earlier."""
        for task in range(len(self.corpus.inputs)):
            folder = self.work.task(PAIRS, task)
            pairs, scores = np.load(folder / "verified.npy"), np.load(folder / "scores.npy")
            for (later, earlier), score in zip(pairs.tolist(), scores.tolist(), strict=True):
                yield earlier, later, None if math.isnan(score) else score

    def _report(self, near: dict[int, tuple[int, float | None]]) -> dict[str, Any]:
        """The manifest's dedup report, as the in-memory reference writes it (its times
        aside)."""
        exact = Clusters(self.settings.max_examples)
        by_source: dict[int, Counter[str]] = {}
        for t in range(self.exact_partitions):
            result = ExactResult.of(self.work, EXACT, t)
            exact.merge(Clusters.from_json(result.clusters, self.settings.max_examples))
            for source, n in result.by_source.items():
                by_source.setdefault(int(source), Counter())["exact"] += n
        for ref in near:
            by_source.setdefault(self.corpus.inputs[ref_task(ref)].source, Counter())["near"] += 1
        candidates = verified = 0
        if self.pairs:
            for t in range(len(self.corpus.inputs)):
                pair = PairResult.of(self.work, PAIRS, t)
                candidates, verified = candidates + pair.candidates, verified + pair.verified
        near_clusters = Clusters.of({d: kept for d, (kept, _) in near.items()}, self.settings.max_examples)
        documents = CleanedDocuments(self.work)

        def names(ref: int) -> str:
            return origin_name(documents.origin(ref))

        sources = self.corpus.data.sources
        return {
            "documents": self.cleaned,
            "kept": self.cleaned - exact.removed - near_clusters.removed,
            "exact": exact.report(names),
            "near": dict(near_clusters.report(names), candidate_pairs=candidates, verified_pairs=verified),
            "removed_by_source": {name: dict(counts) for name, counts in
                                  sorted((sources[s].name, c) for s, c in by_source.items())},
        }


def _score(score: float | None) -> float:
    return math.nan if score is None else score


class CleanedDocuments:
    """Documents of the cleaned corpus by ref: their ids and origins (each task's store opened once)."""

    def __init__(self, work: WorkDir) -> None:
        self.work = work
        self.stores: dict[int, DocReader] = {}

    def store(self, ref: int) -> DocReader:
        task = ref_task(ref)
        if task not in self.stores:
            self.stores[task] = DocReader(self.work.task(CLEAN, task) / DOCS)
        return self.stores[task]

    def doc_id(self, ref: int) -> str:
        return self.store(ref).doc_id(ref_row(ref))

    def origin(self, ref: int) -> dict[str, str | int]:
        return self.store(ref).origin(ref_row(ref))


@dataclass(frozen=True)
class Drop:
    """Why dedup dropped a row: ``kind`` (exact or near), the kept document's ref and the pair's Jaccard."""

    kind: str
    kept: int
    jaccard: float | None


@dataclass(frozen=True)
class Dedup:
    """Where the finished dedup stages left their decisions: what the later stages ask of them."""

    work: WorkDir
    exact_partitions: int  # 0 when exact dedup did not run
    decided: bool  # whether the dedup stages ran at all

    def drops(self, task: int) -> dict[int, Drop]:
        """``{row: Drop}`` of the rows of read task ``task`` that dedup dropped."""
        if not self.decided:
            return {}
        low, high = task_refs(task)
        drops: dict[int, Drop] = {}
        for t in range(self.exact_partitions):
            dropped, kept = read_range(self.work.task(EXACT, t), "dropped", low, high)
            drops.update(
                {ref_row(d): Drop("exact", k, 1.0) for d, k in zip(dropped.tolist(), kept.tolist(), strict=True)}
            )
        dropped, kept = read_range(self.work.task(DECIDE, 0), "near", low, high)
        _, scores = read_range(self.work.task(DECIDE, 0), "near_scores", low, high)
        for d, k, score in zip(dropped.tolist(), kept.tolist(), scores.tolist(), strict=True):
            drops[ref_row(d)] = Drop("near", k, None if math.isnan(score) else score)
        return drops
