"""The captioner (``objective: caption``) as Hugging Face's ``LlavaForConditionalGeneration``: its ViT as the
``ViTModel`` vision tower (the names of :mod:`.hf_vision` under ``model.vision_tower.``), the projector as
``model.multi_modal_projector``, the decoder as the Llama of :mod:`.hf_export` under ``model.language_model.``.
The config selects what the captioner computes (:class:`mindfoundry.model.spec.CaptionSpec`): the last block's hidden
states (``vision_feature_layer: -1``, before the final norm), without the cls token (``default``), exact GELU in the
projector, ``<|image|>`` as ``image_token_id``. ``ViTModel`` carries a pooler that LLaVA never calls; it is written as
zeros so the folder opens without newly initialised weights. Framework-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from mindfoundry.checkpoint.hf_export import hf_config, hf_name
from mindfoundry.checkpoint.hf_vision import image_processor_config, vit_mae_name, vit_mae_weights, vit_model_config
from mindfoundry.model.spec import CaptionSpec


def llava_config(spec: CaptionSpec, *, image_token_id: int, eos_id: int, pad_id: int, init_std: float
                 ) -> dict[str, Any]:
    """config.json of the ``LlavaForConditionalGeneration`` this captioner is."""
    return {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
            "vision_config": vit_model_config(spec.vision),
            "text_config": hf_config(spec.text, eos_id=eos_id, pad_id=pad_id, init_std=init_std),
            "image_token_id": image_token_id, "image_seq_length": spec.image_tokens,
            "projector_hidden_act": "gelu", "multimodal_projector_bias": True, "vision_feature_layer": -1,
            "vision_feature_select_strategy": "default", "tie_word_embeddings": spec.text.tie_embeddings,
            "pad_token_id": pad_id, "eos_token_id": eos_id}


def llava_weights(spec: CaptionSpec, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The captioner's weights under LLaVA's names (the vision tower's fixed position embeddings and unused pooler
    added)."""
    out: dict[str, np.ndarray] = {}
    for name, value in weights.items():
        value = np.ascontiguousarray(value, dtype=np.float32)
        if name.startswith("vision."):
            out["model.vision_tower." + vit_mae_name(name).removeprefix("vit.")] = value
        elif name.startswith("projector."):
            out["model.multi_modal_projector." + name.removeprefix("projector.")] = value
        else:
            out[hf_name(name).replace("model.", "model.language_model.", 1)] = value
    position = vit_mae_weights(spec.vision, {})["vit.embeddings.position_embeddings"]
    c = spec.vision.d_model
    out |= {"model.vision_tower.embeddings.position_embeddings": position,
            "model.vision_tower.pooler.dense.weight": np.zeros((c, c), np.float32),
            "model.vision_tower.pooler.dense.bias": np.zeros(c, np.float32)}
    if spec.text.tie_embeddings:  # LLaVA's head, written out (it ties it to the embedding on load anyway)
        out["lm_head.weight"] = out["model.language_model.embed_tokens.weight"]
    return out


def llava_processor_config(spec: CaptionSpec) -> dict[str, Any]:
    """preprocessor_config.json: the vision tower's ``ViTImageProcessor``."""
    return image_processor_config(spec.vision)
