"""Framework-free description of the vision models: a ViT encoder and, for ``objective: mae``, the masked
autoencoder's light decoder (He et al. 2021) -- parameter names and shapes, the fixed position embeddings, the mask
from per-sample noise, the pixel input and the MAE target. Both engines build their modules from
:class:`VisionSpec` with exactly these names, ``[out, in]`` linear layouts (the patch embedding a conv kernel
``[d_model, 3, p, p]``), so one safetensors file loads into either; Hugging Face ``ViTMAEForPreTraining`` is the
same arithmetic under other names (``checkpoint/hf_export.vit_mae_names``).

Parameter naming scheme (C = d_model, F = ffn_dim, Cd / Fd the decoder's, P = patch_size^2 * 3)::

    vision.patch_embed.weight                 [C, 3, p, p]   (+ .bias [C])
    vision.cls_token                          [1, 1, C]
    vision.layers.{i}.norm1.weight|bias       [C]
    vision.layers.{i}.attn.{q,k,v,o}_proj.weight  [C, C]     (+ .bias [C])
    vision.layers.{i}.norm2.weight|bias       [C]
    vision.layers.{i}.mlp.fc1.weight          [F, C]         (+ .bias [F])
    vision.layers.{i}.mlp.fc2.weight          [C, F]         (+ .bias [C])
    vision.norm.weight|bias                   [C]
    mae.embed.weight                          [Cd, C]        (+ .bias [Cd])
    mae.mask_token                            [1, 1, Cd]
    mae.layers.{i}.*                          the block above at Cd, Fd
    mae.norm.weight|bias                      [Cd]
    mae.pred.weight                           [P, Cd]        (+ .bias [P])

A block is pre-norm: x + attn(LayerNorm(x)), then x + fc2(GELU(fc1(LayerNorm(x)))), GELU exact (erf), attention
softmax(q k^T / sqrt(head_dim)) v over all tokens. The position embeddings are fixed (2-D sine-cosine, the cls
token's row zero), computed here and never trained. The mask comes from the data layer
(:mod:`mindfoundry.data.dataset.image_masking`): a sample's patches sorted by noise that is a function of (seed,
sample position), the first :attr:`VisionSpec.kept` visible, so both engines, every layout and every resume mask
alike.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from mindfoundry.config.model_config import ModelConfig

#: The per-channel mean and standard deviation the pixels are normalised with (ImageNet's, as Hugging Face's
#: ViT image processors do), so an exported model's preprocessor is the standard one.
PIXEL_MEAN = (0.485, 0.456, 0.406)
PIXEL_STD = (0.229, 0.224, 0.225)
#: Added to a patch's variance before its square root in the normalised-pixel target (MAE's).
TARGET_EPS = 1e-6


@dataclass(frozen=True)
class VisionSpec:
    """The ViT encoder and the MAE decoder (see the module docstring)."""

    image_size: int
    patch_size: int
    d_model: int
    n_layers: int
    n_heads: int
    ffn_dim: int
    decoder_d_model: int
    decoder_layers: int
    decoder_heads: int
    decoder_ffn_dim: int
    mask_ratio: float = 0.75
    norm_eps: float = 1e-12
    channels: int = 3

    @classmethod
    def from_config(cls, m: ModelConfig) -> VisionSpec:
        v = m.vision
        if v is None or v.image_size is None or v.ffn_dim is None or m.mae.decoder_ffn_dim is None:
            raise ValueError("VisionSpec needs a resolved config with model.vision: use config.load_config")
        return cls(image_size=v.image_size, patch_size=v.patch_size, d_model=v.d_model, n_layers=v.n_layers,
                   n_heads=v.n_heads, ffn_dim=v.ffn_dim, decoder_d_model=m.mae.decoder_d_model,
                   decoder_layers=m.mae.decoder_layers, decoder_heads=m.mae.decoder_heads,
                   decoder_ffn_dim=m.mae.decoder_ffn_dim, mask_ratio=m.mae.mask_ratio, norm_eps=v.norm_eps)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def grid(self) -> int:
        """Patches per side."""
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid * self.grid

    @property
    def patch_dim(self) -> int:
        """Values per patch: its pixels times the channels."""
        return self.patch_size * self.patch_size * self.channels

    @property
    def kept(self) -> int:
        """Visible patches per sample (Hugging Face's rounding: down)."""
        return int(self.num_patches * (1 - self.mask_ratio))


def _block_shapes(prefix: str, width: int, ffn: int) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {f"{prefix}.norm1.weight": (width,), f"{prefix}.norm1.bias": (width,)}
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
        shapes[f"{prefix}.attn.{proj}.weight"] = (width, width)
        shapes[f"{prefix}.attn.{proj}.bias"] = (width,)
    shapes |= {f"{prefix}.norm2.weight": (width,), f"{prefix}.norm2.bias": (width,),
               f"{prefix}.mlp.fc1.weight": (ffn, width), f"{prefix}.mlp.fc1.bias": (ffn,),
               f"{prefix}.mlp.fc2.weight": (width, ffn), f"{prefix}.mlp.fc2.bias": (width,)}
    return shapes


def encoder_parameter_shapes(spec: VisionSpec) -> dict[str, tuple[int, ...]]:
    """The ViT encoder's parameters (``vision.*``), in module order: what the captioner shares with the MAE."""
    c, p = spec.d_model, spec.patch_size
    shapes: dict[str, tuple[int, ...]] = {"vision.patch_embed.weight": (c, spec.channels, p, p),
                                          "vision.patch_embed.bias": (c,), "vision.cls_token": (1, 1, c)}
    for i in range(spec.n_layers):
        shapes |= _block_shapes(f"vision.layers.{i}", c, spec.ffn_dim)
    return shapes | {"vision.norm.weight": (c,), "vision.norm.bias": (c,)}


def _block_classes(prefix: str) -> dict[str, str]:
    return {prefix: "Block", f"{prefix}.norm1": "LayerNorm", f"{prefix}.attn": "Attention",
            **{f"{prefix}.attn.{p}_proj": "Linear" for p in "qkvo"}, f"{prefix}.norm2": "LayerNorm",
            f"{prefix}.mlp": "MLP", f"{prefix}.mlp.fc1": "Linear", f"{prefix}.mlp.fc2": "Linear"}


def vision_module_classes(spec: VisionSpec, decoder: bool = True) -> dict[str, str]:
    """Every module of the encoder (and, with ``decoder``, the MAE decoder) that runs a forward, in definition order,
    with its class name: the dump points of both engines (names as for the parameters, ``model`` the MAE)."""
    out = {"vision": "VisionEncoder", "vision.patch_embed": "Conv2d"}
    for i in range(spec.n_layers):
        out |= _block_classes(f"vision.layers.{i}")
    out["vision.norm"] = "LayerNorm"
    if decoder:
        out |= {"mae": "MAEDecoder", "mae.embed": "Linear"}
        for i in range(spec.decoder_layers):
            out |= _block_classes(f"mae.layers.{i}")
        out |= {"mae.norm": "LayerNorm", "mae.pred": "Linear"}
    return out


def vision_parameter_shapes(spec: VisionSpec) -> dict[str, tuple[int, ...]]:
    """Every trained parameter of the encoder and the MAE decoder, in module order."""
    c, cd = spec.d_model, spec.decoder_d_model
    shapes = encoder_parameter_shapes(spec) | {"mae.embed.weight": (cd, c), "mae.embed.bias": (cd,),
                                               "mae.mask_token": (1, 1, cd)}
    for i in range(spec.decoder_layers):
        shapes |= _block_shapes(f"mae.layers.{i}", cd, spec.decoder_ffn_dim)
    shapes |= {"mae.norm.weight": (cd,), "mae.norm.bias": (cd,), "mae.pred.weight": (spec.patch_dim, cd),
               "mae.pred.bias": (spec.patch_dim,)}
    return shapes


def vision_num_parameters(spec: VisionSpec) -> int:
    """Trained parameters of the encoder and the MAE decoder (the position embeddings are fixed, not counted)."""
    return sum(int(np.prod(shape)) for shape in vision_parameter_shapes(spec).values())


def blocks_flops(tokens: int, width: int, ffn: int, layers: int) -> int:
    """Forward FLOPs (a multiply-add is 2) of ``layers`` blocks over ``tokens`` tokens: four projections, scores
    and their weighted sum over every pair of tokens, the two MLP matrices (norms, biases and the softmax left
    out, as is usual)."""
    return layers * 2 * tokens * (4 * width * width + 2 * tokens * width + 2 * width * ffn)


def mae_flops_per_image(spec: VisionSpec) -> int:
    """Forward FLOPs of one image through the MAE: the patch embedding of every patch (the mask is applied after
    it), the encoder over the cls token and the visible patches, the decoder over the cls token and every patch,
    the prediction of every token; the training step takes three times as many (backward twice the forward)."""
    visible, every = spec.kept + 1, spec.num_patches + 1
    c, cd = spec.d_model, spec.decoder_d_model
    return (2 * spec.num_patches * c * spec.patch_dim
            + blocks_flops(visible, c, spec.ffn_dim, spec.n_layers)
            + 2 * visible * c * cd
            + blocks_flops(every, cd, spec.decoder_ffn_dim, spec.decoder_layers)
            + 2 * every * cd * spec.patch_dim)


def init_vision_weights(spec: VisionSpec, seed: int) -> dict[str, np.ndarray]:
    """Initial weights (float32), from ``seed`` alone: MAE's -- linear and conv weights Xavier-uniform, biases zero,
    norms one, the cls and mask tokens normal(0, 0.02)."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in vision_parameter_shapes(spec).items():
        if name.endswith(("cls_token", "mask_token")):
            value = rng.normal(0.0, 0.02, shape)
        elif name.endswith(".bias"):
            value = np.zeros(shape)
        elif len(shape) == 1:
            value = np.ones(shape)
        else:
            fan_out, fan_in = shape[0], int(np.prod(shape[1:]))
            bound = math.sqrt(6.0 / (fan_in + fan_out))
            value = rng.uniform(-bound, bound, shape)
        weights[name] = value.astype(np.float32)
    return weights


def position_embeddings(width: int, grid: int) -> np.ndarray:
    """The fixed (1 + grid^2, width) 2-D sine-cosine embeddings, the cls token's row zero, each patch's row
    ``[sin(w) | cos(w) | sin(h) | cos(h)]`` of its column w and row h over ``width / 4`` frequencies
    (``1 / 10000^(k / (width/4))``): MAE's layout, which Hugging Face keeps."""
    if width % 4:
        raise ValueError(f"width {width} is not a multiple of 4")
    omega = 1.0 / 10000.0 ** (np.arange(width // 4, dtype=np.float64) / (width // 4))
    rows, cols = np.meshgrid(np.arange(grid, dtype=np.float64), np.arange(grid, dtype=np.float64), indexing="ij")
    by_col, by_row = np.outer(cols.ravel(), omega), np.outer(rows.ravel(), omega)
    table = np.concatenate([np.sin(by_col), np.cos(by_col), np.sin(by_row), np.cos(by_row)], axis=1)
    return np.concatenate([np.zeros((1, width)), table]).astype(np.float32)


def pixel_values(pixels: np.ndarray) -> np.ndarray:
    """uint8 pixel shards (B x H x W x 3) as the encoder's float32 input (B x 3 x H x W), normalised with
    :data:`PIXEL_MEAN` and :data:`PIXEL_STD`."""
    x = np.asarray(pixels, dtype=np.float32) / 255.0
    x = (x - np.asarray(PIXEL_MEAN, np.float32)) / np.asarray(PIXEL_STD, np.float32)
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))
