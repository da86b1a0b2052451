"""Tests for packed causal LM samples and the resumable sample order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mindfoundry.data.dataset.indexed import IndexedDataset
from mindfoundry.data.dataset.packing import IGNORE_INDEX, PackedSamples, SampleOrder
from mindfoundry.data.dataset.shard_writer import IndexedDatasetWriter

PAD = 0


def _shard(prefix: Path, docs: list[list[int]]) -> IndexedDataset:
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        for doc in docs:
            writer.add_document(doc)
    return IndexedDataset(prefix)


@pytest.fixture
def stream_of_ten(tmp_path: Path) -> IndexedDataset:
    # Stream 10..19 (10 tokens), as two documents ending in EOS-like ids.
    return _shard(tmp_path / "a", [[10, 11, 12, 13], [14, 15, 16, 17, 18, 19]])


def test_samples_are_shifted_slices(stream_of_ten: IndexedDataset) -> None:
    packed = PackedSamples([stream_of_ten], seq_len=4, pad_id=PAD)
    assert packed.num_tokens == 10
    assert len(packed) == 3  # ceil((10 - 1) / 4)

    inputs, labels = packed[0]
    assert inputs.dtype == np.int32 and labels.dtype == np.int32
    np.testing.assert_array_equal(inputs, [10, 11, 12, 13])
    np.testing.assert_array_equal(labels, [11, 12, 13, 14])
    inputs, labels = packed[1]
    np.testing.assert_array_equal(inputs, [14, 15, 16, 17])
    np.testing.assert_array_equal(labels, [15, 16, 17, 18])
    inputs, labels = packed[2]
    np.testing.assert_array_equal(inputs, [18, PAD, PAD, PAD])
    np.testing.assert_array_equal(labels, [19, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX])


def test_exact_fit_has_no_padding(tmp_path: Path) -> None:
    ds = _shard(tmp_path / "a", [[1, 2, 3, 4, 5, 6, 7, 8, 9]])
    packed = PackedSamples([ds], seq_len=4, pad_id=PAD)
    assert len(packed) == 2
    np.testing.assert_array_equal(packed[1][0], [5, 6, 7, 8])
    np.testing.assert_array_equal(packed[1][1], [6, 7, 8, 9])


def test_out_of_range_raises(stream_of_ten: IndexedDataset) -> None:
    packed = PackedSamples([stream_of_ten], seq_len=4, pad_id=PAD)
    with pytest.raises(IndexError, match="sample index 3"):
        packed[3]
    with pytest.raises(IndexError):
        packed[-1]
    with pytest.raises(IndexError):
        packed.get_batch([0, 3])


def test_too_small_corpus(tmp_path: Path) -> None:
    packed = PackedSamples([_shard(tmp_path / "a", [[7]])], seq_len=4, pad_id=PAD)
    assert len(packed) == 0
    assert len(PackedSamples([], seq_len=4, pad_id=PAD)) == 0
    with pytest.raises(ValueError, match="seq_len"):
        PackedSamples([], seq_len=0, pad_id=PAD)


def test_samples_span_dataset_boundaries(tmp_path: Path) -> None:
    datasets = [
        _shard(tmp_path / "a", [[1, 2, 3]]),
        _shard(tmp_path / "b", []),  # an empty shard in between must be skipped
        _shard(tmp_path / "c", [[4], [5]]),
        _shard(tmp_path / "d", [[6, 7, 8, 9, 10, 11]]),
    ]
    packed = PackedSamples(datasets, seq_len=5, pad_id=PAD)
    stream = np.arange(1, 12)
    assert packed.num_tokens == 11
    assert len(packed) == 2
    for i in range(len(packed)):
        inputs, labels = packed[i]
        np.testing.assert_array_equal(inputs, stream[i * 5 : i * 5 + 5])
        np.testing.assert_array_equal(labels, stream[i * 5 + 1 : i * 5 + 6])

    # seq_len 2: sample 1 is [3, 4, 5] (spans a, skips b, covers both docs of c).
    packed = PackedSamples(datasets, seq_len=2, pad_id=PAD)
    np.testing.assert_array_equal(packed[1][0], [3, 4])
    np.testing.assert_array_equal(packed[1][1], [4, 5])


def test_get_batch_stacks_samples(stream_of_ten: IndexedDataset) -> None:
    packed = PackedSamples([stream_of_ten], seq_len=4, pad_id=PAD)
    inputs, labels = packed.get_batch(np.array([2, 0]))
    assert inputs.shape == labels.shape == (2, 4)
    assert inputs.dtype == labels.dtype == np.int32
    np.testing.assert_array_equal(inputs, [packed[2][0], packed[0][0]])
    np.testing.assert_array_equal(labels, [packed[2][1], packed[0][1]])


def test_sample_order_is_a_permutation_per_epoch() -> None:
    order = SampleOrder(num_samples=50, seed=3)
    epoch0 = [order.index(p) for p in range(50)]
    epoch1 = [order.index(p) for p in range(50, 100)]
    assert sorted(epoch0) == list(range(50))
    assert sorted(epoch1) == list(range(50))
    assert epoch0 != epoch1
    assert epoch0 == np.random.RandomState(3).permutation(50).tolist()
    assert epoch1 == np.random.RandomState(4).permutation(50).tolist()


def test_sample_order_is_deterministic_and_resumable() -> None:
    first = SampleOrder(num_samples=50, seed=7)
    resumed = SampleOrder(num_samples=50, seed=7)
    assert [first.index(p) for p in range(120)] == [resumed.index(p) for p in range(120)]
    assert first.index(77) == SampleOrder(num_samples=50, seed=7).index(77)
    assert [SampleOrder(50, seed=8).index(p) for p in range(50)] != [
        first.index(p) for p in range(50)
    ]


def test_sample_order_indices_match_index() -> None:
    order = SampleOrder(num_samples=13, seed=1)
    for start, count in [(0, 5), (10, 8), (25, 40), (3, 0)]:
        batch = order.indices(start, count)
        assert batch.dtype == np.int64
        assert batch.tolist() == [order.index(p) for p in range(start, start + count)]


def test_sample_order_without_shuffle() -> None:
    order = SampleOrder(num_samples=4, seed=0, shuffle=False)
    assert [order.index(p) for p in range(6)] == [0, 1, 2, 3, 0, 1]
    assert order.indices(2, 5).tolist() == [2, 3, 0, 1, 2]


def test_sample_order_rejects_empty_corpus() -> None:
    with pytest.raises(ValueError, match="corpus is smaller than one sample"):
        SampleOrder(num_samples=0, seed=0)
    with pytest.raises(ValueError, match="position"):
        SampleOrder(num_samples=3, seed=0).index(-1)
