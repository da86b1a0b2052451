"""`mindfoundry smoke CONFIG`: a few dozen real steps before going big, judged by a pass/fail table.

The smoke run uses the real model, optimizer and peak learning rate (warmup shortened so the peak
is reached), on the first batches of the prepared data, in RUN_DIR/smoke. The checks are the ones
practitioners run by eye on the first minutes of a run, each with the likely cause when it fails.
"""

from __future__ import annotations

import math
import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from mindfoundry.config.parallel_config import Layout
from mindfoundry.config.schema import RunConfig
from mindfoundry.data.dataset.prepared import PreparedData
from mindfoundry.train.anomaly import AnomalyStop
from mindfoundry.train.metrics import read_metrics


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool | None  # None: information only
    value: str
    hint: str = ""


def smoke_config(cfg: RunConfig, steps: int, run_dir: Path) -> RunConfig:
    """The same run, shortened: `steps` steps, warmup at most a fifth of them, no intermediate checkpoints."""
    return cfg.model_copy(
        deep=True,
        update={
            "run_dir": str(run_dir),
            "train": cfg.train.model_copy(update={"steps": steps, "eval_every": 0, "eval_samples": min(
                cfg.train.eval_samples, 4 * cfg.train.micro_batch_size)}),
            "optim": cfg.optim.model_copy(update={"warmup_steps": min(cfg.optim.warmup_steps, steps // 5)}),
            "checkpoint": cfg.checkpoint.model_copy(update={"every": 0, "keep_last": 1, "dir": None}),
            "monitor": cfg.monitor.model_copy(update={"detail_every": 0}),
        },
    )


def evaluate_smoke(records: list[dict[str, Any]], cfg: RunConfig, stop: str | None, peak_rss_mb: float,
                   memory_mb: float) -> list[Check]:
    """Judge a smoke run's metrics; framework-free so every rule is unit-tested on synthetic records."""
    steps = {r["step"]: r for r in records if "loss" in r}
    losses = [steps[s]["loss"] for s in sorted(steps)]
    norms = [steps[s]["grad_norm"] for s in sorted(steps)]
    finite = [x for x in losses if x is not None and math.isfinite(x)]
    uniform = math.log(cfg.model.vocab_size)
    lr = cfg.optim.lr
    mlm = cfg.model.objective == "mlm"
    checks = []
    if stop:
        checks.append(Check("run completes", False, stop.split(". Likely")[0],
                            f"the loss or gradients blew up: learning rate too high? (optim.lr={lr:g})"))
    first = losses[0] if losses else float("nan")
    checks.append(
        Check(
            "initial loss near ln(vocab)",
            first is not None and abs(first - uniform) < 0.5 * max(1.0, uniform / 10),
            f"{first:.3f} vs ln({cfg.model.vocab_size}) = {uniform:.3f}",
            "initial weights too large (model.init_std), logits scaled wrong, or labels leaking the inputs",
        )
    )
    nonfinite = (
        len(losses)
        - len(finite)
        + sum(1 for r in records if r.get("event") == "anomaly" and r.get("kind") == "nonfinite")
    )
    checks.append(Check("no NaN/Inf", nonfinite == 0, f"{nonfinite} non-finite steps",
                        f"learning rate too high (optim.lr={lr:g}) or numerical overflow"))
    if len(finite) >= 10:
        head, tail, peak = finite[0], statistics.mean(finite[-5:]), max(finite)
        checks.append(
            Check(
                "loss never rises far above its start",
                peak < head + 1.0,
                f"peak {peak:.3f} vs start {head:.3f}",
                f"the run diverges: learning rate too high (optim.lr={lr:g}); lower it or lengthen warmup",
            )
        )
        checks.append(Check("loss falls", tail < head - 0.05 * head, f"{head:.3f} -> {tail:.3f}",
                            f"learning rate too low or too high (optim.lr={lr:g}), or broken data"))
        checks.append(
            Check(
                "loss not suspiciously low",
                tail > 0.1 * uniform,
                f"{tail:.3f} after {len(finite)} steps",
                "the model sees the tokens it predicts: masked inputs are not masked (model.mlm.mask_token_rate?)"
                if mlm
                else "the model predicts its own input: labels are probably not shifted (or validation leaks "
                "into training)",
            )
        )
    copy = [steps[s]["copy_fraction"] for s in sorted(steps) if "copy_fraction" in steps[s]]
    if copy and not mlm:  # mlm labels are the input tokens at the masked positions by design
        checks.append(Check("labels are the next tokens", statistics.median(copy) < 0.5,
                            f"{statistics.median(copy):.0%} of labels equal their input token",
                            "labels are probably not shifted by one position: the model is asked to copy its input"))
    evals = [r for r in records if "val_accuracy" in r]
    if mlm and evals:  # information: a few dozen steps first learn the frequent tokens, which can lower it at first
        shares = " -> ".join(f"{r['val_accuracy']:.1%}" for r in (evals[0], evals[-1])[:len(evals)])
        checks.append(
            Check("masked-token accuracy (held-out)", None, f"{shares} of {evals[-1]['val_tokens']} masked tokens")
        )
    ok_norms = [n for n in norms if n is not None and math.isfinite(n)]
    in_range = bool(ok_norms) and len(ok_norms) == len(norms) and 1e-4 < statistics.median(ok_norms) < 100
    checks.append(Check("gradient norms finite and in range", in_range,
                        f"median {statistics.median(ok_norms):.3g}" if ok_norms else "none finite",
                        "vanishing or exploding gradients: check optim.lr, init_std and clip_norm"))
    times = [steps[s]["step_time_s"] for s in sorted(steps)][1:]  # the first step compiles
    if times:
        tps = statistics.median(steps[s]["tokens_per_s"] for s in sorted(steps)[1:])
        wall_h = cfg.train.steps * statistics.median(times) / 3600
        checks.append(Check("throughput", None, f"{tps:,.0f} tokens/s", ""))
        checks.append(Check("projected wall time", None, f"{wall_h:.2f} h for {cfg.train.steps} steps", ""))
    checks.append(
        Check(
            "projected memory vs available",
            peak_rss_mb < 0.8 * memory_mb,
            f"peak {peak_rss_mb:,.0f} MiB of {memory_mb:,.0f} MiB with {cfg.memory.describe(cfg.model.n_layers)}",
            "set memory.recompute: full (or selective), memory.loss_chunk, or reduce train.micro_batch_size or the "
            "model",
        )
    )
    return checks


def run_smoke(cfg: RunConfig, data: PreparedData, steps: int, layout: Layout, console) -> list[Check]:
    from mindfoundry.train.trainer import Trainer

    run_dir = Path(cfg.run_dir) / "smoke"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    trainer = Trainer(smoke_config(cfg, steps, run_dir), data, run_dir, layout, console)
    stop = None
    try:
        trainer.run()
    except AnomalyStop as exc:
        stop = str(exc)
    records = read_metrics(run_dir / "metrics.jsonl")
    peak = max((r.get("peak_rss_mb", 0.0) for r in records), default=0.0)
    return evaluate_smoke(records, cfg, stop, peak, psutil.virtual_memory().total / 2**20)


def first_step_agreement(cfg: RunConfig, data: PreparedData, layout: Layout) -> Check:
    """Same initial weights and first batch on both engines: the first-step loss must agree."""
    from mindfoundry.backends.base import create_backend
    from mindfoundry.model.spec import init_weights, spec_for
    from mindfoundry.train.schedule import step_scalars
    from mindfoundry.workflows.align import first_batches

    spec = spec_for(cfg.model)
    ((ids, labels, scored),) = first_batches(cfg, data, 1)
    scalars = step_scalars(1, cfg.train.steps, cfg.optim, scored)
    out = {}
    for engine in ("mindspore", "torch"):
        backend = create_backend(cfg.model_copy(update={"backend": engine}), spec, layout)
        backend.load_weights(init_weights(spec, cfg.seed))
        out[engine] = backend.train_step(ids, labels, scalars)
    rel = abs(out["mindspore"].loss / out["torch"].loss - 1)
    return Check("first step: MindSpore vs PyTorch", rel < 1e-4,
                 f"loss {out['mindspore'].loss:.6f} vs {out['torch'].loss:.6f} (rel {rel:.1e})",
                 "the engines disagree: run the per-layer comparison to find the first diverging module")


def smoke(cfg: RunConfig, steps: int, *, compare_backend: bool, console) -> list[Check]:
    """`mindfoundry smoke`: check the launch, prepare the data, run `steps` real steps in RUN_DIR/smoke and judge
    them; with ``compare_backend`` also the first step on both engines."""
    from mindfoundry.workflows.run import check_launch, prepare

    layout = check_launch(cfg)
    data = prepare(cfg, log=console.print)
    checks = run_smoke(cfg, data, steps, layout, console)
    if compare_backend:
        checks.append(first_step_agreement(cfg, data, layout))
    return checks
