"""The ``model.vision`` and ``model.mae`` sections: the ViT encoder of the image objectives and the masked
autoencoder's light decoder (``model.objective: mae``, He et al. 2021, Hugging Face's ``ViTMAEForPreTraining``)."""

from __future__ import annotations

from pydantic import Field, model_validator

from mindfoundry.config.section import Section


def _width_problem(key: str, width: int, heads: int) -> str | None:
    """Why a (width, heads) pair cannot be built, or None: heads must divide it, and the fixed 2-D sine-cosine
    position embeddings need a multiple of 4."""
    if width % heads:
        return f"{key}.n_heads={heads} does not divide {key}.d_model={width}: choose heads dividing the width"
    if width % 4:
        return (f"{key}.d_model={width} is not a multiple of 4: the fixed 2-D sine-cosine position embeddings give a "
                "quarter of the width to each of sin/cos of the row and of the column")
    return None


class VisionConfig(Section):
    """A ViT encoder (pre-norm blocks, LayerNorm, GELU, fixed 2-D sine-cosine positions, a cls token), reading the
    prepared pixel shards (``data.images.size`` square)."""

    image_size: int | None = Field(
        None, ge=8, le=4096, description="Side of the square input images. null = data.images.size (the pixel "
        "shards' side); anything else must equal it.")
    patch_size: int = Field(8, ge=1, le=1024, description="Side of a square patch; must divide image_size.")
    d_model: int = Field(192, ge=8, le=65536, description="Encoder width (a multiple of 4 and of n_heads).")
    n_layers: int = Field(4, ge=1, le=1024, description="Encoder blocks.")
    n_heads: int = Field(3, ge=1, le=4096, description="Attention heads; must divide d_model.")
    ffn_dim: int | None = Field(None, ge=1, le=2**20, description="MLP hidden size. null = 4 * d_model.")
    norm_eps: float = Field(1e-12, gt=0, lt=1, description="LayerNorm epsilon (Hugging Face ViT's default).")
    init_from: str | None = Field(
        None, description="objective caption: the encoder's initial weights, from an mae run's checkpoint folder "
        "(RUN/checkpoints/step_N) or its `export --format hf` folder (ViTMAEForPreTraining); its sizes must be these. "
        "model.init_from gives the decoder's (a causal LM's checkpoint or Llama folder). Ignored once the run has "
        "checkpoints. null = random init from the seed.")

    @model_validator(mode="after")
    def _shape(self) -> VisionConfig:
        problem = _width_problem("model.vision", self.d_model, self.n_heads)
        if problem:
            raise ValueError(problem)
        if self.image_size is not None and self.image_size % self.patch_size:
            raise ValueError(f"model.vision.patch_size={self.patch_size} does not divide model.vision.image_size="
                             f"{self.image_size}: choose a patch size dividing the image side")
        return self

    def resolved_ffn_dim(self) -> int:
        return self.ffn_dim if self.ffn_dim is not None else 4 * self.d_model


class MAEConfig(Section):
    """Masked image modelling (``model.objective: mae``): mask_ratio of each image's patches are hidden, chosen by
    noise that is a function of (seed, sample position) (:mod:`mindfoundry.data.dataset.image_masking`); a light
    decoder predicts their pixels, normalised per patch; the loss is the mean squared error over the hidden patches."""

    mask_ratio: float = Field(0.75, description="Share of each image's patches hidden (0 < mask_ratio < 1; MAE: 0.75).")
    decoder_d_model: int = Field(128, ge=8, le=65536, description="Decoder width (a multiple of 4 and of its heads).")
    decoder_layers: int = Field(2, ge=1, le=1024, description="Decoder blocks.")
    decoder_heads: int = Field(4, ge=1, le=4096, description="Decoder attention heads.")
    decoder_ffn_dim: int | None = Field(None, ge=1, le=2**20, description="Decoder MLP hidden size. null = 4 * "
                                        "decoder_d_model.")

    @model_validator(mode="after")
    def _shape(self) -> MAEConfig:
        if not 0.0 < self.mask_ratio < 1.0:
            raise ValueError(f"model.mae.mask_ratio={self.mask_ratio}: hide a share of the patches strictly between 0 "
                             "and 1 (MAE: 0.75); 0 leaves nothing to predict and 1 nothing to predict it from")
        problem = _width_problem("model.mae", self.decoder_d_model, self.decoder_heads)
        if problem:
            raise ValueError(problem.replace(".d_model", ".decoder_d_model").replace(".n_heads", ".decoder_heads"))
        return self

    def resolved_ffn_dim(self) -> int:
        return self.decoder_ffn_dim if self.decoder_ffn_dim is not None else 4 * self.decoder_d_model
