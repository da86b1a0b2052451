"""`mindfoundry align`: the same initial weights and batches through two engines (or two precisions),
with dumps, compared tensor by tensor — the report practitioners otherwise assemble by hand.

Each side runs alone (one model in memory at a time): fresh engine, the config's initial weights,
the run's first batches, `steps` optimizer steps, a dump per step. Then the two dump trees are
compared and judged by the practitioners' thresholds on loss and gradient norm.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from mindfoundry.backends.base import Backend, StepOutput, create_backend
from mindfoundry.config.schema import RunConfig
from mindfoundry.data.dataset.packing import IGNORE_INDEX
from mindfoundry.debug.compare import Comparison, Thresholds, compare_trees
from mindfoundry.debug.dump import DumpWriter
from mindfoundry.debug.probe import DIRECTIONS, Probe
from mindfoundry.errors import OutputExistsError
from mindfoundry.model.spec import init_weights, spec_for
from mindfoundry.parallel.layout import launch_layout
from mindfoundry.train.schedule import step_scalars

PRECISIONS = ("fp32", "fp16", "bf16")


@dataclass(frozen=True)
class Side:
    """One engine at one precision, written 'mindspore', 'torch:bf16', 'mindspore:fp16'."""

    backend: str
    precision: str = "fp32"

    @classmethod
    def parse(cls, text: str) -> "Side":
        backend, _, precision = text.partition(":")
        if backend not in ("mindspore", "torch") or (precision and precision not in PRECISIONS):
            raise ValueError(
                f"side '{text}': write ENGINE[:PRECISION] with ENGINE mindspore or torch and PRECISION one of "
                f"{', '.join(PRECISIONS)} (e.g. 'torch:bf16')"
            )
        return cls(backend, precision or "fp32")

    @property
    def label(self) -> str:
        return f"{self.backend}-{self.precision}"

    def config(self, cfg: RunConfig) -> RunConfig:
        return cfg.model_copy(
            update={"backend": self.backend, "train": cfg.train.model_copy(update={"precision": self.precision})}
        )


@dataclass(frozen=True)
class AlignThresholds:
    """Step-level limits of an alignment: the loss as MindFormers' alignment guide has it (abs < 0.005 or
    rel < 0.5%), the grad norm far tighter than its 10%. That 10% is for two runs drifting apart over
    thousands of steps; here both sides start from the same weights and batch, so a correct pair
    differs by rounding alone: fp32 engines by ~1e-6 relative, fp16 or bf16 against fp32 by well under
    1% at the first steps. 1% catches a wrong clip, loss scale or reduction that 10% would pass."""

    loss_abs: float = 0.005
    loss_rel: float = 0.005
    grad_norm_rel: float = 0.01


@dataclass
class StepResult:
    step: int
    loss_a: float
    loss_b: float
    grad_norm_a: float
    grad_norm_b: float
    thresholds: AlignThresholds

    @property
    def loss_abs_err(self) -> float:
        return abs(self.loss_a - self.loss_b)

    @property
    def loss_rel_err(self) -> float:
        return self.loss_abs_err / max(abs(self.loss_b), 1e-12)

    @property
    def grad_norm_rel_err(self) -> float:
        return abs(self.grad_norm_a - self.grad_norm_b) / max(abs(self.grad_norm_b), 1e-12)

    @property
    def loss_ok(self) -> bool:
        t = self.thresholds
        return self.loss_abs_err < t.loss_abs or self.loss_rel_err < t.loss_rel

    @property
    def grad_norm_ok(self) -> bool:
        return self.grad_norm_rel_err <= self.thresholds.grad_norm_rel

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "loss_a": self.loss_a,
            "loss_b": self.loss_b,
            "loss_abs_err": self.loss_abs_err,
            "loss_rel_err": self.loss_rel_err,
            "loss_ok": self.loss_ok,
            "grad_norm_a": self.grad_norm_a,
            "grad_norm_b": self.grad_norm_b,
            "grad_norm_rel_err": self.grad_norm_rel_err,
            "grad_norm_ok": self.grad_norm_ok,
        }


@dataclass
class AlignResult:
    a: Side
    b: Side
    steps: list[StepResult]
    comparisons: list[Comparison]  # one per step
    out: Path
    files: dict[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(s.loss_ok and s.grad_norm_ok for s in self.steps)

    def lowest_cosine(self):
        rows = [c.lowest_cosine() for c in self.comparisons]
        rows = [r for r in rows if r is not None and r.cosine is not None]
        return min(rows, key=lambda r: r.cosine, default=None)

    def first_divergence(self):
        return next((c.first_divergence() for c in self.comparisons if c.first_divergence() is not None), None)

    def to_dict(self) -> dict[str, Any]:
        low, first = self.lowest_cosine(), self.first_divergence()
        return {
            "a": asdict(self.a),
            "b": asdict(self.b),
            "passed": self.passed,
            "steps": [s.to_dict() for s in self.steps],
            "lowest_cosine": None if low is None else {"name": low.name, "cosine": low.cosine},
            "first_divergence": None
            if first is None
            else {"name": first.name, "module": first.module, "reason": first.reason},
            "top_modules": self.comparisons[0].worst_modules(5) if self.comparisons else [],
            "counts": [c.counts() for c in self.comparisons],
            "files": self.files,
        }


def first_batches(cfg: RunConfig, data, steps: int) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """The run's first `steps` global batches, exactly as the trainer would feed them: (inputs, labels, the positions
    that carry a loss)."""
    from mindfoundry.data.dataset.loader import TrainLoader, training_source
    from mindfoundry.data.dataset.masking import TRAIN, masking_for

    loader = TrainLoader(
        training_source(cfg, data),
        micro_batch_size=cfg.train.micro_batch_size,
        grad_accum=cfg.train.grad_accum,
        masking=masking_for(cfg, data.tokenizer, TRAIN),
    )
    return [(b.input_ids, b.labels, b.scored) for b in (loader.batch(i * loader.global_batch) for i in range(steps))]


def run_side(backend: Backend, cfg: RunConfig, batches: Sequence[tuple], out: Path, mode: str,
             directions: Sequence[str] = DIRECTIONS, modules: Sequence[str] = ("*",)) -> list[StepOutput]:
    """Train `backend` on `batches` from its current state, dumping every step to out/step{N}/rank0. A batch is
    (inputs, labels[, scored]): the positions carrying a loss are counted from the labels when not given (tokens;
    an image objective's batches from :func:`first_batches` say theirs).

    An fp16 side runs with the configured initial loss scale (no back-off within an alignment: an
    overflowing step shows up as such); its dumped gradients are unscaled, comparable with fp32."""
    outs = []
    for step, (ids, labels, *scored) in enumerate(batches, 1):
        scale = cfg.train.loss_scale_init if cfg.train.precision == "fp16" else 1.0  # as training would start
        valid = scored[0] if scored else int((labels != IGNORE_INDEX).sum())
        scalars = step_scalars(step, cfg.train.steps, cfg.optim, valid, loss_scale=scale)
        writer = DumpWriter(
            out, step, 0, mode, {"backend": backend.name, "precision": cfg.train.precision, "loss_scale": scale}
        )
        result = backend.train_step(
            ids, labels, scalars, Probe(writer, modules, directions, grad_unscale=scalars.grad_unscale)
        )
        writer.close(loss=result.loss, grad_norm=result.grad_norm, applied=result.applied)
        outs.append(result)
    return outs


def align(cfg: RunConfig, data, a: Side, b: Side, out: Path, *, steps: int = 1, mode: str = "tensor",
          thresholds: AlignThresholds = AlignThresholds(), compare_thresholds: Thresholds = Thresholds(),
          log: Callable[[str], None] = print) -> AlignResult:
    """Run both sides from the config's initial weights on the same batches, dump, compare, judge.

    ``data`` None: claim the run dir and prepare the config's data first (what `mindfoundry align` does)."""
    from mindfoundry.report.compare_report import write_csv, write_html
    from mindfoundry.workflows.run import prepare

    if data is None:
        data = prepare(cfg, log=log)
    if out.exists() and any(out.iterdir()):
        raise OutputExistsError(
            f"{out} is not empty: choose another --out (earlier alignments are kept, never overwritten)"
        )
    spec = spec_for(cfg.model)
    batches = first_batches(cfg, data, steps)
    weights = init_weights(spec, cfg.seed)
    results: dict[str, list[StepOutput]] = {}
    for side in (a, b):
        log(f"align: {side.label}: {steps} step(s) with {mode} dumps")
        side_cfg = side.config(cfg)
        backend = create_backend(side_cfg, spec, launch_layout(side_cfg))  # both sides in this process
        backend.load_weights(weights)
        results[side.label] = run_side(backend, side_cfg, batches, out / side.label, mode)
        del backend
    step_results = [StepResult(i + 1, ra.loss, rb.loss, ra.grad_norm, rb.grad_norm, thresholds)
                    for i, (ra, rb) in enumerate(zip(results[a.label], results[b.label]))]
    comparisons = compare_trees(out / a.label, out / b.label, compare_thresholds)
    result = AlignResult(a, b, step_results, comparisons, out)
    result.files = {
        "csv": str(write_csv(comparisons[0], out / "compare_step1.csv")),
        "html": str(write_html(comparisons, out / "compare.html")),
    }
    for extra in comparisons[1:]:
        step = extra.meta_a.get("step")
        result.files[f"csv_step{step}"] = str(write_csv(extra, out / f"compare_step{step}.csv"))
    (out / "align.json").write_text(
        json.dumps(result.to_dict(), indent=2, default=_json_default) + "\n", encoding="utf-8"
    )
    return result


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")
