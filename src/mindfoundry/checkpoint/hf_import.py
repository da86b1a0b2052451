"""`model.init_from`: the initial weights of a new run from a Hugging Face Llama folder or a checkpoint folder.

A Llama folder is the inverse of :mod:`.hf_export`: its config.json must describe exactly this
run's model (each size is compared with the model section, and a feature the model lacks, such
as attention biases or RoPE scaling, is refused naming the field), and its safetensors files
(one, or several listed in model.safetensors.index.json) hold the Llama names, read back under
ours without changing a value. Export -> init_from -> export is byte-identical (tested).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file

from mindfoundry.backends.base import check_state_names
from mindfoundry.checkpoint.directory import CheckpointDir
from mindfoundry.checkpoint.hf_export import check_weights, hf_name
from mindfoundry.checkpoint.hf_vision import read_vit_mae_folder
from mindfoundry.checkpoint.reader import load_checkpoint
from mindfoundry.checkpoint.store import MANIFEST_FILE, CheckpointError
from mindfoundry.config.schema import RunConfig
from mindfoundry.config.storage_config import StorageConfig
from mindfoundry.model.spec import AnySpec, CaptionSpec, ModelSpec, init_weights, parameter_shapes
from mindfoundry.model.vision_spec import VisionSpec, encoder_parameter_shapes
from mindfoundry.storage.cache import cache_folder
from mindfoundry.storage.commit import fetch
from mindfoundry.storage.resolve import locate


def _sizes(spec: ModelSpec) -> dict[str, tuple[str, Any]]:
    """config.json key -> (the model section's key, this model's value) for the sizes that must match."""
    return {
        "vocab_size": ("vocab_size", spec.vocab_size),
        "hidden_size": ("d_model", spec.d_model),
        "num_hidden_layers": ("n_layers", spec.n_layers),
        "num_attention_heads": ("n_heads", spec.n_heads),
        "num_key_value_heads": ("n_kv_heads", spec.n_kv_heads),
        "intermediate_size": ("ffn_dim", spec.ffn_dim),
        "head_dim": ("d_model/n_heads", spec.head_dim),
        "rms_norm_eps": ("norm_eps", spec.norm_eps),
        "rope_theta": ("rope_theta", spec.rope_theta),
        "tie_word_embeddings": ("tie_embeddings", spec.tie_embeddings),
    }


#: Features our model does not have: config.json key -> the only value it can take.
_UNSUPPORTED = {
    "model_type": "llama",
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "rope_scaling": None,
}


def check_hf_config(config: dict[str, Any], spec: ModelSpec, where: Path) -> None:
    """Refuse a Llama config this model cannot represent or whose sizes are not this model's, naming the field."""
    rope = config.get("rope_parameters") or {}
    values = dict(
        config,
        rope_theta=rope.get("rope_theta", config.get("rope_theta", 10000.0)),
        num_key_value_heads=config.get("num_key_value_heads", config.get("num_attention_heads")),
        head_dim=config.get("head_dim", config.get("hidden_size", 0) // max(config.get("num_attention_heads", 1), 1)),
        tie_word_embeddings=config.get("tie_word_embeddings", False),
    )
    for key, allowed in _UNSUPPORTED.items():
        if values.get(key, allowed) != allowed:
            raise CheckpointError(f"{where}: {key}={values[key]!r} is not representable by MindFoundry's model "
                                  f"(it needs {key}={allowed!r}): this model cannot be imported")
    if rope.get("rope_type", "default") != "default":
        raise CheckpointError(
            f"{where}: rope_parameters.rope_type={rope['rope_type']!r} (RoPE scaling) is not representable "
            "by MindFoundry's model (plain RoPE only): this model cannot be imported"
        )
    for key, (ours, value) in _sizes(spec).items():
        if values.get(key) != value:
            raise CheckpointError(f"{where}: {key}={values.get(key)!r} but this run has model.{ours}={value!r}: "
                                  f"set model.{ours} to match (or import another model)")


def _hf_tensors(folder: Path) -> dict[str, np.ndarray]:
    index = folder / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        if index.is_file()
        else ["model.safetensors"]
    )
    out: dict[str, np.ndarray] = {}
    for name in files:
        try:
            out.update(load_file(str(folder / name)))
        except (OSError, SafetensorError) as exc:
            raise CheckpointError(f"{folder / name}: unreadable safetensors ({exc})") from None
    return out


def read_hf_folder(folder: Path, spec: AnySpec, encoder_only: bool = False) -> dict[str, np.ndarray]:
    """A Hugging Face Llama folder's weights under our parameter names (float32, values unchanged); an image
    model's, a ViTMAEForPreTraining folder's (:func:`mindfoundry.checkpoint.hf_vision.read_vit_mae_folder`)."""
    config_file = folder / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{config_file}: not a readable config.json ({exc})") from None
    if isinstance(spec, VisionSpec):
        weights = read_vit_mae_folder(folder, config, _hf_tensors(folder), spec, encoder_only)
        if not encoder_only:
            check_weights(spec, weights, str(folder))
        return weights
    check_hf_config(config, spec, config_file)
    tensors = _hf_tensors(folder)
    if spec.tie_embeddings:
        tensors.pop("lm_head.weight", None)  # a tied head that some writers store anyway
    ours = {hf_name(n): n for n in parameter_shapes(spec)}
    unknown = sorted(set(tensors) - set(ours))
    if unknown:
        raise CheckpointError(
            f"{folder}: tensors {unknown[:3]} have no place in this model: this model cannot be imported"
        )
    weights = {ours[n]: np.asarray(t, dtype=np.float32) for n, t in tensors.items()}
    check_weights(spec, weights, str(folder))
    return weights


def start_weights(cfg: RunConfig, spec: AnySpec) -> tuple[dict[str, np.ndarray], list[str]]:
    """A new run's weights: random from the seed, then what ``model.init_from`` names (the whole model; a captioner's
    decoder) and ``model.vision.init_from`` (a captioner's encoder: the ``vision.*`` weights of an mae run); and a line
    per origin, to say."""
    m = cfg.model
    weights, notes = init_weights(spec, cfg.seed), []
    if isinstance(spec, CaptionSpec):
        encoder = m.vision.init_from if m.vision else None
        parts = [(m.init_from, spec.text, "decoder"), (encoder, spec.vision, "encoder")]
    else:
        parts = [(m.init_from, spec, "weights")]
    for path, part, what in parts:
        if path is not None:
            weights |= initial_weights(path, part, cfg.storage, encoder_only=what == "encoder")
            notes.append(f"initial {what} from {path}")
    return weights, notes


def initial_weights(path: str | Path, spec: AnySpec, storage: StorageConfig | None = None,
                    encoder_only: bool = False) -> dict[str, np.ndarray]:
    """The weights `model.init_from` names: a checkpoint folder (verified) or a Hugging Face Llama folder; either may
    be a URL (a committed checkpoint or export, fetched into this node's cache and checked). ``encoder_only`` (a
    captioner's ``model.vision.init_from``; ``spec`` a VisionSpec): an mae run's ``vision.*`` weights alone, checked
    against the encoder whatever decoder that run had."""
    where = locate(path, storage)
    if (where / MANIFEST_FILE).is_file():
        directory = CheckpointDir(where.parent)
        directory.verify(where)
        weights = load_checkpoint(directory.local_copy(where), verify=False).weights
        if encoder_only:
            weights = {n: w for n, w in weights.items() if n.startswith("vision.")}
            shapes = encoder_parameter_shapes(spec)
            try:
                check_state_names(shapes, weights, f"{where}: the encoder's weights", shapes)
            except ValueError as exc:
                raise CheckpointError(f"{exc}: set model.vision to the mae run's encoder sizes") from None
        else:
            check_weights(spec, weights, str(where))
        return weights
    if (where / "config.json").is_file():
        return read_hf_folder(fetch(where, cache_folder("init", str(where))), spec, encoder_only)
    raise CheckpointError(
        f"model.init_from={str(where)!r} is neither a checkpoint folder (manifest.json) nor a Hugging Face "
        "folder (config.json): point it at RUN/checkpoints/step_N or an exported folder"
    )
