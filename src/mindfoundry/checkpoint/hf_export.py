"""`mindfoundry export CHECKPOINT --format hf --out DIR`: a Hugging Face Llama folder that `transformers` opens.

The model is a Llama already (RMSNorm, rotate-half RoPE, grouped-query attention, SwiGLU), so the
export is a list of names and a config, no arithmetic: every tensor is written as it is, under
the Llama name (``layers.3.attn.q_proj.weight`` -> ``model.layers.3.self_attn.q_proj.weight``).

A captioner (``objective: caption``) is written as ``LlavaForConditionalGeneration``: its ViT as the ``ViTModel``
vision tower (the names of :mod:`.hf_vision` under ``model.vision_tower.``), the projector as
``model.multi_modal_projector``, the decoder as the Llama above under ``model.language_model.``. The config selects
what the captioner computes (:class:`mindfoundry.model.spec.CaptionSpec`): the last block's hidden states
(``vision_feature_layer: -1``, before the final norm), without the cls token (``default``), exact GELU in the
projector, ``<|image|>`` as ``image_token_id``. ``ViTModel`` carries a pooler that LLaVA never calls; it is written
as zeros so the folder opens without newly initialised weights. An mae model is a ``ViTMAEForPreTraining`` folder
(:mod:`.hf_vision`).
The folder holds ``config.json`` (``LlamaForCausalLM``), ``model.safetensors``,
``generation_config.json`` and the run's tokenizer (``tokenizer.json`` + ``tokenizer_config.json``
for ``PreTrainedTokenizerFast``), so ``AutoModelForCausalLM.from_pretrained(DIR)`` and
``AutoTokenizer.from_pretrained(DIR)`` work offline. Framework-free: the files are written with
safetensors and json only; tests/checkpoint/test_hf_export.py opens them with transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from safetensors.numpy import save_file

from mindfoundry.backends.base import check_state_names
from mindfoundry.checkpoint.handoff import load_hand_off, renamed
from mindfoundry.checkpoint.hf_vision import (
    image_processor_config,
    vit_mae_name,
    vit_mae_weights,
    vit_model_config,
    write_vit_mae_folder,
)
from mindfoundry.checkpoint.reader import load_checkpoint
from mindfoundry.checkpoint.run_files import run_config
from mindfoundry.checkpoint.store import CheckpointError, publish_mode
from mindfoundry.data.tokenizer import EOS, PAD, image_id, load_tokenizer
from mindfoundry.model.spec import AnySpec, CaptionSpec, ModelSpec, parameter_shapes
from mindfoundry.model.vision_spec import VisionSpec
from mindfoundry.storage.commit import staged_folder
from mindfoundry.storage.location import Location
from mindfoundry.storage.resolve import locate

#: Our parameter names -> transformers' Llama ones: the top-level ones, and a block's (the layer index is kept).
_TOP = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
        "lm_head.weight": "lm_head.weight"}
_BLOCK = {
    "attn_norm.weight": "input_layernorm.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    **{f"attn.{p}_proj.weight": f"self_attn.{p}_proj.weight" for p in "qkvo"},
    **{f"mlp.{p}_proj.weight": f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")},
}


def hf_name(name: str) -> str:
    """The Llama name of one of our parameter names."""
    return renamed(name, _TOP, _BLOCK)


def hf_config(spec: ModelSpec, *, eos_id: int, pad_id: int, init_std: float) -> dict[str, Any]:
    """config.json of a LlamaForCausalLM with exactly this model's sizes (rope theta under both the
    transformers 4.x key and 5.x's rope_parameters)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        "intermediate_size": spec.ffn_dim,
        "num_hidden_layers": spec.n_layers,
        "num_attention_heads": spec.n_heads,
        "num_key_value_heads": spec.n_kv_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_seq_len,
        "rms_norm_eps": spec.norm_eps,
        "rope_theta": spec.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta},
        "tie_word_embeddings": spec.tie_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": init_std,
        "bos_token_id": None,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "dtype": "float32",
        "torch_dtype": "float32",
        "use_cache": True,
    }


def check_weights(spec: AnySpec, weights: Mapping[str, np.ndarray], what: str) -> None:
    """`weights` must hold exactly this model's parameter names at its shapes (the engines' own check, as a
    CheckpointError)."""
    shapes = parameter_shapes(spec)
    try:
        check_state_names(shapes, weights, what, shapes)
    except ValueError as exc:
        raise CheckpointError(f"{exc}: use weights of a model with this config's sizes") from None


def hf_weights(spec: ModelSpec, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The checkpoint's weights under Llama names; the names and shapes must be exactly this model's."""
    check_weights(spec, weights, "the checkpoint's weights")
    return {hf_name(n): np.ascontiguousarray(w, dtype=np.float32) for n, w in weights.items()}


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


def export_hf(ckpt_dir: str | Path, out: str | Path | Location) -> Location:
    """Write checkpoint `ckpt_dir` (full or sharded) as a Hugging Face Llama folder `out` (a folder or a URL), or an
    image model's ViTMAE folder (:mod:`.hf_vision`); refuses a non-empty `out`."""
    out = locate(out)
    cfg = run_config(Path(ckpt_dir))
    if cfg.model.objective == "mae":
        with staged_folder(out) as tmp:
            spec = VisionSpec.from_config(cfg.model)
            weights = load_checkpoint(Path(ckpt_dir)).weights
            check_weights(spec, weights, "the checkpoint's weights")
            write_vit_mae_folder(spec, weights, tmp)
            publish_mode(tmp)
        return out
    with staged_folder(out) as tmp:
        model = load_hand_off(Path(ckpt_dir), "hf", "the Llama layout (a LlamaForCausalLM folder)")
        eos, pad, init_std = model.eos, model.pad, model.cfg.model.init_std
        if isinstance(model.spec, CaptionSpec):  # LlavaForConditionalGeneration
            spec = model.spec.text
            check_weights(model.spec, model.weights, "the checkpoint's weights")
            tensors = llava_weights(model.spec, model.weights)
            config = llava_config(model.spec, image_token_id=image_id(load_tokenizer(model.tokenizer_path)),
                                  eos_id=eos, pad_id=pad, init_std=init_std)
            (tmp / "preprocessor_config.json").write_text(
                json.dumps(image_processor_config(model.spec.vision), indent=2) + "\n", encoding="utf-8")
        else:
            spec = model.spec
            tensors, config = hf_weights(spec, model.weights), hf_config(spec, eos_id=eos, pad_id=pad,
                                                                          init_std=init_std)
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        files = {
            "config.json": config,
            "generation_config.json": {"eos_token_id": eos, "pad_token_id": pad, "do_sample": False},
            "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "pad_token": PAD,
                                      "model_max_length": spec.max_seq_len, "clean_up_tokenization_spaces": False},
        }
        for name, content in files.items():
            (tmp / name).write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
        model.tokenizer_path.download(tmp / "tokenizer.json")
        publish_mode(tmp)
    return out
