"""Fixed-length packed samples for causal LM training, and a deterministic, resumable order.

Packing concatenates every document (each already ending with EOS) into one token stream and
cuts it into ``seq_len`` windows, so no compute is wasted on padding except in the very last
sample. Samples are read straight from the memory-mapped shards; the corpus is never loaded.

The sample order depends only on ``(seed, position)``, so resuming a run needs nothing but
the number of samples consumed so far.

This module is framework-free on purpose: the training backends convert the int32 arrays.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mindfoundry.data.dataset.indexed import IndexedDataset

__all__ = ["IGNORE_INDEX", "PackedSamples", "SampleOrder"]

# Label value skipped by the loss (the PyTorch / MindSpore cross-entropy default).
IGNORE_INDEX = -100


class PackedSamples:
    """The documents of several shards, in order, as one stream cut into causal LM samples.

    Sample ``i`` covers stream tokens ``[i * seq_len, i * seq_len + seq_len + 1)``: its
    ``input_ids`` are the first ``seq_len`` of them and its ``labels`` the last ``seq_len``
    (next-token targets). Consecutive samples overlap by one token so that every token but the
    first is a target exactly once. The last sample may be short; its tail is padded with
    ``pad_id`` in ``input_ids`` and ``IGNORE_INDEX`` in ``labels``.
    """

    def __init__(self, datasets: Sequence[IndexedDataset], seq_len: int, pad_id: int) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        int32 = np.iinfo(np.int32)
        if not int32.min <= pad_id <= int32.max:
            raise ValueError(f"pad_id {pad_id} does not fit int32")
        self._shards = [ds.tokens() for ds in datasets]
        self._seq_len = seq_len
        self._pad_id = pad_id
        # _starts[k] is the stream offset of shard k's first token; _starts[-1] is the total.
        self._starts = np.zeros(len(self._shards) + 1, dtype=np.int64)
        np.cumsum([t.size for t in self._shards], out=self._starts[1:])
        total = int(self._starts[-1])
        self._num_samples = 0 if total < 2 else -(-(total - 1) // seq_len)

    @property
    def num_tokens(self) -> int:
        """Tokens in the whole stream."""
        return int(self._starts[-1])

    @property
    def seq_len(self) -> int:
        return self._seq_len

    def __len__(self) -> int:
        return self._num_samples

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """``(input_ids, labels)`` of sample ``i``, both int32 of length ``seq_len``."""
        input_ids = np.empty(self._seq_len, dtype=np.int32)
        labels = np.empty(self._seq_len, dtype=np.int32)
        self._fill(i, input_ids, labels)
        return input_ids, labels

    def get_batch(self, indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Stacked ``(input_ids, labels)``, each int32 of shape ``[len(indices), seq_len]``."""
        shape = (len(indices), self._seq_len)
        input_ids = np.empty(shape, dtype=np.int32)
        labels = np.empty(shape, dtype=np.int32)
        for row, i in enumerate(indices):
            self._fill(int(i), input_ids[row], labels[row])
        return input_ids, labels

    def _fill(self, i: int, input_ids: np.ndarray, labels: np.ndarray) -> None:
        """Write sample ``i`` into preallocated rows, padding a short final sample."""
        if not 0 <= i < self._num_samples:
            raise IndexError(f"sample index {i} out of range for {self._num_samples} samples")
        start = i * self._seq_len
        chunk = self._read(start, min(start + self._seq_len + 1, self.num_tokens))
        n = chunk.size - 1
        input_ids[:n] = chunk[:-1]
        labels[:n] = chunk[1:]
        input_ids[n:] = self._pad_id
        labels[n:] = IGNORE_INDEX

    def _read(self, start: int, stop: int) -> np.ndarray:
        """Stream tokens ``[start, stop)``, gathered from as many shards as they span."""
        pieces = []
        while start < stop:
            # side="right" skips empty shards, which share their start with the next shard.
            k = int(np.searchsorted(self._starts, start, side="right")) - 1
            local = start - int(self._starts[k])
            take = min(stop, int(self._starts[k + 1])) - start
            pieces.append(self._shards[k][local : local + take])
            start += take
        return np.concatenate(pieces) if len(pieces) > 1 else pieces[0]


class SampleOrder:
    """Deterministic order of sample indices over epochs, resumable from a single integer.

    Global position ``p`` (samples consumed since the start of training) falls in epoch
    ``p // num_samples`` and maps to ``RandomState(seed + epoch).permutation(num_samples)``
    at ``p % num_samples`` (the identity when ``shuffle`` is False). A fresh permutation per
    epoch avoids repeating the same order, and a restarted run only needs ``p`` to continue
    exactly where it stopped.
    """

    def __init__(self, num_samples: int, seed: int, shuffle: bool = True) -> None:
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        if num_samples == 0:
            raise ValueError(
                "the corpus is smaller than one sample of seq_len tokens (plus the one-token "
                "shift for labels), so there is nothing to train on; add data or lower seq_len"
            )
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self._n = num_samples
        self._seed = seed
        self._shuffle = shuffle
        self._cached_epoch = -1
        self._cached_perm = np.empty(0, dtype=np.int64)

    @property
    def num_samples(self) -> int:
        return self._n

    def index(self, position: int) -> int:
        """Sample index to use at global position ``position``."""
        if position < 0:
            raise ValueError(f"position must be >= 0, got {position}")
        epoch, offset = divmod(position, self._n)
        if not self._shuffle:
            return offset
        return int(self._permutation(epoch)[offset])

    def indices(self, start: int, count: int) -> np.ndarray:
        """Sample indices for positions ``[start, start + count)``, as int64 (a batch)."""
        if start < 0 or count < 0:
            raise ValueError(f"start and count must be >= 0, got start={start}, count={count}")
        positions = np.arange(start, start + count, dtype=np.int64)
        offsets = positions % self._n
        if not self._shuffle:
            return offsets
        epochs = positions // self._n
        out = np.empty(count, dtype=np.int64)
        # A batch spans at most a few epochs; visit them in order so each is computed once.
        for epoch in np.unique(epochs):
            mask = epochs == epoch
            out[mask] = self._permutation(int(epoch))[offsets[mask]]
        return out

    def _permutation(self, epoch: int) -> np.ndarray:
        """The epoch's permutation, caching the latest since positions advance monotonically."""
        if epoch != self._cached_epoch:
            rng = np.random.RandomState(self._seed + epoch)
            self._cached_perm = rng.permutation(self._n)
            self._cached_epoch = epoch
        return self._cached_perm
