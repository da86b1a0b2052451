"""The `model` section: a decoder-only, Llama-style transformer, and the derived FFN size."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from mindfoundry.config.section import Section
from mindfoundry.config.vision_config import MAEConfig, VisionConfig
from mindfoundry.errors import MindFoundryError


class ObjectiveError(MindFoundryError, ValueError):
    """A command that needs the causal objective (continuations, causal log-likelihoods, the Llama layout) was given
    a masked-LM model."""


class MoEConfig(Section):
    """Mixture-of-experts FFN (Mixtral-style): a router picks top_k of num_experts SwiGLU experts per token."""

    num_experts: int = Field(
        0, ge=0, le=4096, description="Experts per MoE block; 0 = a dense model (no MoE). At least 2 otherwise."
    )
    top_k: int = Field(
        2, ge=1, description="Experts each token is sent to (softmax over all experts, top_k kept and renormalized)."
    )
    aux_loss_weight: float = Field(
        0.01,
        ge=0,
        description="Weight of the load-balancing loss (num_experts * sum_e f_e * P_e, "
        "top_k at perfect balance) added to the training loss; 0 = off.",
    )
    every: int = Field(
        1,
        ge=1,
        description="MoE in every `every`-th block (blocks every-1, 2*every-1, ...; 1 = all); the others stay dense.",
    )
    capacity_factor: float | None = Field(None, gt=0, description=(
        "null = no capacity limit (every token reaches its top_k experts). A number c: each expert takes at most "
        "ceil(c * top_k * seq_len / num_experts) (token, expert) pairs per sequence, first choices first; the rest are "
        "dropped (GShard/MindFormers). The MindSpore engine then routes tokens (static shapes, E * capacity rows per "
        "sequence instead of every expert on every token); 1.0-2.0 is usual."))

    @model_validator(mode="after")
    def _experts(self) -> "MoEConfig":
        if self.num_experts == 1:
            raise ValueError("num_experts=1 is a dense FFN with a router: use num_experts: 0 (dense) or >= 2")
        if self.num_experts and self.top_k > self.num_experts:
            raise ValueError(f"top_k={self.top_k} exceeds num_experts={self.num_experts}: use top_k <= num_experts")
        if self.capacity_factor is not None and not self.num_experts:
            raise ValueError(
                f"capacity_factor={self.capacity_factor} limits experts, but the model is dense (num_experts: 0): "
                "remove capacity_factor, or set num_experts"
            )
        return self


class MLMConfig(Section):
    """Masked language modelling (model.objective: mlm): which positions are predicted and what the model sees there.

    BERT/RoBERTa's recipe: mask_rate of the ordinary (non-special) tokens of each sample are chosen; of those,
    mask_token_rate are replaced by the mask token, random_token_rate by a random ordinary token, and the rest
    kept. Only chosen positions carry a loss. The choice is a pure function of (seed, sample position): a new
    mask every time a sample is drawn again, and the same mask on resume and on either engine.
    """

    mask_rate: float = Field(
        0.15, description="Share of each sample's ordinary tokens that are predicted (0 < mask_rate < 1)."
    )
    mask_token_rate: float = Field(
        0.8, ge=0, le=1, description="Of the predicted positions, the share whose input is the mask token."
    )
    random_token_rate: float = Field(
        0.1,
        ge=0,
        le=1,
        description="Of the predicted positions, the share whose input is a random "
        "ordinary token; the rest keep their token.",
    )

    @model_validator(mode="after")
    def _rates(self) -> "MLMConfig":
        if not 0.0 < self.mask_rate < 1.0:
            raise ValueError(
                f"mask_rate={self.mask_rate}: predict a share of the tokens strictly between 0 and 1 (BERT: 0.15); "
                "0 trains nothing and 1 leaves no context"
            )
        if self.mask_token_rate + self.random_token_rate > 1.0:
            raise ValueError(
                f"mask_token_rate + random_token_rate = {self.mask_token_rate + self.random_token_rate:g} exceeds 1: "
                "they are shares of the predicted positions (BERT: 0.8 and 0.1, the remaining 0.1 kept)"
            )
        return self


class ModelConfig(Section):
    """Decoder-only, Llama-style transformer (RMSNorm, RoPE, GQA, SwiGLU)."""

    vocab_size: int = Field(
        8192,
        ge=16,
        le=2**31 - 1,
        description="Vocabulary size; the tokenizer is trained to this size (or must not exceed it when loaded).",
    )
    d_model: int = Field(256, ge=8, le=65536, description="Hidden size.")
    n_layers: int = Field(4, ge=1, le=1024, description="Number of transformer blocks.")
    n_heads: int = Field(4, ge=1, le=4096, description="Attention (query) heads; must divide d_model.")
    n_kv_heads: int | None = Field(
        None,
        ge=1,
        description="Key/value heads for grouped-query attention; must divide n_heads. null = n_heads (multi-head "
                    "attention).",
    )
    ffn_dim: int | None = Field(
        None, ge=1, le=2**20, description="SwiGLU hidden size. null = 8/3*d_model rounded up to ffn_multiple_of."
    )
    ffn_multiple_of: int = Field(64, ge=1, le=65536, description="Rounding for the automatic ffn_dim.")
    max_seq_len: int = Field(
        2048, ge=2, le=2**20, description="Longest sequence the RoPE tables cover; train.seq_len must not exceed it."
    )
    rope_theta: float = Field(10000.0, gt=0, le=1e12, description="RoPE base frequency.")
    norm_eps: float = Field(1e-5, gt=0, lt=1, description="RMSNorm epsilon.")
    tie_embeddings: bool = Field(
        True, description="Share the token embedding with the output head (no lm_head.weight)."
    )
    init_std: float = Field(
        0.02, gt=0, le=1, description="Std of the normal init; residual projections use init_std/sqrt(2*n_layers)."
    )
    moe: MoEConfig = Field(default_factory=MoEConfig, description="Mixture-of-experts FFN (num_experts: 0 = dense).")
    objective: Literal["clm", "mlm", "mae", "caption"] = Field(
        "clm",
        description="Self-supervised objective: clm = causal (decoder, next-token prediction: generation, general task "
        "solving); mlm = masked (bidirectional encoder, BERT/RoBERTa-style: retrieval, classification). Same blocks "
        "and parameter names; mlm drops the causal mask and predicts masked tokens (model.mlm). mae = masked image "
        "modelling: the ViT of model.vision learns from the prepared images by predicting hidden patches (model.mae); "
        "the text sizes above are then unused. caption = image-conditioned captioning (LLaVA's first stage): the ViT's "
        "patch features, through a projector, are the prefix of the causal decoder above, which learns each image's "
        "caption (the loss on the caption tokens only).",
    )
    mlm: MLMConfig = Field(default_factory=MLMConfig, description="Masking of the mlm objective (ignored for clm).")
    vision: VisionConfig | None = Field(None, description="The ViT encoder of the image objectives (mae, caption); "
                                        "null for text models.")
    mae: MAEConfig = Field(default_factory=MAEConfig, description="Masking and decoder of the mae objective (ignored "
                           "otherwise).")
    init_from: str | None = Field(
        None,
        description="Initial weights of a new run (continued pretraining): a Hugging Face Llama folder (config.json + "
        "model.safetensors, e.g. from `mindfoundry export`) or a checkpoint folder RUN/checkpoints/step_N; its sizes "
        "must be "
        "this model's. Ignored once the run has checkpoints (a resume loads those), so not part of the run identity. "
        "null = random init from the seed.",
    )

    @property
    def is_image(self) -> bool:
        """Whether the objective trains on images (the one place that says which objectives do)."""
        return self.objective in ("mae", "caption")

    def require_causal(self, what: str) -> None:
        """ObjectiveError unless this is a causal LM: `what` names the command that needs next-token predictions."""
        if self.is_image:
            raise ObjectiveError(
                f"{what} needs a causal LM, and this model was trained with model.objective={self.objective} (an image "
                "model): evaluate it with `mindfoundry eval` (held-out masked-patch loss, --probe digits), export it "
                "with --format hf (ViTMAEForPreTraining) or safetensors"
            )
        if self.objective != "clm":
            raise ObjectiveError(
                f"{what} needs a causal LM, and this model was trained with model.objective={self.objective} (a "
                "bidirectional encoder that predicts masked tokens, not continuations): evaluate it with `mindfoundry "
                "eval` (masked-token loss and accuracy), export it with --format safetensors, or train with "
                "model.objective: clm"
            )

    def resolved_ffn_dim(self) -> int:
        """ffn_dim, or when null 8/3*d_model rounded up to ffn_multiple_of (the one place that derives it)."""
        if self.ffn_dim is not None:
            return self.ffn_dim
        return -(-int(8 * self.d_model / 3) // self.ffn_multiple_of) * self.ffn_multiple_of

