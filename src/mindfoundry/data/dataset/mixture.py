"""Category mixture: target ratios between data categories, temperature sampling of sources inside each.

Without a mixture, training reads all shards as one stream, so every category is seen in
proportion to its size: a large code dump drowns a small, valuable news source. A mixture fixes
the share of each category (``news: 3, code: 2, literature: 2, reviews: 1``) and, inside a
category, draws its sources with probability proportional to ``(size in samples) ** T``
(temperature ``T``: 1 = by size, 0 = uniform), so small sources are upsampled without letting
them dominate.

Every source is packed on its own (a :class:`PackedSamples` per train shard), so no sample mixes
two sources. The map from the global position ``p`` (samples consumed since the start of
training) to ``(source, sample index)`` is a pure function of ``(seed, p)``, in three levels:

1. **Category**: positions are cut into blocks of ``block_size``. Every block holds exactly
   ``quota[c]`` slots of category ``c`` (the largest-remainder rounding of the weights, at least
   one slot each), shuffled per block with ``RandomState([seed, 0, 0, block])``. The ``k``-th slot
   of ``c`` in block ``b`` is the category's draw number ``b * quota[c] + k``.
2. **Source**: each category's draws are split among its sources the same way, with weights
   ``size ** T`` and ``RandomState([seed, 1, category, block])``.
3. **Sample**: a source's ``n``-th draw reads sample ``SampleOrder(...).index(n)``, a fresh
   permutation per pass over the source (an epoch), seeded per source.

So the ratios are exact in every full block (off by less than ``1 / block_size`` in a partial
one), and resuming at any sample costs one block layout per level: no replay from 0.

Framework-free on purpose, like the rest of ``mindfoundry.data``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mindfoundry.config.data_config import MixtureConfig
from mindfoundry.data.dataset.packing import PackedSamples, SampleOrder
from mindfoundry.data.dataset.prepared import DataError, PreparedData
from mindfoundry.data.tokenizer import pad_id

__all__ = ["MixtureSampler", "MixtureSource", "build_mixture", "largest_remainder", "temperature_weights"]

# Stream tags in the RandomState seed words, so no two levels ever share a random stream.
_CATEGORY_LAYOUT, _SOURCE_LAYOUT, _SOURCE_ORDER = 0, 1, 2


def _rng(*words: int) -> np.random.RandomState:
    """A legacy RandomState (its streams never change across numpy versions) seeded by several ints.

    Each int is split into two 32-bit words so that seeds and block numbers of any size work.
    """
    seed = [part for w in words for part in (w & 0xFFFFFFFF, w >> 32)]
    return np.random.RandomState(seed)


def largest_remainder(weights: Sequence[float], total: int) -> np.ndarray:
    """Integer quotas summing to ``total``, proportional to ``weights``, every one at least 1.

    The floor of one slot per member is what keeps a tiny (but positive) weight from silently
    rounding to zero; it is taken from the largest quotas, where it distorts the ratio least.
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.size == 0 or not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise ValueError(f"weights must be positive and finite, got {list(weights)}")
    if total < w.size:
        raise ValueError(f"{total} slots cannot give each of {w.size} members at least one")
    exact = w / w.sum() * total
    quotas = np.floor(exact).astype(np.int64)
    # Stable sort on the negated remainders: ties go to the earlier member, deterministically.
    by_remainder = np.argsort(-(exact - quotas), kind="stable")
    quotas[by_remainder[: total - int(quotas.sum())]] += 1
    while (quotas == 0).any():
        quotas[int(np.argmax(quotas))] -= 1
        quotas[int(np.argmax(quotas == 0))] += 1
    return quotas


def temperature_weights(sizes: Sequence[int], temperature: float) -> np.ndarray:
    """Sampling shares ``size ** T / sum(size ** T)`` of the sources of one category."""
    raised = np.asarray(sizes, dtype=np.float64) ** temperature
    return raised / raised.sum()


class _QuotaSchedule:
    """Maps a stream position to (member, that member's draw number), exactly proportional per block."""

    def __init__(self, quotas: np.ndarray, seed_words: tuple[int, ...]) -> None:
        self.quotas = quotas
        self.block_size = int(quotas.sum())
        self._seed_words = seed_words
        self._slots = np.repeat(np.arange(quotas.size), quotas)
        # Where each member's slots start in the sorted (unshuffled) layout.
        self._first_slot = np.repeat(np.cumsum(quotas) - quotas, quotas)
        self._cache: tuple[int, np.ndarray, np.ndarray] | None = None

    def _block(self, block: int) -> tuple[np.ndarray, np.ndarray]:
        """Member of every slot of ``block``, and each slot's rank among its member's slots."""
        cached = self._cache
        if cached is not None and cached[0] == block:
            return cached[1], cached[2]
        layout = _rng(*self._seed_words, block).permutation(self._slots)
        rank = np.empty(self.block_size, dtype=np.int64)
        rank[np.argsort(layout, kind="stable")] = np.arange(self.block_size) - self._first_slot
        self._cache = (block, layout, rank)
        return layout, rank

    def lookup(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Members and draw numbers of positions ``[start, start + count)``.

        Within a contiguous range of positions, each member's draw numbers are contiguous and
        increasing, which is what lets the next level look them up as a range too.
        """
        members = np.empty(count, dtype=np.int64)
        draws = np.empty(count, dtype=np.int64)
        pos = start
        while pos < start + count:
            block, offset = divmod(pos, self.block_size)
            take = min(self.block_size - offset, start + count - pos)
            layout, rank = self._block(block)
            out = slice(pos - start, pos - start + take)
            members[out] = layout[offset : offset + take]
            draws[out] = block * self.quotas[members[out]] + rank[offset : offset + take]
            pos += take
        return members, draws


@dataclass(frozen=True)
class MixtureSource:
    """One source's training samples, tagged with its category."""

    name: str
    category: str
    samples: PackedSamples


class MixtureSampler:
    """Training batches drawn from several sources by category ratio, as a pure function of position.

    ``get_batch(start, count)`` is a drop-in for the trainer's ``samples.get_batch(order.indices(
    start, count))``: the same inputs give the same batch in any process, at any time, so a
    checkpoint only needs the position. Not meant for concurrent use from several threads (it
    caches the current block layouts and epoch permutations); a prefetching loader owns it.
    """

    def __init__(
        self,
        sources: Sequence[MixtureSource],
        weights: Mapping[str, float],
        *,
        temperature: float,
        seed: int,
        shuffle: bool = True,
        block_size: int = 1000,
    ) -> None:
        self.sources = list(sources)
        self.seed = seed
        self.temperature = temperature
        self.categories = _categories(self.sources, weights)
        self._target = np.array([weights[c] for c in self.categories], dtype=np.float64)
        self._target /= self._target.sum()
        # Sources without a single sample cannot be drawn; _categories made sure none is left empty.
        self._members = [[i for i, s in enumerate(self.sources) if s.category == c and len(s.samples)]
                         for c in self.categories]
        self._layout = _QuotaSchedule(largest_remainder(self._target, block_size), (seed, _CATEGORY_LAYOUT, 0))
        self._source_share = np.zeros(len(self.sources))
        self._source_layouts = []
        for c, members in enumerate(self._members):
            shares = temperature_weights([len(self.sources[i].samples) for i in members], temperature)
            self._source_share[members] = self._target[c] * shares
            self._source_layouts.append(
                _QuotaSchedule(largest_remainder(shares, block_size), (seed, _SOURCE_LAYOUT, c))
            )
        self._orders = {
            i: SampleOrder(len(self.sources[i].samples), int(_rng(seed, _SOURCE_ORDER, i).randint(2**31)), shuffle)
            for members in self._members for i in members
        }

    @property
    def seq_len(self) -> int:
        return self.sources[0].samples.seq_len

    def locate(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """``(source index, sample index within that source)`` for positions ``[start, start + count)``."""
        if start < 0 or count < 0:
            raise ValueError(f"start and count must be >= 0, got start={start}, count={count}")
        categories, category_draws = self._layout.lookup(start, count)
        source = np.empty(count, dtype=np.int64)
        sample = np.empty(count, dtype=np.int64)
        for c in np.unique(categories):
            rows = np.flatnonzero(categories == c)
            picks, source_draws = self._source_layouts[c].lookup(int(category_draws[rows[0]]), rows.size)
            for j in np.unique(picks):
                mine = picks == j
                s = self._members[c][j]
                source[rows[mine]] = s
                sample[rows[mine]] = self._orders[s].indices(int(source_draws[mine][0]), int(mine.sum()))
        return source, sample

    def get_batch(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """``(input_ids, labels)``, int32 ``[count, seq_len]``, for positions ``[start, start + count)``."""
        source, sample = self.locate(start, count)
        shape = (count, self.seq_len)
        input_ids = np.empty(shape, dtype=np.int32)
        labels = np.empty(shape, dtype=np.int32)
        for s in np.unique(source):
            rows = source == s
            input_ids[rows], labels[rows] = self.sources[s].samples.get_batch(sample[rows])
        return input_ids, labels

    def target(self) -> dict[str, dict[str, float]]:
        """Configured shares: per category (the normalised weights) and per source (within that, by ``size ** T``)."""
        return {
            "categories": dict(zip(self.categories, self._target.tolist())),
            "sources": {s.name: float(self._source_share[i]) for i, s in enumerate(self.sources)},
        }

    def realized(self, start: int, count: int) -> dict[str, dict[str, dict[str, float]]]:
        """Target and realized share, and sample count, per category and per source over a position range."""
        source, _ = self.locate(start, count)
        per_source = np.bincount(source, minlength=len(self.sources))
        per_category = np.array([per_source[m].sum() for m in self._members])
        target = self.target()

        def rows(names: Sequence[str], counts: np.ndarray, shares: dict[str, float]) -> dict[str, dict[str, float]]:
            return {
                n: {"target": shares[n], "realized": int(k) / max(count, 1), "samples": int(k)}
                for n, k in zip(names, counts)
            }

        return {
            "categories": rows(self.categories, per_category, target["categories"]),
            "sources": rows([s.name for s in self.sources], per_source, target["sources"]),
        }

    def state(self, position: int) -> dict[str, Any]:
        """What a checkpoint records: the position plus what the order is a function of (to detect a change)."""
        return {
            "kind": "mixture", "position": position, "seed": self.seed, "temperature": self.temperature,
            "block_size": self._layout.block_size, "weights": dict(zip(self.categories, self._target.tolist())),
            "source_samples": {s.name: len(s.samples) for s in self.sources},
        }


def _categories(sources: Sequence[MixtureSource], weights: Mapping[str, float]) -> list[str]:
    """Categories in first-seen source order, each with a weight and at least one sample."""
    categories = list(dict.fromkeys(s.category for s in sources))
    missing = [c for c in categories if c not in weights]
    unknown = [c for c in weights if c not in categories]
    if not categories or missing or unknown:
        raise DataError(f"the mixture weights name categories {sorted(weights)} but the data has {categories} "
                        "(set data.mixture.weights to exactly the categories of data.sources)")
    for c in categories:
        mine = [s for s in sources if s.category == c]
        if sum(len(s.samples) for s in mine) == 0:
            raise DataError(
                f"category '{c}' has no training sample of {mine[0].samples.seq_len} tokens (sources: "
                f"{', '.join(s.name for s in mine)}): add data, lower train.seq_len, or remove those sources"
            )
    return categories


def build_mixture(
    data: PreparedData, mixture: MixtureConfig, *, seq_len: int, seed: int, shuffle: bool = True
) -> MixtureSampler:
    """The mixture over a prepared folder's train shards (one per source), as the config asks.

    A source whose train shard is too small for a single sample is never drawn (there is nothing
    to draw); its category is still trained on as long as another of its sources has samples.
    """
    shards = {info["path"]: ds for info, ds in zip(data.manifest["splits"]["train"]["shards"], data.shards["train"])}
    sources = [
        MixtureSource(entry["name"], entry["category"] or entry["name"],
                      PackedSamples([shards[f"train/{entry['name']}"]], seq_len, pad_id(data.tokenizer)))
        for entry in data.manifest["sources"]
    ]
    return MixtureSampler(sources, mixture.weights, temperature=mixture.temperature, seed=seed,
                          shuffle=shuffle, block_size=mixture.block_size)
