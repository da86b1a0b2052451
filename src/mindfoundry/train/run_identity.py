"""What makes two configs the same run, and which changes a resume accepts (docs/checkpoints.md, "What a resume
accepts").

A resume accepts every change that leaves what the model and its data *mean* as they were: how the run is executed
(engine, device, layout, memory modes, where things are written), watched (evaluation, monitoring, debugging) and
checkpointed; the global batch and its split (the data position counts samples, so the next step starts at the next
sample: none skipped or seen twice); the number of steps (the LR decay is re-planned from the resume step to the new
end, :mod:`.schedule`); the gradient-clipping threshold and the anomaly watchdog. Anything else -- the model, the
data and its mixture, the seed, the sequence length, the precision, the optimizer -- makes another run, refused by
name with the reason (:func:`resume_changes`). The identity hash (``config.sha256``, and ``run_identity`` in every
checkpoint) is the config without the accepted keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mindfoundry.config.load import excluded_dump, identity_view, public_dump, tree_hash
from mindfoundry.config.parallel_config import Layout, ParallelConfig
from mindfoundry.config.schema import RunConfig

#: The keys (sections or dotted keys) a resume accepts changes of; see the module docstring.
RESUME_MUTABLE = ("monitor", "generate", "checkpoint", "backend", "device", "debug", "run_dir", "eval", "memory",
                  "parallel", "anomaly", "storage",
                  "model.init_from",  # the initial weights' origin matters only before the first checkpoint
                  "train.steps", "train.micro_batch_size", "train.grad_accum", "train.eval_every",
                  "train.eval_samples", "train.log_every", "train.compile", "train.flash_attention",
                  "train.loss_scale_init", "train.loss_scale_growth_interval", "optim.clip_norm",
                  # where the prepared data is and how `prepare` runs, never what it holds (its content is checked
                  # against the checkpoint's on resume)
                  "data.output_dir", "data.executor", "data.ray", "data.work_dir", "data.cache_dir",
                  "data.task_bytes", "data.workers")

#: Keys inside :data:`RESUME_MUTABLE`'s sections that change what is trained all the same: refused on resume.
RESUME_FIXED = ("debug.unshifted_labels",)

#: What a refused change alters, by the longest matching key.
_REASONS = {
    "debug.unshifted_labels": "what the model learns (labels copied from the inputs)",
    "model": "the model",
    "data.mixture": "which samples each position draws (a resume would skip or repeat data)",
    "data": "what the prepared data holds",
    "seed": "the data order and the initial weights",
    "train.seq_len": "the samples (the data position counts samples of this length)",
    "train.precision": "the arithmetic of every step",
    "optim": "the optimizer",
}

#: The identity of releases before resumes accepted these changes (run directories and checkpoints they wrote):
#: the global batch canonical, its split and the layout free, and train.eval_batches in place of eval_samples.
_LEGACY_MUTABLE = ("monitor", "generate", "checkpoint", "backend", "device", "debug", "run_dir", "eval", "memory",
                   "model.init_from", "data.executor", "data.ray", "data.work_dir", "data.cache_dir",
                   "data.task_bytes", "storage")


def run_identity(cfg: RunConfig) -> str:
    """The identity hash of the run ``cfg`` describes (see the module docstring)."""
    return tree_hash(excluded_dump(cfg, RESUME_MUTABLE))


def legacy_run_identity(cfg: RunConfig, layout: Layout) -> str:
    """:func:`run_identity` as releases before 0.2 computed it: what their run directories and checkpoints hold. It
    folds in the global batch, so it needs the launch's ``layout``."""
    t = cfg.train
    global_batch = layout.global_batch(t)
    canonical = cfg.model_copy(update={
        "train": t.model_copy(update={"micro_batch_size": global_batch, "grad_accum": 1}),
        "parallel": ParallelConfig()})
    dump = excluded_dump(canonical, _LEGACY_MUTABLE)
    dump["train"]["eval_batches"] = dump["train"].pop("eval_samples") // t.micro_batch_size
    return tree_hash(dump)


def is_this_run(identity: str | None, cfg: RunConfig, layout: Layout | None) -> bool:
    """Whether a stored identity (a run directory's, a checkpoint's) is ``cfg``'s, by this release or, under a launch's
    ``layout``, an earlier one (without a launch, as for ``prepare``, only this release's)."""
    return identity == run_identity(cfg) or (layout is not None and identity == legacy_run_identity(cfg, layout))


@dataclass(frozen=True)
class Change:
    """One key whose value differs between a run's config and the config it is resumed with."""

    key: str
    old: Any
    new: Any
    accepted: bool

    def __str__(self) -> str:
        return f"{self.key} {_short(self.old)} -> {_short(self.new)}"

    @property
    def reason(self) -> str:
        """What a refused change would alter."""
        matches = [k for k in _REASONS if _under(self.key, (k,))]
        return _REASONS[max(matches, key=len)] if matches else "what the run is"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys (list items by index) of a dumped config, with their values."""
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out if out or not prefix else {prefix[:-1]: tree}
    if isinstance(tree, list) and tree and all(isinstance(v, dict) for v in tree):
        return {k: v for i, item in enumerate(tree) for k, v in _flat(item, f"{prefix}{i}.").items()}
    return {prefix[:-1]: tree}


def _accepted(key: str) -> bool:
    return not _under(key, RESUME_FIXED) and _under(key, RESUME_MUTABLE)


def _under(key: str, prefixes: tuple[str, ...]) -> bool:
    return any(key == m or key.startswith(m + ".") for m in prefixes)


def resume_changes(old: RunConfig, new: RunConfig) -> list[Change]:
    """Every key whose value differs from the run's config (``old``) to the resumed one (``new``), in key order; each
    says whether a resume accepts it."""
    before, after = (_flat(identity_view(public_dump(c))) for c in (old, new))
    keys = sorted(set(before) | set(after))
    return [Change(k, before.get(k), after.get(k), _accepted(k)) for k in keys if before.get(k) != after.get(k)]


def refusal(changes: list[Change]) -> str:
    """The refused changes, each with what it alters, and what a resume accepts (one line)."""
    refused = [c for c in changes if not c.accepted]
    by_reason: dict[str, list[str]] = {}
    for change in refused:
        by_reason.setdefault(change.reason, []).append(str(change))
    listed = "; ".join(f"{', '.join(items)} (changes {reason})" for reason, items in by_reason.items())
    return (f"{listed}. A resume accepts changes of train.steps, the global batch and its split, evaluation, "
            "checkpoint, monitor, memory, parallel and engine settings (docs/checkpoints.md, 'What a resume accepts')")
