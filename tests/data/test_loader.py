"""The training loader: rank slices partition the global batch, prefetch changes nothing, resume is exact."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from mindfoundry.config.load import load_config
from mindfoundry.data.dataset.loader import OrderedSamples, TrainLoader, training_source
from mindfoundry.data.dataset.mixture import MixtureSampler
from mindfoundry.data.dataset.packing import SampleOrder
from mindfoundry.data.prepare.pipeline import prepare_data


@pytest.fixture
def source(tiny_prepared) -> OrderedSamples:
    cfg, data = tiny_prepared
    samples = data.packed("train", cfg.train.seq_len)
    return OrderedSamples(samples, SampleOrder(len(samples), cfg.seed))


def take(loader: TrainLoader, position: int, n: int) -> list:
    with loader.iterate(position) as batches:
        return [next(batches) for _ in range(n)]


def test_rank_slices_partition_the_global_batch(source: OrderedSamples) -> None:
    ranks = [TrainLoader(source, micro_batch_size=2, grad_accum=3, dp_rank=r, dp_size=4, prefetch=0) for r in range(4)]
    assert ranks[0].local_batch == 6 and ranks[0].global_batch == 24
    position = 1_001  # any position, not only multiples of the global batch
    parts = [loader.batch(position) for loader in ranks]
    assert parts[0].input_ids.shape == (3, 2, 32)
    ids = np.concatenate([p.input_ids.reshape(6, -1) for p in parts])
    labels = np.concatenate([p.labels.reshape(6, -1) for p in parts])
    whole = source.get_batch(position, 24)
    np.testing.assert_array_equal(ids, whole[0])
    np.testing.assert_array_equal(labels, whole[1])
    # dp=1 is exactly what the trainer feeds today: [grad_accum, micro_batch, seq_len] from positions [p, p + a*b).
    single = TrainLoader(source, micro_batch_size=2, grad_accum=3, prefetch=0).batch(position)
    np.testing.assert_array_equal(single.input_ids, whole[0][:6].reshape(3, 2, -1))


def test_feeds_of_the_run_global_batch(source: OrderedSamples) -> None:
    """The trainer cuts the run's global batch (micro_batch_size * grad_accum * dp, Layout.global_batch) into the
    engine's feeds: 4 data-parallel ranks each read micro-batches of 2; a semi-auto layout with dp=4 feeds every rank
    the
    whole batch (one feed, micro-batches of 8 that its strategies split). It used to feed such a rank micro-batches of
    2, a quarter of the configured global batch."""
    ranks = [TrainLoader.for_global_batch(source, 24, grad_accum=3, dp_rank=r, dp_size=4, prefetch=0) for r in range(4)]
    assert [(r.micro_batch_size, r.global_batch, r.global_micro_batch) for r in ranks] == [(2, 24, 8)] * 4
    whole = TrainLoader.for_global_batch(source, 24, grad_accum=3, prefetch=0)
    assert (whole.micro_batch_size, whole.global_batch, whole.global_micro_batch) == (8, 24, 8)
    np.testing.assert_array_equal(whole.batch(5).input_ids.reshape(24, -1), source.get_batch(5, 24)[0])
    with pytest.raises(ValueError, match="a global batch of 24 does not split into 5 feeds of 3 micro-batches"):
        TrainLoader.for_global_batch(source, 24, grad_accum=3, dp_size=5)


def test_prefetch_returns_the_same_batches_and_resumes_exactly(source: OrderedSamples) -> None:
    plain = take(TrainLoader(source, micro_batch_size=4, grad_accum=2, prefetch=0), 37, 6)
    fetched = take(TrainLoader(source, micro_batch_size=4, grad_accum=2, prefetch=3), 37, 6)
    resumed = take(TrainLoader(source, micro_batch_size=4, grad_accum=2, prefetch=2), 37 + 3 * 8, 3)
    assert [b.position for b in fetched] == [37 + 8 * i for i in range(6)]
    for a, b in zip(plain, fetched):
        np.testing.assert_array_equal(a.input_ids, b.input_ids)
        np.testing.assert_array_equal(a.labels, b.labels)
    for a, b in zip(plain[3:], resumed):
        np.testing.assert_array_equal(a.input_ids, b.input_ids)


def test_closing_stops_the_prefetch_thread(source: OrderedSamples) -> None:
    batches = TrainLoader(source, micro_batch_size=2, prefetch=2).iterate(0)
    next(batches)
    batches.close()
    assert not any(t.name == "mindfoundry-prefetch" for t in threading.enumerate())
    with pytest.raises(StopIteration):
        next(batches)


class Failing:
    """A batch source that breaks at position 16, as a corrupted read would."""

    def get_batch(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        if start >= 16:
            raise OSError(f"read failed at position {start}")
        return np.zeros((count, 3), np.int32), np.zeros((count, 3), np.int32)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_errors_reach_the_training_loop(prefetch: int) -> None:
    with TrainLoader(Failing(), micro_batch_size=8, prefetch=prefetch).iterate(0) as batches:
        assert next(batches).position == 0 and next(batches).position == 8
        with pytest.raises(OSError, match="read failed at position 16"):
            next(batches)


def test_bad_loader_arguments_are_refused(source: OrderedSamples) -> None:
    with pytest.raises(ValueError, match=r"dp_rank must lie in \[0, dp_size=2\), got 2"):
        TrainLoader(source, micro_batch_size=2, dp_rank=2, dp_size=2)
    with pytest.raises(ValueError, match="prefetch must be >= 0"):
        TrainLoader(source, micro_batch_size=2, prefetch=-1)


def test_training_source_follows_the_config(tiny_prepared, tmp_path) -> None:
    plain_cfg, data = tiny_prepared
    assert isinstance(training_source(plain_cfg, data), OrderedSamples)
    cfg = load_config(tmp_path / "run.yaml", ["data.mixture={weights: {code: 3, asyncio: 1}, temperature: 0.7}"])
    logs: list[str] = []
    data = prepare_data(cfg, log=logs.append)
    assert logs == [f"reusing prepared data in {cfg.data.output_dir}"]  # the mixture does not change the shards
    mixture = training_source(cfg, data)
    assert isinstance(mixture, MixtureSampler)
    rows = mixture.realized(0, 4_000)["categories"]
    assert (rows["code"]["samples"], rows["asyncio"]["samples"]) == (3_000, 1_000)
    ids = TrainLoader(mixture, micro_batch_size=4, grad_accum=2).batch(0).input_ids
    assert ids.shape == (2, 4, cfg.train.seq_len) and ids.max() < cfg.model.vocab_size
