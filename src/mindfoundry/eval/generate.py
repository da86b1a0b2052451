"""Sampling continuations from a trained model through the backend's logits.

No KV cache: each new token re-runs the forward pass on a fixed-length window (one compiled
shape), which is plenty for a few demo samples and keeps the backend interface narrow.
"""

from __future__ import annotations

import numpy as np

from mindfoundry.backends.base import Backend


def sample_next(logits: np.ndarray, temperature: float, top_k: int, rng: np.random.Generator) -> int:
    """Pick a token id from a logits vector (greedy when temperature is 0)."""
    if temperature <= 0:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / temperature
    if 0 < top_k < scaled.size:
        cutoff = np.partition(scaled, -top_k)[-top_k]
        scaled = np.where(scaled < cutoff, -np.inf, scaled)
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    return int(rng.choice(scaled.size, p=probs))


def generate(
    backend: Backend,
    prompt_ids: list[int],
    *,
    window: int,
    max_new_tokens: int,
    temperature: float,
    top_k: int,
    eos_id: int,
    pad_id: int,
    seed: int,
) -> list[int]:
    """Continue `prompt_ids`; stop at EOS or after max_new_tokens."""
    rng = np.random.default_rng(seed)
    tokens = list(prompt_ids) or [eos_id]
    out: list[int] = []
    for _ in range(max_new_tokens):
        context = tokens[-window:]
        buf = np.full((1, window), pad_id, dtype=np.int32)
        buf[0, : len(context)] = context
        logits = backend.logits(buf)[0, len(context) - 1]
        nxt = sample_next(logits, temperature, top_k, rng)
        if nxt == eos_id:
            break
        tokens.append(nxt)
        out.append(nxt)
    return out
