"""What every hand-off folder (`export --format hf`, `--format mindformers`) shares: the model it may hold and the run's
tokenizer. Each is written all or nothing (:func:`mindfoundry.storage.commit.staged_folder`): staged, then renamed
into place or committed to a URL, so a refusal or a failure half way leaves nothing, and an existing, non-empty
``--out`` is refused before any work.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mindfoundry.checkpoint.reader import load_checkpoint
from mindfoundry.checkpoint.run_files import run_config, run_tokenizer
from mindfoundry.checkpoint.store import CheckpointError
from mindfoundry.config.schema import RunConfig
from mindfoundry.data.tokenizer import eos_id, load_tokenizer, pad_id
from mindfoundry.model.spec import CaptionSpec, ModelSpec, spec_for
from mindfoundry.storage.location import Location


def renamed(name: str, top: dict[str, str], block: dict[str, str]) -> str:
    """One of our parameter names in a target's layout: a top-level one by ``top``; a block's, ``layers.I.REST``, as
    ``model.layers.I.`` + ``block[REST]`` (KeyError for a name neither table holds)."""
    if name in top:
        return top[name]
    _, index, rest = name.split(".", 2)
    return f"model.layers.{index}.{block[rest]}"


@dataclass(frozen=True)
class HandOff:
    """A checkpoint as an export sees it: its run's config and model, weights, and tokenizer file with EOS/PAD ids."""

    cfg: RunConfig
    spec: ModelSpec | CaptionSpec
    weights: dict[str, np.ndarray]
    tokenizer_path: Location
    eos: int
    pad: int


def load_hand_off(ckpt_dir: Path, fmt: str, target: str) -> HandOff:
    """The checkpoint, refused (naming `target`, the layout `fmt` writes) when it is not a dense causal LM."""
    cfg = run_config(ckpt_dir)
    if cfg.model.objective != "caption":  # a captioner's decoder is a causal LM
        cfg.model.require_causal(f"export --format {fmt} ({target})")
    spec = spec_for(cfg.model)
    if (spec.text if isinstance(spec, CaptionSpec) else spec).num_experts:
        raise CheckpointError(
            f"this model has mixture-of-experts blocks (model.moe.num_experts > 0), which {target} cannot "
            "hold: export the weights with --format safetensors"
        )
    tokenizer_path = run_tokenizer(ckpt_dir, cfg)
    tokenizer = load_tokenizer(tokenizer_path)
    weights = load_checkpoint(ckpt_dir).weights
    return HandOff(cfg, spec, weights, tokenizer_path, eos_id(tokenizer), pad_id(tokenizer))
