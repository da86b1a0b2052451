"""What every stage of one `prepare` knows: the data config, the read tasks, the stages' names, document refs.

A document of the cleaned corpus is named by a *ref*, ``task << 32 | row``: its read task and its
row in that task's cleaned store. Read tasks are numbered in corpus order and rows keep reading
order, so refs sort in corpus order -- the order dedup's "first copy wins" follows -- and a stage
finds the documents of one task as a range of refs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mindfoundry.config.data_config import DataConfig, SourceConfig
from mindfoundry.config.storage_config import StorageConfig
from mindfoundry.data.ingest.inputs import InputTask

# The stages, in the order they run (each a folder of the work area).
READ, BOILERPLATE, TEMPLATES, CLEAN, EXACT, BANDS, PAIRS, DECIDE = (
    "read", "boilerplate", "templates", "clean", "exact", "bands", "pairs", "decide")
IMAGE_READ, IMAGE_DEDUP = "image_read", "image_dedup"
TOKENIZER, SHARDS, MERGE, IMAGE_SHARDS = "tokenizer", "shards", "merge", "image_shards"

ROW_BITS = 32


def refs(tasks: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The refs of ``rows`` of read tasks ``tasks`` (arrays of one length)."""
    return (tasks.astype(np.uint64) << np.uint64(ROW_BITS)) | rows.astype(np.uint64)


def split_refs(named: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(read tasks, rows) of an array of refs."""
    return (named >> np.uint64(ROW_BITS)).astype(np.int64), (named & np.uint64((1 << ROW_BITS) - 1)).astype(np.int64)


def ref_task(ref: int) -> int:
    return int(ref) >> ROW_BITS


def ref_row(ref: int) -> int:
    return int(ref) & ((1 << ROW_BITS) - 1)


def task_refs(task: int) -> tuple[int, int]:
    """``[low, high)`` of the refs of read task ``task``."""
    return task << ROW_BITS, (task + 1) << ROW_BITS


@dataclass(frozen=True)
class Corpus:
    """The data config, its text read tasks (``inputs``, :func:`~mindfoundry.data.ingest.inputs.plan_inputs`) and
    image read tasks (``images``), and how their URLs are reached. A read task's ``source`` is its index in
    ``data.sources``, whatever its modality."""

    data: DataConfig
    inputs: tuple[InputTask, ...]
    storage: StorageConfig = field(default_factory=StorageConfig)
    images: tuple[InputTask, ...] = ()

    @property
    def text_sources(self) -> list[int]:
        """The indices of the text sources, in config order."""
        return [i for i, src in enumerate(self.data.sources) if src.modality == "text"]

    @property
    def image_sources(self) -> list[int]:
        """The indices of the image sources (``image_text`` and ``image``), in config order."""
        return [i for i, src in enumerate(self.data.sources) if src.modality != "text"]

    def image_source(self, task: int) -> SourceConfig:
        """The source image read task ``task`` reads."""
        return self.data.sources[self.images[task].source]

    def image_tasks_of(self, source: int) -> list[int]:
        """The image read tasks of source number ``source``, in order."""
        return [t for t, task in enumerate(self.images) if task.source == source]

    def source(self, task: int) -> SourceConfig:
        """The source read task ``task`` reads."""
        return self.data.sources[self.inputs[task].source]

    def tasks_of(self, source: int) -> list[int]:
        """The read tasks of source number ``source``, in order."""
        return [t for t, task in enumerate(self.inputs) if task.source == source]

    def template_sample(self, task: int) -> int:
        """How many of its first documents read task ``task`` counts for the templates of its source: the source's
        ``data.dedup.templates.sample`` shared evenly by its read tasks (0 when templates are not discounted)."""
        dedup = self.data.dedup
        if not dedup.discounts_templates:
            return 0
        return -(-dedup.templates.sample // len(self.tasks_of(self.inputs[task].source)))
