"""The captioner as a torch Module -- the mirror of backends/mindspore/caption.py: the ViT encoder, the projector and
the causal decoder under the names of :class:`mindfoundry.model.spec.CaptionSpec`, whose docstring states the arithmetic
(LLaVA's). The decoder is the language model itself (:class:`Transformer`, subclassed), so its blocks, recompute flags
and parallel plans are the text model's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mindfoundry.backends.torch.model import Transformer, token_nll
from mindfoundry.backends.torch.vision import Block, VisionEncoder, image_features
from mindfoundry.data.dataset.packing import IGNORE_INDEX
from mindfoundry.model.spec import PAD_ID, CaptionSpec


class Projector(nn.Module):
    """linear_2(GELU(linear_1(x))): the encoder's width to the decoder's (LLaVA's multi_modal_projector)."""

    def __init__(self, width: int, out: int):
        super().__init__()
        self.linear_1, self.linear_2 = nn.Linear(width, out), nn.Linear(out, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.gelu(self.linear_1(x)))


class Captioner(Transformer):
    """Pixels (B, 3, H, W) and caption labels (B, S) -> the caption's token loss (see the module docstring)."""

    def __init__(self, spec: CaptionSpec):
        super().__init__(spec.text)
        self.caption_spec = spec
        self.vision = VisionEncoder(spec.vision)
        self.projector = Projector(spec.vision.d_model, spec.text.d_model)

    def blocks(self) -> list[nn.Module]:
        """The encoder's blocks, then the decoder's (FSDP's units)."""
        encoder: list[Block] = list(self.vision.layers)
        return [*encoder, *self.layers]

    def caption_logits(self, pixels: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """(B, S, V): at each caption slot, the logits of the position before it (the last image token's for the
        first); ``labels`` (B, S) hold the caption's ids, IGNORE_INDEX past its end (fed as PAD)."""
        prefix = self.projector(self.vision.blocks_output(pixels)[:, 1:])  # (B, L, D): the patch tokens
        ids = labels.masked_fill(labels == IGNORE_INDEX, PAD_ID)
        x = self.hidden(torch.cat([prefix, self.embed(ids)], dim=1))  # (B, L + S, D), causal
        first = prefix.shape[1] - 1
        return self._head(x[:, first:first + labels.shape[1]])

    def forward(self, pixels: torch.Tensor, labels: torch.Tensor | None = None,
                logits: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """(summed caption-token loss, scored tokens); with ``logits``, :meth:`caption_logits`; without labels, the
        encoder's image features (:func:`image_features`). Every use goes through the forward, so that FSDP's hooks
        gather the weights."""
        if labels is None:
            return image_features(self.vision, pixels)
        if logits:
            return self.caption_logits(pixels, labels)
        return token_nll(self.caption_logits(pixels, labels), labels)
