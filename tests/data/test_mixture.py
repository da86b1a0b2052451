"""The category mixture: realized vs target ratios, exact resume, temperature, and bad weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mindfoundry.config.load import ConfigError
from mindfoundry.data.dataset.indexed import IndexedDataset
from mindfoundry.data.dataset.mixture import MixtureSampler, MixtureSource, largest_remainder, temperature_weights
from mindfoundry.data.dataset.packing import PackedSamples
from mindfoundry.data.dataset.prepared import DataError
from mindfoundry.data.dataset.shard_writer import IndexedDatasetWriter

SEQ = 4
WEIGHTS = {"news": 3.0, "code": 2.0, "literature": 2.0, "reviews": 1.0}


def packed(tmp_path: Path, name: str, num_samples: int, token: int) -> PackedSamples:
    """A source of exactly ``num_samples`` samples whose every token is ``token`` (so rows show their source)."""
    with IndexedDatasetWriter(tmp_path / name, np.uint16) as writer:
        writer.add_document(np.full(num_samples * SEQ + 1, token))
    return PackedSamples([IndexedDataset(tmp_path / name)], SEQ, pad_id=0)


@pytest.fixture
def sources(tmp_path: Path) -> list[MixtureSource]:
    """Four categories; literature has three sources of 100 / 400 / 1600 samples for the temperature."""
    spec = [("daily", "news", 50), ("stdlib", "code", 30), ("reviews", "reviews", 7),
            ("plays", "literature", 100), ("poems", "literature", 400), ("novels", "literature", 1600)]
    return [MixtureSource(name, cat, packed(tmp_path, name, n, token=i + 10)) for i, (name, cat, n) in enumerate(spec)]


def sampler(sources: list[MixtureSource], **kw) -> MixtureSampler:
    return MixtureSampler(
        sources, kw.pop("weights", WEIGHTS), temperature=kw.pop("temperature", 0.5), seed=kw.pop("seed", 3), **kw
    )


def test_realized_ratios_match_the_target_over_100k_samples(sources) -> None:
    report = sampler(sources).realized(0, 100_000)["categories"]
    assert {c: r["samples"] for c, r in report.items()} == {
        "news": 37_500,
        "code": 25_000,
        "literature": 25_000,
        "reviews": 12_500,
    }
    for category, row in report.items():
        assert row["target"] == WEIGHTS[category] / 8
        assert abs(row["realized"] - row["target"]) < 0.01
    # A range that is not whole blocks is off by less than 1/block_size per category.
    partial = sampler(sources).realized(1234, 56_789)["categories"]
    assert all(abs(r["realized"] - r["target"]) < 1e-3 for r in partial.values())


def test_temperature_shares_within_a_category_follow_size_to_the_t(sources) -> None:
    sizes = [100, 400, 1600]
    for t, expected in ((0.5, [1 / 7, 2 / 7, 4 / 7]), (0.0, [1 / 3] * 3), (1.0, [1 / 21, 4 / 21, 16 / 21])):
        np.testing.assert_allclose(temperature_weights(sizes, t), expected)
        rows = sampler(sources, temperature=t).realized(0, 100_000)["sources"]
        literature = sum(rows[n]["samples"] for n in ("plays", "poems", "novels"))
        measured = [rows[n]["samples"] / literature for n in ("plays", "poems", "novels")]
        np.testing.assert_allclose(measured, expected, atol=1e-3)
        assert [rows[n]["target"] for n in ("plays", "poems", "novels")] == pytest.approx([0.25 * e for e in expected])


def test_resume_at_any_position_is_exact(sources) -> None:
    total = 7_777  # several blocks and several epochs of the small sources
    whole = sampler(sources).get_batch(0, total)
    for k in (1, 999, 1000, 4321):
        fresh = sampler(sources)
        first, second = fresh.get_batch(0, k), sampler(sources).get_batch(k, total - k)
        for part in range(2):
            np.testing.assert_array_equal(np.concatenate([first[part], second[part]]), whole[part])
    one_by_one = np.concatenate([sampler(sources).locate(p, 1)[1] for p in range(0, 50)])
    np.testing.assert_array_equal(one_by_one, sampler(sources).locate(0, 50)[1])


def test_batches_hold_the_located_samples_and_each_epoch_visits_every_sample_once(sources) -> None:
    mix = sampler(sources)
    source, sample = mix.locate(0, 20_000)
    ids, labels = mix.get_batch(0, 20_000)
    np.testing.assert_array_equal(ids[:, 0], source + 10)  # every token of source i is i + 10
    for i, s in enumerate(sources):
        assert (labels[source == i] == i + 10).all()
        drawn = sample[source == i]
        n = len(s.samples)
        assert drawn.size >= n
        assert sorted(drawn[:n]) == list(range(n))  # first epoch: a permutation of the source
    assert not np.array_equal(sampler(sources, seed=4).locate(0, 1000)[1], sample[:1000])


def test_largest_remainder_keeps_every_positive_weight_and_sums_to_the_block() -> None:
    assert largest_remainder([3, 2, 2, 1], 1000).tolist() == [375, 250, 250, 125]
    assert largest_remainder([1, 1, 1], 10).tolist() == [4, 3, 3]
    assert largest_remainder([10_000, 1], 10).tolist() == [9, 1]  # the tiny weight still gets a slot
    with pytest.raises(ValueError, match="weights must be positive"):
        largest_remainder([1, 0], 10)


def test_weights_must_name_exactly_the_categories_of_the_data(sources) -> None:
    with pytest.raises(
        DataError,
        match=r"name categories \['code', 'news'\] but the data has \['news', 'code', 'reviews', 'literature'\]",
    ):
        sampler(sources, weights={"news": 1, "code": 1})


def test_zero_weight_and_unknown_categories_are_config_errors(make_config) -> None:
    sources = [
        {"name": "daily", "paths": ["x"], "category": "news"},
        {"name": "lib", "paths": ["y"], "category": "code"},
    ]
    with pytest.raises(ConfigError) as err:
        make_config(data={"sources": sources, "mixture": {"weights": {"news": 0, "cdoe": 1}}})
    assert str(err.value).splitlines()[1:] == [
        "  data.mixture.weights.news=0.0: weights must be > 0; to train without category 'news', remove its sources "
        "(daily) from data.sources",
        "  data.mixture.weights.cdoe: no source has category 'cdoe' (categories: news, code): "
        "fix the name or remove it",
        "  data.mixture.weights has no weight for category 'code' (sources: lib): add one, or remove those sources",
    ]
    with pytest.raises(ConfigError, match=r"data.mixture.temperature=1.5: must be between 0 .* and 1"):
        make_config(data={"sources": sources, "mixture": {"weights": {"news": 1, "code": 1}, "temperature": 1.5}})
    cfg = make_config(data={"sources": sources, "mixture": {"weights": {"news": 3, "code": 1}, "temperature": 0.7}})
    assert cfg.data.mixture.weights == {"news": 3.0, "code": 1.0} and cfg.data.mixture.block_size == 1000


def test_a_category_without_any_sample_is_an_error_and_an_empty_source_is_never_drawn(tmp_path: Path, sources) -> None:
    empty = MixtureSource("stub", "code", packed(tmp_path, "stub", 0, token=99))  # 1 token: no sample
    assert len(empty.samples) == 0
    mix = sampler([*sources, empty])
    assert mix.realized(0, 10_000)["sources"]["stub"]["samples"] == 0
    alone = [s for s in sources if s.category != "code"] + [empty]
    with pytest.raises(
        DataError,
        match=r"category 'code' has no training sample of 4 tokens \(sources: stub\): add data, lower train.seq_len",
    ):
        sampler(alone)
