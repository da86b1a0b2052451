"""`mindfoundry eval RUN_OR_CHECKPOINT`: held-out numbers of a trained checkpoint, and zero-shot multiple choice.

Without options: loss, perplexity and bits per byte on the run's whole validation split, overall
and per category. ``data`` (files, folders or globs of .txt/.jsonl, as data.sources take them): the
same numbers on those documents (:func:`mindfoundry.eval.heldout.evaluate_texts` states the window
rule). ``tasks``: multiple-choice accuracy (:mod:`mindfoundry.eval.tasks`). ``lm_eval``: lm-evaluation-harness
task YAML files scored on this engine (:mod:`mindfoundry.eval.lm_harness`).

An image model (``objective: mae``) is scored on its whole validation split (the masked-patch loss, with the
validation masks training's evaluations use) and, with ``probe``, by a linear probe of its encoder against the same
probe on a randomly initialised one (:mod:`mindfoundry.eval.linear_probe`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from mindfoundry.backends.base import Backend, BackendUnavailable
from mindfoundry.checkpoint.run_files import run_data
from mindfoundry.config.model_config import ObjectiveError
from mindfoundry.config.schema import RunConfig
from mindfoundry.data.dataset.masking import TEXTS, VALIDATION, masking_for
from mindfoundry.data.dataset.prepared import PreparedData, load_prepared
from mindfoundry.data.images.digits import DigitsUnavailable, digits_images
from mindfoundry.data.ingest.files import SourceStats, read_files
from mindfoundry.eval.heldout import evaluate_categories, evaluate_texts, held_out
from mindfoundry.eval.linear_probe import encode, linear_probe
from mindfoundry.eval.tasks import read_tasks, score_tasks
from mindfoundry.model.spec import init_weights, spec_for
from mindfoundry.workflows.generate import TrainedModel


def evaluate_model(model: TrainedModel, *, data: Sequence[str] = (), tasks: Sequence[str] = (),
                   lm_eval: Sequence[str] = (), probe: Sequence[str] = ()) -> dict[str, Any]:
    """{"checkpoint", "validation": {category: metrics}, "data": {pattern: metrics}, "tasks": {file: accuracies},
    "lm_eval": {task: {metric: value}}} (validation only when nothing else is asked); an image model's
    {"checkpoint", "validation": {"all": metrics}, "probe": {set: accuracies}}."""
    cfg, t = model.cfg, model.cfg.train
    if cfg.model.is_image:
        if data or tasks or lm_eval:
            raise ObjectiveError(f"--data, --tasks and --lm-eval score text, and this model was trained with "
                                 f"model.objective={cfg.model.objective} (an image model): use --probe digits, or "
                                 "no option for the held-out masked-patch loss")
        return _evaluate_images(model, probe)
    if probe:
        raise ObjectiveError(f"--probe reads an image encoder's features, and this model was trained with "
                             f"model.objective={cfg.model.objective} (a language model): remove --probe")
    if tasks:
        cfg.model.require_causal("--tasks (choices scored by their causal log-likelihood)")
    if lm_eval:
        cfg.model.require_causal("--lm-eval (lm-evaluation-harness scores causal log-likelihoods)")
    out: dict[str, Any] = {"checkpoint": str(model.checkpoint)}
    if not data and not tasks and not lm_eval:
        prepared = load_prepared(run_data(model.checkpoint, cfg), cfg.model.vocab_size)
        out["validation"] = {
            name: r.to_dict("")
            for name, r in evaluate_categories(
                model.backend,
                prepared,
                t.seq_len,
                t.micro_batch_size,
                None,  # every validation sample
                masking_for(cfg, prepared.tokenizer, VALIDATION),
            ).items()
        }
    for pattern in data:
        docs = read_files([pattern], name="eval", category="eval", txt_mode="file", stats=SourceStats(),
                          storage=cfg.storage)
        out.setdefault("data", {})[pattern] = evaluate_texts(
            model.backend,
            model.tokenizer,
            (d.text for d in docs),
            t.seq_len,
            t.micro_batch_size,
            masking_for(cfg, model.tokenizer, TEXTS),
        ).to_dict("")
    for path in tasks:
        out.setdefault("tasks", {})[Path(path).name] = score_tasks(model.backend, model.tokenizer,
                                                                   read_tasks(path, cfg.storage),
                                                                   cfg.model.max_seq_len)
    if lm_eval:
        try:
            from mindfoundry.eval.lm_harness import MindFoundryLM, run_lm_eval
        except ModuleNotFoundError as exc:
            raise BackendUnavailable(f"--lm-eval needs {exc.name!r}: pip install 'mindfoundry[eval]'") from None
        results = run_lm_eval(MindFoundryLM(model.backend, model.tokenizer, cfg.model.max_seq_len), lm_eval)["results"]
        out["lm_eval"] = {
            task: {k: v for k, v in metrics.items() if isinstance(v, (int, float))} for task, metrics in results.items()
        }
    return out


def _evaluate_images(model: TrainedModel, probe: Sequence[str]) -> dict[str, Any]:
    """The image model's held-out loss and probes (see the module docstring)."""
    cfg, backend = model.cfg, model.backend
    prepared = load_prepared(run_data(model.checkpoint, cfg), cfg.model.vocab_size)
    out: dict[str, Any] = {"checkpoint": str(model.checkpoint),
                           "validation": heldout_images(backend, cfg, prepared)}
    for name in probe:
        if name != "digits":
            raise DigitsUnavailable(f"--probe {name!r}: the probe set this version has is digits (scikit-learn's "
                                    "handwritten digits)")
        out.setdefault("probe", {})[name] = probe_digits(backend, cfg)
    return out


def heldout_images(backend: Backend, cfg: RunConfig, prepared: PreparedData) -> dict[str, dict[str, Any]]:
    """An image model's whole validation split: "all"; for a captioner also "shuffled_images", each caption scored
    with another sample's image (the gap in bits per byte is what the captioner reads from the images)."""
    heldout = held_out(cfg, prepared)
    out = {"all": heldout.score(backend, cfg.train.micro_batch_size, None).to_dict("")}
    if (shuffled := heldout.with_shuffled_images()) is not None:
        out["shuffled_images"] = shuffled.score(backend, cfg.train.micro_batch_size, None).to_dict("")
    return out


def probe_digits(backend: Backend, cfg: RunConfig) -> dict[str, float | int]:
    """The digits probe of the image encoder `backend` holds, and of the same encoder randomly initialised from the
    run's seed (the backend holds its weights again afterwards)."""
    spec = spec_for(cfg.model)
    images, labels = digits_images(cfg.data.images.size)
    weights = backend.weights()
    trained = linear_probe(encode(backend.image_features, images), labels)
    backend.load_weights(init_weights(spec, cfg.seed))  # the same encoder, untrained: what pretraining added
    untrained = linear_probe(encode(backend.image_features, images), labels)
    backend.load_weights(weights)
    return {"accuracy": trained.accuracy, "random_encoder": untrained.accuracy,
            "train_images": trained.train_images, "test_images": trained.test_images}
