"""`mindfoundry eval RUN_OR_CHECKPOINT`: held-out numbers of a trained checkpoint, and zero-shot multiple choice.

Without options: loss, perplexity and bits per byte on the run's whole validation split, overall
and per category. ``data`` (files, folders or globs of .txt/.jsonl, as data.sources take them): the
same numbers on those documents (:func:`mindfoundry.eval.heldout.evaluate_texts` states the window
rule). ``tasks``: multiple-choice accuracy (:mod:`mindfoundry.eval.tasks`). ``lm_eval``: lm-evaluation-harness
task YAML files scored on this engine (:mod:`mindfoundry.eval.lm_harness`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from mindfoundry.backends.base import BackendUnavailable
from mindfoundry.checkpoint.run_files import run_data
from mindfoundry.data.dataset.masking import TEXTS, VALIDATION, masking_for
from mindfoundry.data.dataset.prepared import load_prepared
from mindfoundry.data.ingest.files import SourceStats, read_files
from mindfoundry.eval.heldout import evaluate_categories, evaluate_texts
from mindfoundry.eval.tasks import read_tasks, score_tasks
from mindfoundry.workflows.generate import TrainedModel


def evaluate_model(model: TrainedModel, *, data: Sequence[str] = (), tasks: Sequence[str] = (),
                   lm_eval: Sequence[str] = ()) -> dict[str, Any]:
    """{"checkpoint", "validation": {category: metrics}, "data": {pattern: metrics}, "tasks": {file: accuracies},
    "lm_eval": {task: {metric: value}}} (validation only when nothing else is asked)."""
    cfg, t = model.cfg, model.cfg.train
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
