"""What a masked-LM (model.objective: mlm) shows in place of generated samples: texts with some tokens masked, and
the model's top-1 fill of each masked position.

The positions are those the run's masking would choose for the text (the TEXTS stream of
:mod:`mindfoundry.data.dataset.masking`, position = the text's index), every one of them shown as the mask
token; each text is cut to ``seq_len`` tokens and padded, so one compiled shape serves all of them.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from tokenizers import Tokenizer

from mindfoundry.backends.base import Backend
from mindfoundry.data.dataset.masking import TEXTS, MaskingRule
from mindfoundry.data.dataset.packing import IGNORE_INDEX
from mindfoundry.model.spec import PAD_ID


def fill_masks(
    backend: Backend, tokenizer: Tokenizer, texts: list[str], rule: MaskingRule, seq_len: int
) -> list[dict[str, str]]:
    """[{"prompt": the text as the model saw it (masked), "completion": the model's fill, "correct": "k/n"}] per text.
    """
    shown = replace(rule.for_stream(TEXTS), mask_token_rate=1.0, random_token_rate=0.0)
    out = []
    for i, text in enumerate(texts):
        ids = tokenizer.encode(text).ids[:seq_len]
        row = np.full((1, seq_len), PAD_ID, np.int32)
        row[0, :len(ids)] = ids
        masked, labels = shown.apply(row, np.array([i]))
        chosen = labels[0] != IGNORE_INDEX
        filled = masked[0].copy()
        filled[chosen] = backend.logits(masked)[0, chosen].argmax(-1)
        n = len(ids)
        out.append({"prompt": tokenizer.decode(masked[0, :n].tolist(), skip_special_tokens=False),
                    "completion": tokenizer.decode(filled[:n].tolist(), skip_special_tokens=False),
                    "correct": f"{int((filled[chosen] == labels[0, chosen]).sum())}/{int(chosen.sum())}"})
    return out
