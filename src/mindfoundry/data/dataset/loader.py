"""Training batches for one data-parallel rank, read from memory-mapped shards, optionally prefetched.

A *batch source* turns a range of global positions (samples consumed since the start of training)
into ``(input_ids, labels)``; it is a pure function of the position, so a run resumes at any
sample exactly. Two exist: :class:`OrderedSamples` (all train shards as one stream in a seeded
per-epoch order, the behaviour without a mixture) and
:class:`mindfoundry.data.dataset.mixture.MixtureSampler`.

:class:`TrainLoader` cuts every global batch into contiguous per-rank slices and can prepare the
next batches in a background thread while the current step runs (the step releases the GIL in
the engine, the reads release it in numpy's copies), so data time leaves the step time.

Framework-free on purpose: the engines convert the int32 arrays.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

import numpy as np

from mindfoundry.config.schema import RunConfig
from mindfoundry.data.dataset.captions import CaptionSamples
from mindfoundry.data.dataset.image_samples import ImageSamples, open_image_samples
from mindfoundry.data.dataset.masking import Masking
from mindfoundry.data.dataset.mixture import build_mixture
from mindfoundry.data.dataset.packing import IGNORE_INDEX, PackedSamples, SampleOrder
from mindfoundry.data.dataset.prepared import DataError, PreparedData

__all__ = ["Batch", "BatchIterator", "BatchSource", "OrderedSamples", "TrainLoader", "split_samples",
           "training_source"]

# How often a blocked prefetch thread wakes up to check whether it was closed.
_POLL_SECONDS = 0.1


class BatchSource(Protocol):
    """Samples at global positions ``[start, start + count)``: int32 ``[count, seq_len]`` token windows and their
    labels, or (image objectives) uint8 ``[count, size, size, 3]`` pixels and their sample indices."""

    def get_batch(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]: ...


class Samples(Protocol):
    """A split's samples by index: packed token windows (:class:`PackedSamples`) or images (:class:`ImageSamples`)."""

    def __len__(self) -> int: ...

    def get_batch(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...


class OrderedSamples:
    """Training without a mixture: all train samples (the packed stream of the shards, or the images) in
    :class:`SampleOrder`."""

    def __init__(self, samples: Samples, order: SampleOrder) -> None:
        self.samples = samples
        self.order = order

    def get_batch(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        return self.samples.get_batch(self.order.indices(start, count))


def split_samples(cfg: RunConfig, data: PreparedData, split: str) -> PackedSamples | ImageSamples | CaptionSamples:
    """The samples of ``split`` the configured objective reads: the images (mae), the captioned images (caption), else
    the packed token windows of train.seq_len (the one place that picks)."""
    if not cfg.model.is_image:
        return data.packed(split, cfg.train.seq_len)
    images = open_image_samples(data.root, data.manifest, split)
    samples = CaptionSamples(images, cfg.train.seq_len, data.tokenizer) if cfg.model.objective == "caption" else images
    if not len(samples):
        raise DataError(f"the {split} split holds no image: add images (or change data.validation_fraction) and "
                        "run `mindfoundry prepare`")
    return samples


def split_bytes_per_token(cfg: RunConfig, data: PreparedData, samples: Samples, split: str) -> float | None:
    """UTF-8 bytes per token of what ``samples`` (``split``'s) score, for bits per byte: the split's text, a
    captioner's captions, and None for mae (its loss is no log-likelihood)."""
    if isinstance(samples, CaptionSamples):
        return samples.bytes_per_token()
    return None if cfg.model.is_image else data.bytes_per_token(split)


def training_source(cfg: RunConfig, data: PreparedData) -> BatchSource:
    """The batch source the config asks for: the category mixture if ``data.mixture`` is set."""
    if cfg.data.mixture is not None:
        return build_mixture(data, cfg.data.mixture, seq_len=cfg.train.seq_len, seed=cfg.seed,
                             shuffle=cfg.data.shuffle)
    samples = split_samples(cfg, data, "train")
    return OrderedSamples(samples, SampleOrder(len(samples), cfg.seed, shuffle=cfg.data.shuffle))


@dataclass(frozen=True)
class Batch:
    """This rank's part of the global batch that starts at global ``position``."""

    position: int
    input_ids: np.ndarray  # int32 [grad_accum, micro_batch_size, seq_len]; the image objectives' pixel values
    labels: np.ndarray  # int32 [grad_accum, micro_batch_size, seq_len]; mae: the masks (image_masking.mask_labels)
    scored: int  # positions of the batch that carry a loss (labels not ignored; mae: the masked patches)


class TrainLoader:
    """Per-rank batches: rank ``r`` of ``dp_size`` takes global positions ``[p + r*L, p + (r+1)*L)``.

    ``L = micro_batch_size * grad_accum`` is the rank's share of the global batch
    ``G = L * dp_size``; the slices of all ranks partition ``[p, p + G)``, so together the ranks
    consume exactly what one process with the whole global batch would, and each rank reads only
    its own samples. With ``masking`` (the mlm and mae objectives) each sample is masked by its global position.
    """

    def __init__(self, source: BatchSource, *, micro_batch_size: int, grad_accum: int = 1,
                 dp_rank: int = 0, dp_size: int = 1, prefetch: int = 2, masking: Masking | None = None) -> None:
        if micro_batch_size < 1 or grad_accum < 1:
            raise ValueError(f"micro_batch_size and grad_accum must be >= 1, got {micro_batch_size} and {grad_accum}")
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank must lie in [0, dp_size={dp_size}), got {dp_rank}")
        if prefetch < 0:
            raise ValueError(f"prefetch must be >= 0 (0 = no background thread), got {prefetch}")
        self.source = source
        self.micro_batch_size, self.grad_accum = micro_batch_size, grad_accum
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.prefetch = prefetch
        self.masking = masking

    @classmethod
    def for_global_batch(cls, source: BatchSource, global_batch: int, *, grad_accum: int, dp_rank: int = 0,
                         dp_size: int = 1, **options: Any) -> "TrainLoader":
        """The loader of one of `dp_size` feeds of a global batch of `global_batch` samples (the run's, from
        :meth:`mindfoundry.config.parallel_config.Layout.global_batch`), in `grad_accum` micro-batches per step. A feed
        is a data-parallel rank, or every rank of a semi-auto layout, which is fed the whole batch (dp_size 1)."""
        rows, rest = divmod(global_batch, grad_accum * dp_size)
        if rest or rows < 1:
            raise ValueError(f"a global batch of {global_batch} does not split into {dp_size} feeds of {grad_accum} "
                             "micro-batches")
        return cls(source, micro_batch_size=rows, grad_accum=grad_accum, dp_rank=dp_rank, dp_size=dp_size, **options)

    @property
    def local_batch(self) -> int:
        """Samples this rank reads per optimizer step."""
        return self.micro_batch_size * self.grad_accum

    @property
    def global_batch(self) -> int:
        """Samples all ranks consume per optimizer step: the amount the position advances."""
        return self.local_batch * self.dp_size

    @property
    def global_micro_batch(self) -> int:
        """Samples all ranks consume per micro-batch (the rows of one evaluation batch)."""
        return self.micro_batch_size * self.dp_size

    def batch(self, position: int) -> Batch:
        """This rank's slice of the global batch starting at ``position``, computed now."""
        if position < 0:
            raise ValueError(f"position must be >= 0, got {position}")
        start = position + self.dp_rank * self.local_batch
        ids, labels = self.source.get_batch(start, self.local_batch)
        if self.masking is None:
            scored = int((labels != IGNORE_INDEX).sum())
        else:
            ids, labels = self.masking.apply(ids, np.arange(start, start + self.local_batch))
            scored = self.masking.scored(labels)
        rows = (self.grad_accum, self.micro_batch_size)
        return Batch(position, ids.reshape(*rows, *ids.shape[1:]), labels.reshape(*rows, *labels.shape[1:]), scored)

    def iterate(self, position: int) -> BatchIterator:
        """Batches for global positions ``position``, ``position + G``, ...; close it when done."""
        return BatchIterator(self, position)


class BatchIterator:
    """Endless batches from a start position, prepared ``loader.prefetch`` ahead in a daemon thread.

    The thread owns the batch source while it runs (the sources cache permutations and are not
    meant for concurrent use). An error in the thread is raised by the next ``next()``.
    """

    def __init__(self, loader: TrainLoader, position: int) -> None:
        self._loader = loader
        self._next_position = position
        self._queue: queue.Queue[Batch | BaseException] = queue.Queue(maxsize=max(loader.prefetch, 1))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if loader.prefetch:
            self._thread = threading.Thread(
                target=self._fill, args=(position,), name="mindfoundry-prefetch", daemon=True
            )
            self._thread.start()

    def _fill(self, position: int) -> None:
        """Thread body: compute batches in order and hand them over, until closed."""
        while not self._stop.is_set():
            try:
                item: Batch | BaseException = self._loader.batch(position)
            except BaseException as exc:  # handed to the consumer, which re-raises it
                item = exc
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=_POLL_SECONDS)
                    break
                except queue.Full:
                    continue
            if isinstance(item, BaseException):
                return
            position += self._loader.global_batch

    def __iter__(self) -> BatchIterator:
        return self

    def __next__(self) -> Batch:
        if self._stop.is_set():
            raise StopIteration
        if self._thread is None:
            item: Batch | BaseException = self._loader.batch(self._next_position)
        else:
            item = self._queue.get()
        if isinstance(item, BaseException):
            self.close()
            raise item
        self._next_position = item.position + self._loader.global_batch
        return item

    def close(self) -> None:
        """Stop the prefetch thread and wait for it; the iterator then ends."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> BatchIterator:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
