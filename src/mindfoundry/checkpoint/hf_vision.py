"""The vision models under Hugging Face's names: ``ViTMAEForPreTraining`` for ``objective: mae`` -- its config and
its state dict from ours (:mod:`mindfoundry.model.vision_spec`), the same arithmetic, so transformers computes our
loss when it is given our mask as ``noise``. The fixed position embeddings, which HF keeps in its state dict, are
written from :func:`mindfoundry.model.vision_spec.position_embeddings`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from mindfoundry.model.vision_spec import PIXEL_MEAN, PIXEL_STD, VisionSpec, position_embeddings

#: transformers 5's names (its state dict; the 4.x names -- attention.attention.query, ... -- it converts on load)
_BLOCK = {"norm1": "layernorm_before", "norm2": "layernorm_after", "attn.q_proj": "attention.q_proj",
          "attn.k_proj": "attention.k_proj", "attn.v_proj": "attention.v_proj", "attn.o_proj": "attention.o_proj",
          "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}
_TOP = {"vision.patch_embed": "vit.embeddings.patch_embeddings.projection",
        "vision.cls_token": "vit.embeddings.cls_token", "vision.norm": "vit.layernorm",
        "mae.embed": "decoder.decoder_embed", "mae.mask_token": "decoder.mask_token",
        "mae.norm": "decoder.decoder_norm", "mae.pred": "decoder.decoder_pred"}
_LAYERS = {"vision.layers": "vit.layers", "mae.layers": "decoder.decoder_layers"}


def vit_mae_name(name: str) -> str:
    """Hugging Face's ``ViTMAEForPreTraining`` name of one of our parameters."""
    for ours, theirs in _LAYERS.items():
        if name.startswith(ours + "."):
            index, rest = name[len(ours) + 1:].split(".", 1)
            module, leaf = rest.rsplit(".", 1)
            return f"{theirs}.{index}.{_BLOCK[module]}.{leaf}"
    for ours, theirs in _TOP.items():
        if name == ours or name.startswith(ours + "."):
            return theirs + name[len(ours):]
    raise KeyError(f"no Hugging Face name for {name}")


def vit_mae_config(spec: VisionSpec) -> dict[str, Any]:
    """The ``ViTMAEConfig`` of the model (exact GELU, no dropout, the normalised-pixel target)."""
    return {"model_type": "vit_mae", "architectures": ["ViTMAEForPreTraining"], "image_size": spec.image_size,
            "patch_size": spec.patch_size, "num_channels": spec.channels, "hidden_size": spec.d_model,
            "num_hidden_layers": spec.n_layers, "num_attention_heads": spec.n_heads,
            "intermediate_size": spec.ffn_dim, "decoder_hidden_size": spec.decoder_d_model,
            "decoder_num_hidden_layers": spec.decoder_layers, "decoder_num_attention_heads": spec.decoder_heads,
            "decoder_intermediate_size": spec.decoder_ffn_dim, "mask_ratio": spec.mask_ratio,
            "norm_pix_loss": True, "layer_norm_eps": spec.norm_eps, "hidden_act": "gelu", "qkv_bias": True,
            "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
            "image_mean": list(PIXEL_MEAN), "image_std": list(PIXEL_STD)}


def vit_mae_weights(spec: VisionSpec, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Our weights under Hugging Face's names, with the fixed position embeddings it keeps."""
    out = {vit_mae_name(name): np.ascontiguousarray(value, dtype=np.float32) for name, value in weights.items()}
    out["vit.embeddings.position_embeddings"] = position_embeddings(spec.d_model, spec.grid)[None]
    out["decoder.decoder_pos_embed"] = position_embeddings(spec.decoder_d_model, spec.grid)[None]
    return out
