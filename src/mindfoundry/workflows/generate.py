"""`mindfoundry generate RUN_OR_CHECKPOINT --prompt TEXT`: a trained model's continuation of a prompt.

The checkpoint (a run directory's newest valid one, or the folder given) is loaded into one
process of the run's engine (or another), with the run's own tokenizer, and continued with the
engine's key/value cache (:mod:`mindfoundry.eval.sampling`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from mindfoundry.backends.base import Backend, create_backend
from mindfoundry.checkpoint.reader import load_checkpoint
from mindfoundry.checkpoint.run_files import checkpoint_of, run_config, run_tokenizer
from mindfoundry.checkpoint.store import CheckpointError
from mindfoundry.config.model_config import ObjectiveError
from mindfoundry.config.parallel_config import Layout, ParallelConfig
from mindfoundry.config.schema import RunConfig
from mindfoundry.config.storage_config import StorageConfig
from mindfoundry.data.images.decode import ImageLimits, ImageRejected, decode, square
from mindfoundry.data.tokenizer import eos_id, load_tokenizer
from mindfoundry.errors import InputMissingError
from mindfoundry.eval.captioning import greedy_caption
from mindfoundry.eval.sampling import GenerationError, fit_prompt, generate
from mindfoundry.model.spec import spec_for
from mindfoundry.model.vision_spec import pixel_values
from mindfoundry.storage.resolve import locate


@dataclass
class TrainedModel:
    """A checkpoint loaded for inference: its run's config, the engine holding the weights, the tokenizer."""

    checkpoint: Path
    cfg: RunConfig
    backend: Backend
    tokenizer: Tokenizer


def load_trained(path: str | Path, engine: str | None = None, *, causal_for: str | None = None,
                 storage: StorageConfig | None = None) -> TrainedModel:
    """The checkpoint at `path` (or a run's newest) in one process of `engine` (default: the run's); with `causal_for`
    (what needs it), an ObjectiveError before anything is loaded when the model is not a causal LM. ``storage``: how
    URLs are reached (the checkpoint's own URL, and then the run's data and tasks) instead of the run's settings."""
    ckpt = checkpoint_of(path, storage)
    cfg = run_config(ckpt)
    if storage is not None:
        cfg = cfg.model_copy(update={"storage": storage})
    if causal_for is not None:
        cfg.model.require_causal(causal_for)
    cfg = cfg.model_copy(update={"backend": engine or cfg.backend, "parallel": ParallelConfig()})
    tokenizer = load_tokenizer(run_tokenizer(ckpt, cfg))
    backend = create_backend(cfg, spec_for(cfg.model), Layout())  # one process
    try:
        backend.load_weights(load_checkpoint(ckpt).weights)
    except ValueError as exc:
        raise CheckpointError(f"{ckpt}: {exc} (was it written for another model config?)") from None
    return TrainedModel(ckpt, cfg, backend, tokenizer)


def caption_file(model: TrainedModel, path: str | Path, *, max_new_tokens: int | None = None) -> str:
    """A captioner's greedy caption of the image file at ``path``, decoded and squared as `prepare` does."""
    cfg = model.cfg
    if cfg.model.objective != "caption":
        raise ObjectiveError(f"--image captions an image, and this model was trained with model.objective="
                             f"{cfg.model.objective}: give a captioner's checkpoint (model.objective: caption)")
    where = locate(path, cfg.storage)
    if not where.is_file():
        raise InputMissingError(f"--image {str(where)!r} does not exist: give an image file (PNG, JPEG, ...)")
    images = cfg.data.images
    try:
        decoded = decode(where.read_bytes(), ImageLimits(images.min_side, images.max_aspect, images.max_pixels))
    except ImageRejected as exc:
        raise InputMissingError(f"--image {str(where)!r} cannot be captioned ({exc}): give a readable image") from None
    pixels = pixel_values(square(decoded.pixels, images.size)[None])[0]
    ids = greedy_caption(model.backend, pixels, cfg.train.seq_len, eos_id(model.tokenizer), max_new_tokens)
    return model.tokenizer.decode(ids)


@dataclass
class Generation:
    prompt: str
    completion: str
    token_ids: list[int]  # the new tokens
    prompt_tokens: int  # of the prompt as given
    used_prompt_tokens: int  # of the prompt generation saw (its last ones when it did not fit)


def continue_prompt(model: TrainedModel, prompt: str, *, max_new_tokens: int, temperature: float, top_k: int,
                    top_p: float, seed: int) -> Generation:
    model.cfg.model.require_causal("generation")
    if not prompt:
        raise GenerationError("--prompt is empty: give the text to continue")
    ids = model.tokenizer.encode(prompt).ids
    max_seq_len = model.cfg.model.max_seq_len
    used = fit_prompt(ids, max_new_tokens, max_seq_len)
    new = generate(model.backend, ids, max_seq_len=max_seq_len, max_new_tokens=max_new_tokens, temperature=temperature,
                   top_k=top_k, top_p=top_p, eos_id=eos_id(model.tokenizer), seed=seed)
    return Generation(prompt, model.tokenizer.decode(new), new, len(ids), len(used))
