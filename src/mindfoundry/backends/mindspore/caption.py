"""The captioner as MindSpore Cells -- the mirror of backends/torch/caption.py: the ViT encoder, the projector and the
causal decoder under the names of :class:`mindfoundry.model.spec.CaptionSpec` (whose docstring states the
arithmetic). The decoder is the language model itself (:class:`Transformer`, subclassed): its blocks, recompute marks
and precision are the text model's.
"""

from __future__ import annotations

from mindspore import nn, ops

from mindfoundry.backends.mindspore.model import Transformer, eval_sums, token_nll
from mindfoundry.backends.mindspore.vision import Dense, VisionEncoder
from mindfoundry.data.dataset.packing import IGNORE_INDEX
from mindfoundry.model.spec import PAD_ID, CaptionSpec


class Projector(nn.Cell):
    """linear_2(GELU(linear_1(x))): the encoder's width to the decoder's (LLaVA's multi_modal_projector)."""

    def __init__(self, width: int, out: int):
        super().__init__()
        self.linear_1, self.linear_2 = Dense(width, out), Dense(out, out)

    def construct(self, x):
        return self.linear_2(ops.gelu(self.linear_1(x), approximate="none"))


class Captioner(Transformer):
    """Pixels (B, 3, H, W) and caption labels (B, S) -> logits at the caption slots (see the module docstring)."""

    def __init__(self, spec: CaptionSpec, precision: str = "fp32"):
        super().__init__(spec.text, precision)
        self.vision = VisionEncoder(spec.vision)
        self.projector = Projector(spec.vision.d_model, spec.text.d_model)
        self.first = spec.image_tokens - 1  # the position that predicts the first caption token

    def caption_logits(self, pixels, labels):
        prefix = self.projector(self.vision.blocks_output(pixels)[:, 1:])  # (B, L, D): the patch tokens
        ids = ops.where(labels == IGNORE_INDEX, PAD_ID, labels)
        x = ops.concat((prefix, self.embed(ids)), axis=1)  # (B, L + S, D)
        b, t = x.shape[0], x.shape[1]
        cos, sin, mask = self.causal_tables(b, t)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.head(x[:, self.first:self.first + labels.shape[1]])


class CaptionLossCell(nn.Cell):
    """The caption tokens' summed loss times ``scale`` (1 / the caption tokens of the global batch)."""

    def __init__(self, model: Captioner):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, pixels, labels, scale):
        nll, _ = token_nll(self.model.caption_logits(pixels, labels), labels)
        return nll.sum() * scale


class CaptionForward(nn.Cell):
    """The evaluation sums of a batch: summed loss, scored caption tokens, top-1 hits."""

    def __init__(self, model: Captioner):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, pixels, labels):
        return eval_sums(self.model.caption_logits(pixels, labels), labels)

