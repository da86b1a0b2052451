"""The training loop, engine-agnostic: data order, schedule, eval, checkpoints and metrics.

Everything a resumed run needs is derived from the checkpoint's step and data position: the LR is
a function of the step, the sample order a function of (seed, consumed samples), and the engines
use no in-graph randomness. That is why 3 + restart + 3 steps equals 6 steps bit for bit.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

import mindfoundry
from mindfoundry.backends.base import Backend, create_backend
from mindfoundry.checkpoint.store import find_resumable, load_checkpoint, save_checkpoint
from mindfoundry.config.schema import RunConfig
from mindfoundry.data.packing import IGNORE_INDEX, SampleOrder
from mindfoundry.data.prepared import PreparedData
from mindfoundry.eval.heldout import EvalResult, evaluate
from mindfoundry.model.spec import ModelSpec, flops_per_token, init_weights, num_parameters
from mindfoundry.train.metrics import JsonlSink, MetricsLogger, ProgressSink
from mindfoundry.train.rundir import METRICS_FILE, run_identity
from mindfoundry.train.schedule import step_scalars


@dataclass
class TrainResult:
    backend: Backend
    step: int
    initial_eval: EvalResult | None
    final_eval: EvalResult | None
    losses: list[float] = field(default_factory=list)


def _versions(backend: Backend) -> dict[str, str]:
    out = {"mindfoundry": mindfoundry.__version__, "python": platform.python_version(), "numpy": np.__version__}
    if backend.name == "mindspore":
        import mindspore

        out["mindspore"] = mindspore.__version__
    return out


def _global_batch(samples, order: SampleOrder, consumed: int, cfg: RunConfig) -> tuple[np.ndarray, np.ndarray]:
    """[grad_accum, micro_batch, seq_len] inputs and labels for the next optimizer step."""
    a, b = cfg.train.grad_accum, cfg.train.micro_batch_size
    ids, labels = samples.get_batch(order.indices(consumed, a * b))
    return ids.reshape(a, b, -1), labels.reshape(a, b, -1)


class LayoutUnsupported(RuntimeError):
    """The configured parallel layout cannot run in this version."""


def check_layout(cfg: RunConfig) -> None:
    """Single-process training only, for now: refuse dp > 1 instead of silently training on one device."""
    if cfg.parallel.dp != 1:
        raise LayoutUnsupported(
            f"parallel.dp={cfg.parallel.dp}: data-parallel launch (msrun/torchrun) is not available in this version; "
            "set parallel.dp=1 to train on one device"
        )


class Trainer:
    """Owns one run: builds the engine, restores or initialises state, loops, saves."""

    def __init__(self, cfg: RunConfig, data: PreparedData, run_dir: Path, console: Console | None = None):
        check_layout(cfg)
        self.cfg, self.data, self.run_dir = cfg, data, run_dir
        self.console = console or Console(stderr=True)
        self.spec = ModelSpec.from_config(cfg.model)
        self.train_samples = data.packed("train", cfg.train.seq_len)
        self.val_samples = data.packed("validation", cfg.train.seq_len)
        self.order = SampleOrder(len(self.train_samples), cfg.seed, shuffle=cfg.data.shuffle)
        self.backend = create_backend(cfg, self.spec)
        self.step = 0
        self.consumed_samples = 0
        self.consumed_tokens = 0
        self.initial_eval: dict[str, Any] | None = None

    # -- state -------------------------------------------------------------------------------
    def restore_or_init(self, resume: bool) -> None:
        path, skipped = find_resumable(self.run_dir) if resume else (None, [])
        for note in skipped:
            self.console.print(f"[yellow]skipping checkpoint: {note}[/]")
        if path is None:
            self.backend.load_weights(init_weights(self.spec, self.cfg.seed))
            return
        ckpt = load_checkpoint(path)
        if ckpt.state.get("run_identity") != run_identity(self.cfg):
            self.console.print(f"[yellow]warning: {path} was written under a different config; continuing with this one[/]")
        self.backend.load_weights(ckpt.weights)
        self.backend.load_optimizer_state(ckpt.optimizer, int(ckpt.state["step"]))
        self.step = int(ckpt.state["step"])
        self.consumed_samples = int(ckpt.state["consumed_samples"])
        self.consumed_tokens = int(ckpt.state["consumed_tokens"])
        self.initial_eval = ckpt.state.get("initial_eval")
        self.console.print(f"resumed from {path} (step {self.step}, {self.consumed_samples} samples consumed)")

    def trainer_state(self) -> dict[str, Any]:
        return {
            "consumed_samples": self.consumed_samples,
            "consumed_tokens": self.consumed_tokens,
            "data_order": {"seed": self.cfg.seed, "shuffle": self.cfg.data.shuffle, "position": self.consumed_samples},
            "lr_schedule": {"kind": "warmup_cosine", "step": self.step},
            "rng": {"note": "no in-graph randomness; data order = f(seed, position); init = f(seed)"},
            "run_identity": run_identity(self.cfg),
            "data_manifest_sha256": self.data.manifest_sha256,
            "backend": self.backend.name,
            "versions": _versions(self.backend),
            "initial_eval": self.initial_eval,
        }

    def save(self) -> Path:
        return save_checkpoint(
            self.run_dir, self.step, self.backend.weights(), self.backend.optimizer_state(),
            self.trainer_state(), keep_last=self.cfg.checkpoint.keep_last,
        )

    # -- loop --------------------------------------------------------------------------------
    def evaluate(self) -> EvalResult:
        t = self.cfg.train
        return evaluate(self.backend, self.val_samples, t.micro_batch_size, t.eval_batches, self.data.bytes_per_token("validation"))

    def run(self, *, resume: bool = False, stop_at_step: int | None = None) -> TrainResult:
        cfg, t = self.cfg, self.cfg.train
        self.restore_or_init(resume)
        logger = MetricsLogger([JsonlSink(self.run_dir / METRICS_FILE)])
        flops_tok = flops_per_token(self.spec, t.seq_len)
        logger.log({"event": "start" if self.step == 0 else "resume", "step": self.step, "backend": self.backend.name,
                    "parameters": num_parameters(self.spec), "flops_per_token": flops_tok,
                    "train_samples": len(self.train_samples), "validation_samples": len(self.val_samples)})
        if self.step == 0:
            first = self.evaluate()
            self.initial_eval = first.to_dict()
            logger.log({"step": 0, **self.initial_eval})
        progress = ProgressSink(t.steps, self.step, self.console, cfg.monitor.progress, t.log_every)
        logger.sinks.append(progress)
        losses: list[float] = []
        last_eval: EvalResult | None = None
        end = min(t.steps, stop_at_step) if stop_at_step else t.steps
        try:
            while self.step < end:
                losses.append(self._one_step(logger, flops_tok))
                at_end = self.step == t.steps
                if (t.eval_every and self.step % t.eval_every == 0) or at_end:
                    last_eval = self.evaluate()
                    logger.log({"step": self.step, **last_eval.to_dict()})
                every = cfg.checkpoint.every
                if (every and self.step % every == 0) or at_end or self.step == end:
                    t0 = time.perf_counter()
                    path = self.save()
                    logger.log({"step": self.step, "event": "checkpoint", "path": str(path), "seconds": round(time.perf_counter() - t0, 4)})
        finally:
            logger.close()
        initial = EvalResult(**{k[4:]: v for k, v in self.initial_eval.items()}) if self.initial_eval else None
        return TrainResult(self.backend, self.step, initial, last_eval, losses)

    def _one_step(self, logger: MetricsLogger, flops_tok: int) -> float:
        t = self.cfg.train
        t0 = time.perf_counter()
        ids, labels = _global_batch(self.train_samples, self.order, self.consumed_samples, self.cfg)
        valid = int((labels != IGNORE_INDEX).sum())
        t_data = time.perf_counter()
        scalars = step_scalars(self.step + 1, t.steps, self.cfg.optim, valid)
        out = self.backend.train_step(ids, labels, scalars)
        elapsed = time.perf_counter() - t0
        self.step += 1
        self.consumed_samples += ids.shape[0] * ids.shape[1]
        self.consumed_tokens += ids.size
        tokens_per_s = ids.size / elapsed
        logger.log({
            "step": self.step, "loss": out.loss, "lr": scalars.lr, "grad_norm": out.grad_norm,
            "tokens": ids.size, "valid_tokens": valid, "tokens_per_s": tokens_per_s,
            "step_time_s": elapsed, "data_time_s": t_data - t0,
            "model_tflops_per_s": flops_tok * tokens_per_s / 1e12,
            "consumed_samples": self.consumed_samples,
        })
        return out.loss
