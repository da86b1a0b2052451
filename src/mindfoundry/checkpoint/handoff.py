"""What every hand-off folder (`export --format hf`, `--format mindformers`) shares: the model it may hold, the run's
tokenizer, and a write that is all or nothing.

A folder is staged beside ``--out`` and renamed into place only when complete, so a refusal or a failure half way
leaves nothing (and an existing, non-empty ``--out`` is refused before any work).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mindfoundry import atomic
from mindfoundry.checkpoint.reader import load_checkpoint
from mindfoundry.checkpoint.run_files import run_config, run_tokenizer
from mindfoundry.checkpoint.store import CheckpointError, publish_mode
from mindfoundry.config.schema import RunConfig
from mindfoundry.data.tokenizer import eos_id, load_tokenizer, pad_id
from mindfoundry.errors import OutputExistsError
from mindfoundry.model.spec import ModelSpec


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
    spec: ModelSpec
    weights: dict[str, np.ndarray]
    tokenizer_path: Path
    eos: int
    pad: int


def load_hand_off(ckpt_dir: Path, fmt: str, target: str) -> HandOff:
    """The checkpoint, refused (naming `target`, the layout `fmt` writes) when it is not a dense causal LM."""
    cfg = run_config(ckpt_dir)
    cfg.model.require_causal(f"export --format {fmt} ({target})")
    spec = ModelSpec.from_config(cfg.model)
    if spec.num_experts:
        raise CheckpointError(
            f"this model has mixture-of-experts blocks (model.moe.num_experts > 0), which {target} cannot "
            "hold: export the weights with --format safetensors"
        )
    tokenizer_path = run_tokenizer(ckpt_dir, cfg)
    tokenizer = load_tokenizer(tokenizer_path)
    weights = load_checkpoint(ckpt_dir).weights
    return HandOff(cfg, spec, weights, tokenizer_path, eos_id(tokenizer), pad_id(tokenizer))


@contextmanager
def staged_folder(out: Path) -> Iterator[Path]:
    """A temporary folder that becomes `out` (files with the umask's mode) when the block completes; refuses an
    existing, non-empty `out` first, and removes the temporary folder when the block fails."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OutputExistsError(
            f"{out} already exists and is not an empty folder: choose another --out (nothing was written)"
        )
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    publish_mode(tmp)
    if out.exists():
        out.rmdir()  # empty, checked above
    atomic.publish_folder(tmp, out)
