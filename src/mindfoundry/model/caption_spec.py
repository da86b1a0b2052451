"""Framework-free description of the captioner (``objective: caption``, LLaVA's first stage): the ViT encoder of
:mod:`.vision_spec` (its ``vision.*`` parameters, shared with the MAE), a two-layer projector and the causal language
model of :mod:`.spec` under its own names, so an MAE checkpoint starts the encoder and a text checkpoint the decoder.

::

    vision.*                              the ViT encoder (vision_spec.encoder_parameter_shapes)
    projector.linear_1.weight             [D, C]  (+ .bias [D])    C = the ViT's width, D = the decoder's
    projector.linear_2.weight             [D, D]  (+ .bias [D])
    embed.weight, layers.*, norm.weight   the decoder (spec.parameter_shapes)

An image enters as its L patch tokens: the encoder's last block's outputs before its final norm (LLaVA's
``vision_feature_layer: -1`` on a ViT, whose hidden states are taken before the norm), the cls token left out
(``vision_feature_select_strategy: default``), each through linear_1, exact GELU, linear_2. They are the first L
positions of the decoder's sequence (the ``<|image|>`` placeholders' places), the caption's tokens follow, all
causal, RoPE positions counted from the first image token; the position before each caption token predicts it (the
last image token the first caption token), so only caption tokens carry a loss. That is
``LlavaForConditionalGeneration``'s arithmetic, which `export --format hf` writes (:mod:`..checkpoint.hf_llava`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from mindfoundry.config.model_config import ModelConfig
from mindfoundry.model.vision_spec import VisionSpec, blocks_flops, encoder_parameter_shapes, init_vision_weights

if TYPE_CHECKING:  # spec.py imports this module to dispatch on it
    from mindfoundry.model.spec import ModelSpec


@dataclass(frozen=True)
class CaptionSpec:
    """The captioner: the ViT encoder ``vision`` and the decoder ``text`` (a causal ModelSpec)."""

    vision: VisionSpec
    text: ModelSpec

    @classmethod
    def from_config(cls, m: ModelConfig, text: ModelSpec) -> CaptionSpec:
        return cls(VisionSpec.from_config(m), text)

    @property
    def n_layers(self) -> int:
        """The decoder's blocks (what memory.recompute counts)."""
        return self.text.n_layers

    @property
    def image_tokens(self) -> int:
        return self.vision.num_patches

    def to_dict(self) -> dict:
        return {"vision": asdict(self.vision), "text": self.text.to_dict()}


def projector_shapes(spec: CaptionSpec) -> dict[str, tuple[int, ...]]:
    c, d = spec.vision.d_model, spec.text.d_model
    return {"projector.linear_1.weight": (d, c), "projector.linear_1.bias": (d,),
            "projector.linear_2.weight": (d, d), "projector.linear_2.bias": (d,)}


def caption_parameter_shapes(spec: CaptionSpec, text_shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The encoder's, the projector's and the decoder's (``text_shapes``) parameters, in that order."""
    return encoder_parameter_shapes(spec.vision) | projector_shapes(spec) | text_shapes


def init_caption_weights(spec: CaptionSpec, seed: int, text_weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The encoder as the MAE starts it, the projector Xavier-uniform with zero biases (its own stream), the decoder's
    ``text_weights``."""
    encoder = {n: w for n, w in init_vision_weights(spec.vision, seed).items() if n.startswith("vision.")}
    rng = np.random.Generator(np.random.PCG64([seed, 1 << 20]))  # apart from every decoder parameter's stream
    projector = {}
    for name, shape in projector_shapes(spec).items():
        if name.endswith(".bias"):
            projector[name] = np.zeros(shape, np.float32)
        else:
            bound = np.sqrt(6.0 / (shape[0] + shape[1]))
            projector[name] = rng.uniform(-bound, bound, shape).astype(np.float32)
    return encoder | projector | text_weights


def caption_flops_per_token(spec: CaptionSpec, seq_len: int, text_flops_per_token: int) -> int:
    """Training FLOPs per token of the decoder's L + seq_len sequence: the decoder's own, plus the encoder over every
    patch and the projector, spread over the sequence's tokens (three forwards each)."""
    v, length = spec.vision, spec.image_tokens + seq_len
    c, d = v.d_model, spec.text.d_model
    image = (2 * v.num_patches * c * v.patch_dim + blocks_flops(v.num_patches + 1, c, v.ffn_dim, v.n_layers)
             + 2 * v.num_patches * (c * d + d * d))
    return text_flops_per_token + 3 * image // length
