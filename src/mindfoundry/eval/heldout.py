"""Held-out evaluation: loss, perplexity and bits per byte on the validation split."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from mindfoundry.backends.base import Backend
from mindfoundry.data.dataset.packing import IGNORE_INDEX, PackedSamples


@dataclass(frozen=True)
class EvalResult:
    loss: float  # mean nats per scored token
    perplexity: float
    bits_per_byte: float  # nats -> bits, per UTF-8 byte of text (tokenizer-independent)
    tokens: int

    def to_dict(self, prefix: str = "val_") -> dict[str, float | int]:
        return {prefix + k: v for k, v in asdict(self).items()}


def evaluate(backend: Backend, samples: PackedSamples, batch_size: int, max_batches: int, bytes_per_token: float) -> EvalResult:
    """Score up to `max_batches` batches of validation samples (deterministic).

    When the cap is below the split's size, samples are taken evenly spaced across the whole
    split, so every source (stored one after another) is represented, not just the first.

    `bytes_per_token` is the validation split's UTF-8 bytes per token (EOS included as a token),
    so bits/byte = loss / ln 2 / bytes_per_token compares runs with different tokenizers.
    """
    n = min(len(samples), batch_size * max_batches)
    if n == 0:
        raise ValueError("the validation split has no samples: raise data.validation_fraction or add data")
    chosen = np.linspace(0, len(samples) - 1, n).round().astype(np.int64)
    total_nll, total_tokens = 0.0, 0
    for start in range(0, n, batch_size):
        idx = chosen[start : start + batch_size]
        ids, labels = samples.get_batch(idx)
        if len(idx) < batch_size:  # keep one compiled shape: pad the batch with fully ignored rows
            ids, labels = _pad_rows(ids, labels, batch_size)
        nll, count = backend.eval_batch(ids, labels)
        total_nll += nll
        total_tokens += count
    loss = total_nll / total_tokens
    return EvalResult(
        loss=loss,
        perplexity=math.exp(min(loss, 50.0)),
        bits_per_byte=loss / math.log(2) / bytes_per_token,
        tokens=total_tokens,
    )


def _pad_rows(ids: np.ndarray, labels: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray]:
    extra = rows - ids.shape[0]
    ids = np.concatenate([ids, np.zeros((extra, ids.shape[1]), ids.dtype)])
    labels = np.concatenate([labels, np.full((extra, labels.shape[1]), IGNORE_INDEX, labels.dtype)])
    return ids, labels
