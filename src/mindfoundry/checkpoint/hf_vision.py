"""The vision models under Hugging Face's names: ``ViTMAEForPreTraining`` for ``objective: mae`` -- its config and
its state dict from ours (:mod:`mindfoundry.model.vision_spec`), the same arithmetic, so transformers computes our
loss when it is given our mask as ``noise``. The fixed position embeddings, which HF keeps in its state dict, are
written from :func:`mindfoundry.model.vision_spec.position_embeddings`.

`export --format hf` of an MAE checkpoint writes that model (``config.json``, ``model.safetensors``,
``preprocessor_config.json`` for ``ViTImageProcessor``) and, in ``encoder/``, the encoder alone as a ``ViTModel``
(the same tensors without the ``vit.`` prefix; MAE trains no pooler, so open it with ``add_pooling_layer=False``).
``model.init_from`` reads the ``ViTMAEForPreTraining`` folder back (:func:`read_vit_mae_folder`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from mindfoundry.checkpoint.store import CheckpointError
from mindfoundry.model.vision_spec import (
    PIXEL_MEAN,
    PIXEL_STD,
    VisionSpec,
    encoder_parameter_shapes,
    position_embeddings,
    vision_parameter_shapes,
)

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


def vit_model_config(spec: VisionSpec) -> dict[str, Any]:
    """The ``ViTConfig`` of the encoder alone."""
    mae = vit_mae_config(spec)
    keep = ("image_size", "patch_size", "num_channels", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "intermediate_size", "layer_norm_eps", "hidden_act", "qkv_bias", "hidden_dropout_prob",
            "attention_probs_dropout_prob")
    return {"model_type": "vit", "architectures": ["ViTModel"], **{k: mae[k] for k in keep}}


def image_processor_config(spec: VisionSpec) -> dict[str, Any]:
    """``preprocessor_config.json``: ``ViTImageProcessor`` resizing to the model's side (bicubic), scaling to [0, 1]
    and normalising with our mean and std -- the training input for square images (prepare resized the shorter side
    and cut the centre)."""
    return {"image_processor_type": "ViTImageProcessor", "do_resize": True,
            "size": {"height": spec.image_size, "width": spec.image_size}, "resample": 3, "do_rescale": True,
            "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": list(PIXEL_MEAN),
            "image_std": list(PIXEL_STD)}


def write_vit_mae_folder(spec: VisionSpec, weights: Mapping[str, np.ndarray], folder: Path) -> None:
    """The ``ViTMAEForPreTraining`` folder and its ``encoder/`` ``ViTModel`` (see the module docstring)."""
    tensors = vit_mae_weights(spec, weights)
    encoder = folder / "encoder"
    encoder.mkdir()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    save_file({k[len("vit."):]: v for k, v in tensors.items() if k.startswith("vit.")},
              str(encoder / "model.safetensors"), metadata={"format": "pt"})
    processor = image_processor_config(spec)
    for where, config in ((folder, vit_mae_config(spec)), (encoder, vit_model_config(spec))):
        (where / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        (where / "preprocessor_config.json").write_text(json.dumps(processor, indent=2) + "\n", encoding="utf-8")


def read_vit_mae_folder(folder: Path, config: dict[str, Any], tensors: Mapping[str, np.ndarray],
                        spec: VisionSpec, encoder_only: bool = False) -> dict[str, np.ndarray]:
    """A ``ViTMAEForPreTraining`` folder's weights (its ``config`` and ``tensors`` read) under our names; refuses one
    whose sizes or features are not this model's, naming the field, and fixed position embeddings that are not ours.
    ``encoder_only`` (a captioner's encoder): the encoder's alone, whatever decoder the folder holds."""
    drop = ("architectures", "mask_ratio", "image_mean", "image_std")
    expected = {k: v for k, v in vit_mae_config(spec).items() if k not in drop
                and not (encoder_only and k.startswith(("decoder_", "norm_pix_loss")))}
    for key, value in expected.items():
        got = config.get(key)
        if got != value:
            raise CheckpointError(f"{folder / 'config.json'}: {key}={got!r} but this run's model has {value!r}: set "
                                  "model.vision / model.mae to match (or import another model)")
    fixed = {n: t for n, t in vit_mae_weights(spec, {}).items() if not (encoder_only and n.startswith("decoder."))}
    for name, table in fixed.items():
        if name not in tensors or not np.allclose(tensors[name], table, atol=1e-6):
            raise CheckpointError(f"{folder}: {name} is not the fixed 2-D sine-cosine table this model uses: this "
                                  "model cannot be imported")
    names = encoder_parameter_shapes(spec) if encoder_only else vision_parameter_shapes(spec)
    ours = {vit_mae_name(name): name for name in names}
    unknown = sorted(set(tensors) - set(ours) - set(fixed) - {n for n in tensors if encoder_only
                                                              and n.startswith("decoder.")})
    if unknown:
        raise CheckpointError(f"{folder}: tensors {unknown[:3]} have no place in this model: this model cannot be "
                              "imported")
    return {ours[n]: np.asarray(t, dtype=np.float32) for n, t in tensors.items() if n in ours}
