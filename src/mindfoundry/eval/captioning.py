"""Greedy captions from a captioner (``objective: caption``): each step scores the caption slots of the image and the
tokens so far (the slots after them hold padding, which a causal model's earlier slots never see) and appends the most
likely token, so one fixed-shape forward serves every step (MindSpore compiles it once). Stops at EOS or the slots'
end (``train.seq_len``).
"""

from __future__ import annotations

import numpy as np

from mindfoundry.backends.base import Backend
from mindfoundry.data.dataset.packing import IGNORE_INDEX


def greedy_caption(backend: Backend, pixels: np.ndarray, slots: int, eos: int | None,
                   max_new_tokens: int | None = None) -> list[int]:
    """The caption token ids of one image's pixel values [3, H, W] (EOS not included); ``eos`` None: never stop
    early (a comparison of whole token sequences)."""
    labels = np.full((1, slots), IGNORE_INDEX, np.int32)
    out: list[int] = []
    for t in range(min(slots, max_new_tokens or slots)):
        token = int(np.argmax(backend.caption_logits(pixels[None], labels)[0, t]))
        if token == eos:
            break
        labels[0, t] = token
        out.append(token)
    return out
