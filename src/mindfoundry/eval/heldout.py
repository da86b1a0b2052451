"""Held-out evaluation: loss, perplexity, bits per byte and top-1 accuracy on the validation split (overall and
per category), or on any documents (:func:`evaluate_texts`).

For the clm objective every next token is scored; for mlm (a ``masking`` rule given) the masked positions,
masked with the run's validation (or texts) stream so that every evaluation sees the same masks: the loss is
then the masked-token loss, the perplexity its exponential and the accuracy the share of masked tokens predicted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace

import numpy as np
from tokenizers import Tokenizer

from mindfoundry.backends.base import Backend
from mindfoundry.config.schema import RunConfig
from mindfoundry.data.dataset.captions import CaptionSamples
from mindfoundry.data.dataset.loader import Samples, split_bytes_per_token, split_samples
from mindfoundry.data.dataset.masking import VALIDATION, Masking, MaskingRule, masking_for
from mindfoundry.data.dataset.packing import IGNORE_INDEX, PackedSamples
from mindfoundry.data.dataset.prepared import PreparedData
from mindfoundry.data.tokenizer import encode_batch, pad_id
from mindfoundry.model.spec import PAD_ID


@dataclass(frozen=True)
class EvalResult:
    loss: float  # mean nats per scored token (mae: mean squared error per masked patch)
    perplexity: float | None  # None for an image objective (its loss is no log-likelihood)
    bits_per_byte: (
        # nats -> bits, per UTF-8 byte of text (tokenizer-independent; for mlm only comparable between mlm runs); None
        # for an image objective
        float | None
    )
    tokens: int  # scored tokens (mae: masked patches)
    accuracy: float | None = (
        # share of the scored tokens that are the model's top-1 prediction (None: a record from before it was measured)
        None
    )

    def to_dict(self, prefix: str = "val_") -> dict[str, float | int]:
        return {prefix + k: v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class HeldOut:
    """A run's validation split as its objective scores it: the samples, their bytes per token (None for mae) and the
    validation masks (mlm, mae)."""

    samples: Samples
    bytes_per_token: float | None
    masking: Masking | None

    def score(self, backend: Backend, batch_size: int, max_samples: int | None) -> EvalResult:
        """:func:`evaluate` on up to ``max_samples`` of it (None: all)."""
        return evaluate(backend, self.samples, batch_size, max_samples, self.bytes_per_token, self.masking)

    def with_shuffled_images(self) -> HeldOut | None:
        """A captioner's split with each caption given another sample's image (None for other objectives): its loss
        against the true images' is what the captioner reads from them."""
        if not isinstance(self.samples, CaptionSamples):
            return None
        return replace(self, samples=self.samples.with_shuffled_images())


def held_out(cfg: RunConfig, data: PreparedData) -> HeldOut:
    """The validation split of ``cfg``'s objective (the one place that assembles it)."""
    samples = split_samples(cfg, data, "validation")
    return HeldOut(samples, split_bytes_per_token(cfg, data, samples, "validation"),
                   masking_for(cfg, data.tokenizer, VALIDATION))


def evaluate(backend: Backend, samples: Samples, batch_size: int, max_samples: int | None,
             bytes_per_token: float | None, masking: Masking | None = None) -> EvalResult:
    """Score up to `max_samples` validation samples (None: all) in batches of `batch_size`, masked by sample index
    with `masking` (mlm).

    When the cap is below the split's size, samples are taken evenly spaced across the whole
    split, so every source (stored one after another) is represented, not just the first; which samples depends on
    the cap and the split only, never on the batch size (a layout or micro-batch change scores the same samples).

    `bytes_per_token` is the validation split's UTF-8 bytes per token (EOS included as a token),
    so bits/byte = loss / ln 2 / bytes_per_token compares runs with different tokenizers; None for images (the
    image objectives' losses are no log-likelihoods: no perplexity, no bits per byte).
    """
    n = len(samples) if max_samples is None else min(len(samples), max_samples)
    if n == 0:
        raise ValueError("the validation split has no samples: raise data.validation_fraction or add data")
    chosen = np.linspace(0, len(samples) - 1, n).round().astype(np.int64)
    pieces = (chosen[start : start + batch_size] for start in range(0, n, batch_size))
    batches = (_masked(samples.get_batch(idx), idx, masking) for idx in pieces)
    return _result(*_score(backend, batches, batch_size), bytes_per_token)


def _masked(
    batch: tuple[np.ndarray, np.ndarray], positions: np.ndarray, masking: Masking | None
) -> tuple[np.ndarray, np.ndarray, int]:
    """A clm batch as it is, or its inputs masked at `positions` (mlm, mae); and the label of a padding row."""
    if masking is None:
        return (*batch, IGNORE_INDEX)
    return (*masking.apply(batch[0], positions), masking.pad_label)


def _score(
    backend: Backend, batches: Iterable[tuple[np.ndarray, np.ndarray, int]], batch_size: int
) -> tuple[float, int, int]:
    """Summed loss, scored tokens and correct top-1 predictions over batches; a short last batch is padded with fully
    ignored rows so that one compiled shape serves every batch."""
    total_nll, total_tokens, total_correct = 0.0, 0, 0
    for ids, labels, pad_label in batches:
        if len(ids) < batch_size:
            ids, labels = _pad_rows(ids, labels, batch_size, pad_label)
        nll, count, correct = backend.eval_batch(ids, labels)
        total_nll += nll
        total_tokens += count
        total_correct += correct
    return total_nll, total_tokens, total_correct


def _result(nll: float, tokens: int, correct: int, bytes_per_token: float | None) -> EvalResult:
    loss = nll / tokens
    if bytes_per_token is None:
        return EvalResult(loss=loss, perplexity=None, bits_per_byte=None, tokens=tokens)
    return EvalResult(
        loss=loss,
        perplexity=math.exp(min(loss, 50.0)),
        bits_per_byte=loss / math.log(2) / bytes_per_token,
        tokens=tokens,
        accuracy=correct / tokens,
    )


def evaluate_categories(backend: Backend, data: PreparedData, seq_len: int, batch_size: int,
                        max_samples: int | None, masking: MaskingRule | None = None) -> dict[str, EvalResult]:
    """:func:`evaluate` on the whole validation split ("all") and on each category's sources alone (a category's
    samples are masked by their index among that category's samples)."""
    out = {
        "all": evaluate(
            backend,
            data.packed("validation", seq_len),
            batch_size,
            max_samples,
            data.bytes_per_token("validation"),
            masking,
        )
    }
    by_category: dict[str, list[int]] = {}
    for i, source in enumerate(data.manifest["sources"]):  # the validation shards are stored in source order
        by_category.setdefault(source["category"], []).append(i)
    for category, indices in by_category.items():
        counts = [data.manifest["sources"][i]["splits"]["validation"] for i in indices]
        if sum(c["documents"] for c in counts) == 0:
            continue
        samples = PackedSamples([data.shards["validation"][i] for i in indices], seq_len, pad_id(data.tokenizer))
        bytes_per_token = sum(c["bytes"] for c in counts) / max(sum(c["tokens"] for c in counts), 1)
        out[category] = evaluate(backend, samples, batch_size, max_samples, bytes_per_token, masking)
    return out


def evaluate_texts(backend: Backend, tokenizer: Tokenizer, texts: Iterable[str], seq_len: int, batch_size: int,
                   masking: MaskingRule | None = None) -> EvalResult:
    """Document-level perplexity of `texts`, scored as the validation split is: each document tokenized and ended
    with EOS, the documents concatenated and cut into consecutive windows of seq_len + 1 tokens overlapping by
    one (stride seq_len), so every token but the first is scored once, with the earlier tokens of its window as
    context (mlm: each window's first seq_len tokens, masked by window index). Bits per byte divide by the
    documents' UTF-8 bytes per token (EOS counted as a token)."""
    texts = [t for t in texts if t]
    if not texts:
        raise ValueError("no documents to evaluate")
    stream = np.concatenate(encode_batch(tokenizer, texts)).astype(np.int64)
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    windows = -(-(len(stream) - 1) // seq_len)
    ids = np.full((windows, seq_len), pad_id(tokenizer), np.int32)
    labels = np.full((windows, seq_len), IGNORE_INDEX, np.int32)
    for w in range(windows):
        piece = stream[w * seq_len : w * seq_len + seq_len + 1]
        ids[w, : len(piece) - 1], labels[w, : len(piece) - 1] = piece[:-1], piece[1:]
    pieces = (np.arange(start, min(start + batch_size, windows)) for start in range(0, windows, batch_size))
    batches = (_masked((ids[w], labels[w]), w, masking) for w in pieces)
    return _result(*_score(backend, batches, batch_size), n_bytes / len(stream))


def _pad_rows(ids: np.ndarray, labels: np.ndarray, rows: int, pad_label: int) -> tuple[np.ndarray, np.ndarray]:
    """Fill a short batch with rows of padding (the pad token; zero pixels) that score nothing."""
    extra = rows - ids.shape[0]
    ids = np.concatenate([ids, np.full((extra, *ids.shape[1:]), PAD_ID if ids.dtype.kind == "i" else 0, ids.dtype)])
    labels = np.concatenate([labels, np.full((extra, *labels.shape[1:]), pad_label, labels.dtype)])
    return ids, labels
