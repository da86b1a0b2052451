"""Sampling continuations from a trained model, with the engine's key/value cache.

The prompt is run once (prefill), then each new token is one cached step: the model never
re-reads the sequence, so a token costs the same at any position. The cache covers
``model.max_seq_len`` positions: a prompt that would leave no room for ``max_new_tokens`` keeps its
last ``max_seq_len - max_new_tokens`` tokens (:func:`fit_prompt`). The loop, the sampling rule and
the truncation are shared by both engines; each engine only supplies ``new_cache`` and ``decode``.
"""

from __future__ import annotations

import numpy as np

from mindfoundry.backends.base import Backend
from mindfoundry.errors import MindFoundryError


class GenerationError(MindFoundryError, ValueError):
    """Generation settings that cannot work."""


def sample_next(
    logits: np.ndarray, temperature: float, top_k: int, rng: np.random.Generator, top_p: float = 1.0
) -> int:
    """Pick a token id from a logits vector: greedy when temperature is 0, else from the top-k / nucleus (top-p) set."""
    if temperature <= 0:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / temperature
    if 0 < top_k < scaled.size:
        cutoff = np.partition(scaled, -top_k)[-top_k]
        scaled = np.where(scaled < cutoff, -np.inf, scaled)
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    if top_p < 1.0:  # the smallest set of most likely tokens whose probability reaches top_p (up to rounding: the
        # cumulative sum of 0.5 and 0.3 from exp(log(.)) is 0.8 - 1e-16 on some CPUs, which must not admit a third)
        order = np.argsort(-probs, kind="stable")
        keep = np.searchsorted(np.cumsum(probs[order]), top_p - 1e-9) + 1
        probs[order[keep:]] = 0.0
        probs /= probs.sum()
    return int(rng.choice(scaled.size, p=probs))


def fit_prompt(prompt_ids: list[int], max_new_tokens: int, max_seq_len: int) -> list[int]:
    """The prompt as generation sees it: its last max_seq_len - max_new_tokens tokens (all of a shorter one)."""
    if not 1 <= max_new_tokens < max_seq_len:
        raise GenerationError(
            f"max_new_tokens={max_new_tokens} must be between 1 and model.max_seq_len-1 = {max_seq_len - 1}"
        )
    return list(prompt_ids)[-(max_seq_len - max_new_tokens):]


def generate(
    backend: Backend,
    prompt_ids: list[int],
    *,
    max_seq_len: int,
    max_new_tokens: int,
    temperature: float,
    top_k: int,
    eos_id: int,
    seed: int,
    top_p: float = 1.0,
) -> list[int]:
    """Continue `prompt_ids` (an empty prompt starts from EOS, the document boundary); stop at EOS or after
    max_new_tokens. Returns the new token ids."""
    if temperature < 0 or top_k < 0 or not 0 < top_p <= 1:
        raise GenerationError(
            f"temperature={temperature}, top_k={top_k}, top_p={top_p}: use temperature >= 0 (0 = greedy), "
            "top_k >= 0 (0 = all tokens) and 0 < top_p <= 1"
        )
    tokens = fit_prompt(prompt_ids, max_new_tokens, max_seq_len) or [eos_id]
    rng = np.random.default_rng(seed)
    cache = backend.new_cache(max_seq_len)
    logits = backend.decode(np.asarray(tokens), 0, cache)[-1]
    out: list[int] = []
    for _ in range(max_new_tokens):
        nxt = sample_next(logits, temperature, top_k, rng, top_p)
        if nxt == eos_id:
            break
        out.append(nxt)
        logits = backend.decode(np.asarray([nxt]), len(tokens) + len(out) - 1, cache)[0]
    return out
