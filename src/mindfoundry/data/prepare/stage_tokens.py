"""The last stages of `prepare`: the tokenizer, the per-task token shards, and their merge into the output.

1. :class:`TokenizerStage`, one task: train the byte-level BPE on a bounded sample of the
   training split (the first ``data.tokenizer.sample_bytes`` of it, taken from the sources in
   turn, a document at a time), or load the configured one;
2. :class:`ShardStage`, a task per read task: split the documents dedup kept, tokenize them into
   this task's ``train`` / ``validation`` ``.bin/.idx`` parts, and write its part of the drop log
   (the lines of both cleaning stages and dedup's, in document order);
3. :class:`MergeStage`, a task per (source, split) and one for the drop log: each source's parts
   concatenated in corpus order into ``SPLIT/SOURCE.bin|idx`` -- the one shard per source and split
   that the loader, Megatron and the MindRecord export read -- and the parts of the drop log into
   ``drops.jsonl.gz``.
"""

from __future__ import annotations

import heapq
import itertools
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mindfoundry.data.clean.curate import CHUNK_DOCUMENTS, dedup_event
from mindfoundry.data.clean.droplog import DROPS_FILE, assemble, read_numbered, write_part
from mindfoundry.data.dataset.indexed import dtype_for_vocab
from mindfoundry.data.dataset.prepared import SPLITS, TOKENIZER, DataError
from mindfoundry.data.dataset.shard_writer import IndexedDatasetWriter, concatenate_shards
from mindfoundry.data.document import Document
from mindfoundry.data.execute.stage import R, Stage
from mindfoundry.data.execute.workdir import WorkDir, link_or_copy
from mindfoundry.data.prepare.corpus import CLEAN, MERGE, SHARDS, Corpus
from mindfoundry.data.prepare.corpus import TOKENIZER as TOKENIZER_STAGE
from mindfoundry.data.prepare.docstore import DocReader
from mindfoundry.data.prepare.results import MergeResult, ShardResult, TokenizerResult
from mindfoundry.data.prepare.split import split_documents
from mindfoundry.data.prepare.stage_clean import DOCS, EVENTS
from mindfoundry.data.prepare.stage_dedup import CleanedDocuments, Dedup
from mindfoundry.data.prepare.stage_images import TRAIN, image_drop_parts, kept_captions
from mindfoundry.data.tokenizer import (
    encode_batch,
    load_tokenizer,
    train_tokenizer,
    with_special_token,
    worker_tokenizer,
)

PART = "drops.jsonl"


@contextmanager
def _threads() -> Iterator[None]:
    """BPE training on every core of this process (a pool worker tokenizes on one thread otherwise)."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    try:
        yield
    finally:
        if before is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before


class _TokenStage(Stage[R]):
    """What the tokenizer and shard stages share: the corpus, the run's seed and vocabulary, where dedup's decisions
    are."""

    def __init__(self, work: WorkDir, corpus: Corpus, dedup: Dedup, *, seed: int, vocab_size: int,
                 extra_token: str | None) -> None:
        super().__init__(work)
        self.corpus, self.dedup = corpus, dedup
        # the objective's special token (data.tokenizer.OBJECTIVE_TOKENS), added after the learnt ones
        self.seed, self.vocab_size, self.extra_token = seed, vocab_size, extra_token

    def kept(self, task: int) -> Iterator[tuple[int, Document]]:
        """``(ordinal, document)`` of the documents of read task ``task`` that dedup kept, in order."""
        drops = self.dedup.drops(task)
        for row, item in enumerate(DocReader(self.work.task(CLEAN, task) / DOCS)):
            if row not in drops:
                yield item


class TokenizerStage(_TokenStage[TokenizerResult]):
    """Train (or load) the tokenizer; one task (see the module docstring)."""

    name, result_type = TOKENIZER_STAGE, TokenizerResult

    def tasks(self) -> int:
        return 1

    def run(self, task: int, out: Path) -> TokenizerResult:
        settings = self.corpus.data.tokenizer
        start = time.perf_counter()
        if settings.path is not None:
            tok = load_tokenizer(settings.path, self.corpus.storage)
            if tok.get_vocab_size() > self.vocab_size:
                raise DataError(f"data.tokenizer.path={settings.path!r} has {tok.get_vocab_size()} tokens, more than "
                                f"model.vocab_size={self.vocab_size}: raise model.vocab_size")
            if self.extra_token:
                tok = with_special_token(tok, self.extra_token, self.vocab_size)
            info = {"source": "loaded", "path": settings.path}
        else:
            with _threads():
                tok = train_tokenizer(self._sample(settings.sample_bytes), self.vocab_size,
                                      min_frequency=settings.min_frequency, extra_token=self.extra_token)
            info = {
                "source": "trained",
                "min_frequency": settings.min_frequency,
                "train_max_bytes": settings.sample_bytes,
            }
        tok.save(str(out / TOKENIZER))
        seconds = round(time.perf_counter() - start, 2)
        return TokenizerResult(info=info, vocab_size=tok.get_vocab_size(), seconds=seconds)

    def _sample(self, budget: int | None) -> Iterator[str]:
        """Training-split text from the sources in turn, a document at a time, until ``budget`` bytes."""
        streams = [self._training_texts(source) for source in range(len(self.corpus.data.sources))]
        used = 0
        for group in itertools.zip_longest(*streams):
            for text in group:
                if text is None:
                    continue
                if budget is not None and used >= budget:
                    return
                used += len(text.encode("utf-8"))
                yield text

    def _training_texts(self, source: int) -> Iterator[str]:
        """The training split's texts of source number ``source``: its documents, or an image source's captions."""
        if self.corpus.data.sources[source].modality != "text":
            for task in self.corpus.image_tasks_of(source):
                yield from kept_captions(self.work, self.corpus, task, TRAIN)
            return
        fraction = self.corpus.data.validation_fraction
        for task in self.corpus.tasks_of(source):
            docs = (doc for _, doc in self.kept(task))
            yield from (doc.text for split, doc in split_documents(docs, self.seed, fraction) if split == "train")


class ShardStage(_TokenStage[ShardResult]):
    """One read task's token shards and drop-log part (see the module docstring)."""

    name, result_type = SHARDS, ShardResult

    def tasks(self) -> int:
        return len(self.corpus.inputs)

    def run(self, task: int, out: Path) -> ShardResult:
        tok = worker_tokenizer(self.work.task(TOKENIZER_STAGE, 0) / TOKENIZER)
        writers = {split: IndexedDatasetWriter(out / split, dtype_for_vocab(self.vocab_size)) for split in SPLITS}
        counts = {split: {"documents": 0, "tokens": 0, "bytes": 0, "chars": 0} for split in SPLITS}
        fraction = self.corpus.data.validation_fraction
        documents = 0
        kept = self.kept(task)
        while chunk := list(itertools.islice(kept, CHUNK_DOCUMENTS)):
            labelled = list(split_documents((doc for _, doc in chunk), self.seed, fraction))
            for (split, doc), ids in zip(labelled, encode_batch(tok, [doc.text for _, doc in labelled]), strict=True):
                writers[split].add_document(ids)
                counts[split]["documents"] += 1
                counts[split]["tokens"] += len(ids)
                counts[split]["bytes"] += len(doc.text.encode("utf-8"))
                counts[split]["chars"] += len(doc.text)
            documents += len(chunk)
        shards = {split: writers[split].finalize().to_dict() for split in SPLITS}
        dedup_lines = self._dedup_lines(task)
        lines = write_part(out / PART, (line for _, line in heapq.merge(
            read_numbered(self.work.task(CLEAN, task) / EVENTS), dedup_lines, key=lambda item: item[0])))
        dedup_chars: dict[str, int] = {}
        for _, line in dedup_lines:
            dedup_chars[line["reason"]] = dedup_chars.get(line["reason"], 0) + line["chars"]
        return ShardResult(documents=documents, splits=counts, shards=shards, lines=lines, dedup_chars=dedup_chars)

    def _dedup_lines(self, task: int) -> list[tuple[int, dict[str, Any]]]:
        """The drop-log lines of the task's documents dedup dropped, with their ordinals, in order."""
        drops = self.dedup.drops(task)
        if not drops:
            return []
        store = DocReader(self.work.task(CLEAN, task) / DOCS)
        documents = CleanedDocuments(self.work)
        lines = []
        for row in sorted(drops):
            drop = drops[row]
            lines.append((int(store.columns["ordinal"][row]),
                          dedup_event(store.document(row), drop.kind, documents.origin(drop.kept), drop.jaccard,
                                      self.corpus.data.dedup.threshold)))
        return lines


class MergeStage(Stage[MergeResult]):
    """Each source's parts into its shard per split, and the drop log (see the module docstring)."""

    name, result_type = MERGE, MergeResult

    def __init__(self, work: WorkDir, corpus: Corpus) -> None:
        super().__init__(work)
        self.corpus = corpus

    def tasks(self) -> int:
        return len(self.corpus.text_sources) * len(SPLITS) + 1

    def run(self, task: int, out: Path) -> MergeResult:
        if task == self.tasks() - 1:
            self._drop_log(out)
            return MergeResult(file=DROPS_FILE)
        index, split_index = divmod(task, len(SPLITS))
        source = self.corpus.text_sources[index]
        split, name = SPLITS[split_index], self.corpus.data.sources[source].name
        tasks = self.corpus.tasks_of(source)
        if len(tasks) == 1:  # the part is the shard: linked, not copied
            (out / split).mkdir()
            for suffix in (".bin", ".idx"):
                link_or_copy(self.work.task(SHARDS, tasks[0]) / f"{split}{suffix}", out / split / f"{name}{suffix}")
            info = dict(ShardResult.of(self.work, SHARDS, tasks[0]).shards[split])
        else:
            info = concatenate_shards([self.work.task(SHARDS, t) / split for t in tasks], out / split / name).to_dict()
        del info["path_prefix"]  # a path of the work area; "path" is relative to the data folder
        return MergeResult(shard=dict(info, path=f"{split}/{name}"))

    def _drop_log(self, out: Path) -> None:
        """The drop log: the text read tasks' parts, then the image read tasks' lines, in corpus order."""
        images = [out / f"image-part-{t:06d}" for t in range(len(self.corpus.images))]
        for t, part in enumerate(images):
            write_part(part, image_drop_parts(self.work, self.corpus, t))
        texts = [self.work.task(SHARDS, t) / PART for t in range(len(self.corpus.inputs))]
        assemble([*texts, *images], out / DROPS_FILE)
        for part in images:
            part.unlink()
