"""The training loop, engine-agnostic: data order, schedule, eval, checkpoints and metrics.

Everything a resumed run needs is derived from the checkpoint's step and data position: the LR is
a function of the step, the sample order a function of (seed, consumed samples), and the engines
use no in-graph randomness. That is why 3 + restart + 3 steps equals 6 steps bit for bit.
"""

from __future__ import annotations

import math
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from rich.console import Console

from mindfoundry.backends.base import Backend, create_backend, import_engine, supports_sharded
from mindfoundry.checkpoint.hf_import import start_weights
from mindfoundry.checkpoint.reader import load_checkpoint, shard_format
from mindfoundry.checkpoint.store import CheckpointError, shard_folders
from mindfoundry.config.parallel_config import Layout
from mindfoundry.config.schema import RunConfig
from mindfoundry.data.dataset.loader import Batch, BatchIterator, TrainLoader, training_source
from mindfoundry.data.dataset.masking import TRAIN, masking_for
from mindfoundry.data.dataset.mixture import MixtureSampler
from mindfoundry.data.dataset.packing import IGNORE_INDEX
from mindfoundry.data.dataset.prepared import PreparedData
from mindfoundry.errors import MindFoundryError
from mindfoundry.eval.heldout import EvalResult, held_out
from mindfoundry.eval.tasks import read_tasks, score_tasks
from mindfoundry.model.spec import flops_per_token, num_parameters, parameter_shapes, sample_tokens, spec_for
from mindfoundry.monitor.hardware import HardwareSampler
from mindfoundry.monitor.health import HealthMonitor
from mindfoundry.monitor.mfu import MfuMeter, UnknownPeakError, devices_peak
from mindfoundry.parallel.layout import launched_local_rank
from mindfoundry.train.anomaly import AnomalyMonitor
from mindfoundry.train.checkpointing import RunCheckpoints
from mindfoundry.train.debug_steps import StepDebugger
from mindfoundry.train.layer_stats import layer_grad_norms, layer_update_ratios, layer_weight_norms
from mindfoundry.train.loss_scale import DynamicLossScaler
from mindfoundry.train.metrics import MetricsLogger, ProgressSink, run_sinks
from mindfoundry.train.profile_steps import StepProfiler
from mindfoundry.train.run_identity import is_this_run, run_identity
from mindfoundry.train.schedule import step_scalars
from mindfoundry.train.state import DataPosition, Evaluations, Keyed, Progress, restore_state, save_state
from mindfoundry.train.stop import Phase, Preempted, signals


class OverflowStop(MindFoundryError, RuntimeError):
    """A non-finite step with ``debug.overflow.error_stop`` on: training stops there, naming the module."""


@dataclass
class TrainResult:
    backend: Backend
    step: int
    initial_eval: EvalResult | None
    final_eval: EvalResult | None
    losses: list[float] = field(default_factory=list)


class Trainer:
    """Owns one run: builds the engine, restores or initialises state, loops, saves, recovers.

    The caller has checked the launch and passes its layout (:func:`mindfoundry.workflows.run.check_launch`): the
    layout rules run once per process, before the run directory is touched, and the engine is given the result."""

    def __init__(self, cfg: RunConfig, data: PreparedData, run_dir: Path, layout: Layout,
                 console: Console | None = None):
        self.cfg, self.data, self.run_dir, self.layout = cfg, data, run_dir, layout
        self.console = console or Console(stderr=True)
        self.spec = spec_for(cfg.model)
        self.source = training_source(cfg, data)
        with signals.held():  # an engine's import cut by a stop signal aborted the process at exit (train.stop)
            import_engine(cfg.backend)
        self.backend = create_backend(cfg, self.spec, layout)  # first: it knows which feed of the batch this rank is
        self.loader = TrainLoader.for_global_batch(self.source, layout.global_batch(cfg.train),
                                                   grad_accum=cfg.train.grad_accum,
                                                   dp_rank=self.backend.dp_rank, dp_size=self.backend.dp_size,
                                                   masking=masking_for(cfg, data.tokenizer, TRAIN))
        self.is_main = self.backend.rank == 0  # only rank 0 writes metrics and checkpoints
        self._batches: BatchIterator | None = None
        self.held_out = held_out(cfg, data)
        self.anomaly = AnomalyMonitor(cfg.anomaly)
        self.scaler = DynamicLossScaler(cfg.train.loss_scale_init, growth_interval=cfg.train.loss_scale_growth_interval,
                                        enabled=cfg.train.precision == "fp16")  # disabled: scale 1.0 (fp32, bf16)
        self.debugger = StepDebugger(cfg, run_dir, rank=self.backend.rank, log=self.console.print,
                                     world_size=self.backend.world_size)
        self.health = HealthMonitor(cfg.monitor.health, cfg.optim.warmup_steps)
        self.mfu = MfuMeter(None)  # its peak is measured or looked up before the loop
        self.hardware = HardwareSampler(self.backend.device_kind, launched_local_rank(), cfg.monitor.hardware_every_s)
        self.profiler = StepProfiler(cfg, run_dir, self.backend, self.console.print)
        self.checkpoints = RunCheckpoints(cfg, data, self.backend, self.console.print)
        self.progress = Progress()
        self.position = DataPosition(cfg.seed, cfg.data.shuffle,
                                     mixture_state=self.source.state if isinstance(self.source, MixtureSampler)
                                     else None)
        self.evals = Evaluations()
        #: What trainer_state.json holds: each part saves and restores its own entries (train/state.py).
        self.state_parts = [self.progress, self.position, Keyed("loss_scale", self.scaler),
                            Keyed("anomaly", self.anomaly),
                            Keyed("health", self.health), self.evals]
        #: eval.tasks, read now so that a malformed file stops the run before its first step
        self.tasks = {Path(path).stem: read_tasks(path, cfg.storage) for path in cfg.eval.tasks}
        # `mindfoundry dump --resume auto`: another run's directory to resume from, at a step below resume_before
        self.resume_from: Path | None = None
        self.resume_before: int | None = None
        self._process = psutil.Process()
        # where the current step is: inside the engine's step, or past it with the counters not yet moved (the
        # weights may then be ahead of `progress`: no last-gasp checkpoint of that state)
        self._in_engine = self._counters_behind = False

    # -- state -------------------------------------------------------------------------------
    def restore_or_init(self, resume: bool) -> None:
        for leftover in self.checkpoints.clean_interrupted():
            self.console.print(f"removed {leftover}: what an interrupted checkpoint write or deletion left behind")
        path, origin, skipped = (self.checkpoints.resumable(self.resume_from, self.resume_before) if resume
                                 else (None, None, []))
        if path is None and skipped:  # every committed checkpoint is damaged: never a silent start from step 0
            raise CheckpointError(
                f"--resume auto found {len(skipped)} checkpoint(s) in {self.checkpoints.directory} and none verifies: "
                f"{'; '.join(skipped)}. Nothing was changed: restore them (a copy, the bucket's versions), or start "
                "over with --overwrite (a run directory's checkpoints are moved aside with it; another checkpoint.dir "
                "must be emptied or changed first)")
        for note in skipped:
            self.console.print(f"[yellow]skipping checkpoint: {note}[/]")
        if path is None:
            weights, notes = start_weights(self.cfg, self.spec)
            self.backend.load_weights(weights)
            for note in notes:
                self.console.print(note)
            self.progress.plan(self.cfg.train.steps, self.cfg.optim)
            return
        self.checkpoints.check_data(path, origin)
        self._load(path)
        self.console.print(f"resumed from {origin} (step {self.progress.step}, {self.position.consumed_samples} "
                           "samples consumed)")
        self._plan()

    def _plan(self) -> None:
        """Honour a changed train.steps (the LR decay re-planned from this step) and say so."""
        old, t = self.progress.steps, self.cfg.train
        replan = self.progress.plan(t.steps, self.cfg.optim)
        if replan is not None:
            self.console.print(f"train.steps {old} -> {t.steps}: from step {replan.at} the LR decays from "
                               f"{replan.lr:.4g} to {self.cfg.optim.lr * self.cfg.optim.min_lr_ratio:.4g} at step "
                               f"{t.steps}", highlight=False)
        if self.progress.step >= t.steps:
            self.console.print(f"step {self.progress.step} of the checkpoint reaches train.steps={t.steps}: nothing "
                               "left to train", highlight=False)

    def _load(self, path: Path) -> None:
        # by what is on disk, not checkpoint.format: an engine that can reshards a sharded checkpoint itself (each rank
        # reads its pieces); any other consolidates it into full arrays (load_checkpoint)
        form = shard_format(path)
        sharded = form is not None and supports_sharded(self.backend, form)
        ckpt = load_checkpoint(path, verify=False, tensors=not sharded)  # find_resumable verified `path`
        written_by = ckpt.state.get("run_identity")  # None: imported by `mindfoundry convert FILE RUN_DIR`
        if not is_this_run(written_by, self.cfg, self.layout):
            if written_by is not None and self.resume_from is None:  # in the run's own folder: another run's checkpoint
                raise CheckpointError(f"{path} was written by a different run (its run identity differs from this "
                                      f"config's): move it out of {self.run_dir}, or start from its weights with "
                                      "model.init_from")
            self.console.print(f"[yellow]warning: {path} was written under a different config; continuing with this "
                               "one[/]")
        st = ckpt.state
        try:
            if sharded:
                self.backend.load_sharded(shard_folders(path), int(st.get("adam_step", st["step"])))  # collective
            else:
                self.backend.load_weights(ckpt.weights)
                self.backend.load_optimizer_state(ckpt.optimizer, int(st.get("adam_step", st["step"])))
        except ValueError as exc:
            raise CheckpointError(f"{path}: {exc} (was it written for another model config?)") from None
        restore_state(self.state_parts, st)

    def trainer_state(self) -> dict[str, Any]:
        """trainer_state.json: the components' entries, and what the checkpoint was written by and for."""
        return self.checkpoints.trainer_state(save_state(self.state_parts), run_identity(self.cfg))

    def _next_batch(self) -> Batch:
        """The batch at the current data position, prefetched in the background."""
        if self._batches is None:
            self._batches = self.loader.iterate(self.position.consumed_samples)
        batch = next(self._batches)
        if batch.position != self.position.consumed_samples:  # the position jumped (a rollback): restart there
            self._close_batches()
            return self._next_batch()
        return batch

    def _close_batches(self) -> None:
        if self._batches is not None:
            self._batches.close()
            self._batches = None

    # -- loop --------------------------------------------------------------------------------
    def evaluate(self) -> EvalResult:
        t = self.cfg.train
        # batches of the global micro-batch (every rank passes the same rows; the backend splits them over dp ranks)
        return self.held_out.score(self.backend, self.loader.global_micro_batch, t.eval_samples)

    def _eval_scope(self, explain: bool = False) -> str:
        """Which part of the validation split a training-time evaluation scores; with ``explain``, how that sample is
        taken and that ``mindfoundry eval`` scores all of it."""
        total = len(self.held_out.samples)
        used = min(self.cfg.train.eval_samples, total)
        if used == total:
            return f"all {total} validation samples"
        return f"{used} of {total} validation samples" + (
            ", the same evenly spaced ones each time, whatever the layout; `mindfoundry eval` scores all" if explain
            else "")

    def _print_eval(self, step: int, result: EvalResult) -> None:
        """An evaluation on the console as it happens, between the step lines."""
        if self.is_main:
            ppl = "" if result.perplexity is None else f", ppl {result.perplexity:.2f}"  # (images: none)
            self.console.print(f"step {step}: validation loss {result.loss:.4f}{ppl} ({self._eval_scope()})",
                               highlight=False)

    def _task_scores(self) -> dict[str, dict[str, float]]:
        """eval.tasks scored now: {"task_acc": {task: acc}, "task_acc_norm": {...}} (empty without tasks)."""
        if not self.tasks:
            return {}
        scores = {name: score_tasks(self.backend, self.data.tokenizer, questions, self.cfg.model.max_seq_len)["overall"]
                  for name, questions in self.tasks.items()}
        metrics = (("task_acc", "acc"), ("task_acc_norm", "acc_norm"))
        return {key: {name: s[metric] for name, s in scores.items()} for key, metric in metrics}

    def _stop_agreed(self) -> bool:
        """Whether to stop after this step: a stop signal here or, with several processes, on any rank
        (collective: every rank stops after the same step and takes part in its checkpoint)."""
        stop = signals.received is not None
        return self.backend.any_rank(stop) if self.backend.world_size > 1 else stop

    def _state_is_last_step(self) -> bool:
        """Whether the engine's weights and moments are those of `progress.step` (after an exception)."""
        return not self._counters_behind and not (self._in_engine and self.backend.update_began)

    def _can_save_alone(self) -> bool:
        """Whether this process can write a checkpoint without the other ranks (which may be gone)."""
        return self.backend.world_size == 1 or (self.backend.holds_full_state and self.cfg.checkpoint.format == "full")

    def run(self, *, resume: bool = False, stop_at_step: int | None = None) -> TrainResult:
        """Train to the end (or `stop_at_step`). A stop signal before the first step raises Preempted at once; during
        the loop it checkpoints the current step and raises Preempted (signals are handled by
        :mod:`mindfoundry.train.stop`: installed here unless the CLI did so at its first line). An exception
        checkpoints the last completed step first when this rank holds it whole and untorn."""
        own_signals = not signals.installed
        if own_signals:
            signals.install(self.console.print)
        try:
            return self._run(resume, stop_at_step)
        finally:
            if own_signals:
                signals.uninstall()

    def _run(self, resume: bool, stop_at_step: int | None) -> TrainResult:
        cfg, t = self.cfg, self.cfg.train
        self.restore_or_init(resume)
        # sinks before the start/resume event: a resume marker trims the replayed steps
        logger = MetricsLogger(run_sinks(cfg.monitor, self.run_dir) if self.is_main else [])
        flops_tok = flops_per_token(self.spec, t.seq_len)
        # MFU only in rank 0's records: on a CPU the peak is a timed GEMM that other ranks measuring at once would slow
        self.mfu = MfuMeter(self._device_peak() if self.is_main else None)
        logger.log({"event": "start" if self.progress.step == 0 else "resume", "step": self.progress.step,
                    "backend": self.backend.name, "parameters": num_parameters(self.spec), "flops_per_token": flops_tok,
                    "validation_samples": len(self.held_out.samples),
                    "memory": cfg.memory.describe(self.spec.n_layers)})
        if self.progress.step == 0:
            self.console.print(f"step 0: evaluating the untrained model ({self._eval_scope(explain=True)}); the first "
                               "training step then compiles the model's step (seconds to a minute) before step lines "
                               "appear", highlight=False)
            initial = self.evaluate()
            self.evals.initial = initial.to_dict()
            self._print_eval(0, initial)
            logger.log({"step": 0, **self.evals.initial, **self._task_scores()})
        logger.sinks.append(ProgressSink(t.steps, self.progress.step, self.console,
                                         cfg.monitor.progress and self.is_main, t.log_every))
        losses: list[float] = []
        last_eval: EvalResult | None = None
        end = min(t.steps, stop_at_step) if stop_at_step else t.steps
        saved_step, saving = -1, False
        signals.enter(Phase.TRAINING)
        try:
            while self.progress.step < end:
                self.profiler.before(self.progress.step + 1)
                losses.append(self._one_step(logger, flops_tok))
                if (trace := self.profiler.after(self.progress.step, end)) is not None:
                    logger.log({"step": self.progress.step, "event": "profile", "steps": cfg.monitor.profile.steps,
                                "path": str(trace)})
                saving = True  # a commit that failed in the background is raised here (and not tried again)
                self.checkpoints.log_commits(logger)
                saving = False
                stop = self._stop_agreed()
                at_end = self.progress.step == t.steps
                if (t.eval_every and self.progress.step % t.eval_every == 0) or at_end:
                    last_eval = self.evaluate()
                    self.evals.measured(last_eval.loss, self.progress.step)
                    self._print_eval(self.progress.step, last_eval)
                    logger.log({"step": self.progress.step, **last_eval.to_dict(), **self._task_scores()})
                every = cfg.checkpoint.every
                if (every and self.progress.step % every == 0) or at_end or self.progress.step == end or stop:
                    saving = True
                    if stop:
                        self._settle_before_stop(logger, "the checkpoint before it")
                    self._checkpoint(logger)
                    saving, saved_step = False, self.progress.step
                if stop:
                    self._settle_before_stop(logger, "this checkpoint")
                # no rank leaves before rank 0 committed the checkpoint (a launcher such as msrun kills the others when
                # the first one exits)
                if stop and self.backend.world_size > 1:
                    self.backend.any_rank(False)
                if stop and self.progress.step < end:  # a signal during the last step: the run is complete
                    raise Preempted(f"stopped by {signals.name or 'a stop signal on another rank'} at step "
                                    f"{self.progress.step}; checkpoint committed; continue with --resume auto")
            self.checkpoints.settle(logger)  # the last checkpoint counts before the run is done
            signals.enter(Phase.FINISHING)
        except (Preempted, KeyboardInterrupt):
            raise
        except Exception as exc:
            # with several processes only a rank that holds the whole state writes (the others may be gone);
            # the write that just failed (a full disk) is not tried again
            if (self.is_main and not saving and saved_step != self.progress.step and self.progress.step > 0
                    and self._state_is_last_step() and self._can_save_alone()):
                self.console.print(f"[red]{type(exc).__name__} at step {self.progress.step + 1}: writing a last-gasp "
                                   f"checkpoint of step {self.progress.step}[/]")
                if self.checkpoints.settle(logger, cfg.checkpoint.stop_grace_s):
                    self._checkpoint(logger)
                    self.checkpoints.settle(logger, cfg.checkpoint.stop_grace_s)
            raise
        finally:
            self.profiler.close()  # a run that ended inside the range: the trace of the steps it ran
            self._close_batches()
            logger.close()
        initial = EvalResult(**{k[4:]: v for k, v in self.evals.initial.items()}) if self.evals.initial else None
        return TrainResult(self.backend, self.progress.step, initial, last_eval, losses)

    def _settle_before_stop(self, logger: MetricsLogger, which: str) -> None:
        """On a stop signal: wait at most checkpoint.stop_grace_s for the commit in flight (rank 0; every rank learns
        the outcome), else stop without a checkpoint of this step: the newest committed one is where a resume starts."""
        grace = self.cfg.checkpoint.stop_grace_s
        settled = self.checkpoints.settle(logger, grace)
        if self.backend.world_size > 1:
            settled = not self.backend.any_rank(not settled)
        if not settled:
            raise Preempted(f"stopped by {signals.name or 'a stop signal on another rank'} at step "
                            f"{self.progress.step}; {which} was still committing after checkpoint.stop_grace_s="
                            f"{grace:g} s, so step {self.progress.step} is not checkpointed; --resume auto continues "
                            "from the newest committed checkpoint")

    def _device_peak(self) -> float | None:
        """Peak FLOP/s of the devices in use (every process is one device); None, said once, when unknown."""
        try:
            return devices_peak(self.cfg.monitor.peak_tflops, self.backend.device_name, self.cfg.train.precision,
                                self.layout.world_size)
        except UnknownPeakError as exc:
            self.console.print(f"[yellow]MFU not reported: {exc} (set monitor.peak_tflops)[/]")
            return None

    def _checkpoint(self, logger: MetricsLogger) -> None:
        """Snapshot this step and start its commit (the log's seconds are how long training stood still)."""
        t0 = time.perf_counter()
        path = self.checkpoints.save(self.progress.step, self.trainer_state)
        if path is not None:
            self.console.print(f"saved step {self.progress.step} (committing)", highlight=False)
        logger.log({"step": self.progress.step, "event": "checkpoint", "path": str(path),
                    "seconds": round(time.perf_counter() - t0, 4)})

    def _one_step(self, logger: MetricsLogger, flops_tok: int) -> float:
        t = self.cfg.train
        t0 = time.perf_counter()
        batch = self._next_batch()
        ids, labels = batch.input_ids, (batch.input_ids if self.cfg.debug.unshifted_labels else batch.labels)
        valid = int(self.backend.global_sum(float(batch.scored if labels is batch.labels else  # (debug labels)
                                                  (labels != IGNORE_INDEX).sum())))  # of the global batch
        t_data = time.perf_counter()
        detail = bool(self.cfg.monitor.detail_every) and (self.progress.step + 1) % self.cfg.monitor.detail_every == 0
        before = self.backend.weights() if detail else None
        loss_limit, grad_limit = self.anomaly.limits()
        loss_scale = self.scaler.scale
        step = self.progress.step + 1
        scalars = step_scalars(step, t.steps, self.cfg.optim, valid, adam_step=self.progress.adam_step + 1,
                               replans=self.progress.replans,
                               loss_limit=loss_limit, grad_limit=grad_limit, loss_scale=loss_scale,
                               loss_multiplier=self.debugger.loss_multiplier(step))
        injection = self.debugger.injection(self.progress.step + 1)
        probe = self.debugger.probe(self.progress.step + 1, self.backend, injection, scalars.grad_unscale)
        self._in_engine = True
        out = self.backend.train_step(ids, labels, scalars, probe)
        self._in_engine, self._counters_behind = False, True
        dumped = self.debugger.finish(probe, out)
        if dumped:
            logger.log({"step": self.progress.step + 1, "event": "dump", "path": str(dumped)})
        # fp16: the scaled gradients overflowed while the loss was finite and the step dropped the update;
        # backing off the scale is the normal answer, not an anomaly to locate (unless the scale is at its floor)
        finite = math.isfinite(out.loss) and math.isfinite(out.grad_norm)
        overflow = (self.scaler.enabled and not out.applied and math.isfinite(out.loss) and not finite
                    and not self.scaler.at_floor and injection is None)
        if not overflow and not finite:
            overflow_on = self.cfg.debug.overflow.enable
            located = self._locate_overflow(logger, ids, labels, scalars, injection) if overflow_on else None
            if self.cfg.debug.overflow.error_stop:
                raise OverflowStop(f"step {self.progress.step + 1}: loss {out.loss}, grad norm "
                                   f"{out.grad_norm}{'; ' + located if located else ''}. debug.overflow.error_stop is "
                                   "on: training stopped before this step's update; the newest checkpoint is the "
                                   "state to debug or resume from")
        elapsed = time.perf_counter() - t0
        self.progress.step += 1
        self.progress.adam_step += int(out.applied)
        self.position.consumed_samples += self.loader.global_batch
        tokens = self.loader.global_batch * sample_tokens(self.spec, self.cfg.train.seq_len)
        self.position.consumed_tokens += tokens
        self._counters_behind = False
        tokens_per_s = tokens / elapsed
        record = {
            "step": self.progress.step, "loss": out.loss, "lr": scalars.lr, "grad_norm": out.grad_norm,
            "applied": out.applied, "tokens": tokens, "valid_tokens": valid, "tokens_per_s": tokens_per_s,
            "step_time_s": elapsed, "data_time_s": t_data - t0,
            "model_tflops_per_s": flops_tok * tokens_per_s / 1e12,
            "consumed_samples": self.position.consumed_samples, "rss_mb": self._process.memory_info().rss / 2**20,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # the process's high-water mark
            **({"copy_fraction": float((labels == ids).mean())} if labels.shape == ids.shape else {}),  # ~1: unshifted
            "mfu": self.mfu(flops_tok, tokens_per_s),
            "loss_scale": loss_scale,  # the dynamic fp16 loss scale this step ran with (1.0 without fp16)
            **(self.backend.device_memory() or {}), **self.hardware.sample(),
        }
        logger.log(record)
        self.scaler.update(found_nonfinite=not math.isfinite(out.grad_norm))
        if overflow:
            logger.log({"step": self.progress.step, "event": "loss_scale_backoff", "scale": loss_scale,
                        "new_scale": self.scaler.scale})
        for event in ([] if overflow else self.health.observe(record)):
            logger.log(event.to_dict())
            self.console.print(f"[yellow]health: {event.message}[/]")
        if before is not None:
            self._log_detail(logger, before, out.grad_sq)
        if overflow:
            return out.loss
        verdict = self.anomaly.observe(out.loss, out.grad_norm, out.applied)
        if verdict.anomalous:
            self._handle_anomaly(verdict, out.applied, logger, scalars.lr)
        return out.loss

    def _locate_overflow(self, logger: MetricsLogger, ids: np.ndarray, labels: np.ndarray, scalars, injection) -> str:
        """Log (and print) where the step's first non-finite value appears; return that as one line."""
        step = self.progress.step + 1
        if not self.debugger.single_process:  # hooks run in one process: say how to replay the step instead
            message = (f"not located in a multi-process run: replay it in one process with "
                       f"`mindfoundry dump CONFIG --steps {step} --resume auto` and `mindfoundry locate`")
            logger.log({"step": step, "event": "overflow", "module": None, "message": message})
            self.console.print(f"[yellow]step {step}: non-finite; {message}[/]", highlight=False)
            return message
        found, path = self.debugger.locate(step, self.backend, ids, labels, scalars, injection)
        message = found.message() if found else "the re-run step was finite: the fault did not reproduce"
        logger.log({"step": step, "event": "overflow", "module": found.module if found else None,
                    "direction": found.direction if found else None, "tensor": found.record["name"] if found else None,
                    "message": message, "dump": str(path)})
        self.console.print(f"[yellow]step {step}: overflow located: {message} (dump: {path})[/]", highlight=False)
        return f"overflow located: {message} (dump: {path})"

    def _log_detail(self, logger: MetricsLogger, before: dict[str, np.ndarray], grad_sq: np.ndarray | None) -> None:
        after = self.backend.weights()
        record: dict[str, Any] = {"step": self.progress.step, "layer_weight_norm": layer_weight_norms(after),
                                  "layer_update_ratio": layer_update_ratios(before, after)}
        if grad_sq is not None:
            record["layer_grad_norm"] = layer_grad_norms(list(parameter_shapes(self.spec)), grad_sq)
        if isinstance(self.source, MixtureSampler):  # realized vs target shares over the last detail window
            window = self.loader.global_batch * self.cfg.monitor.detail_every
            record["mixture"] = self.source.realized(max(self.position.consumed_samples - window, 0), window)
        logger.log(record)

    def _handle_anomaly(self, verdict, applied: bool, logger: MetricsLogger, lr: float) -> None:
        step = self.progress.step
        action = "skipped" if not applied else "warned"
        if verdict.kind == "spike" and self.cfg.anomaly.policy == "rollback":
            action = self._rollback(logger)
        logger.log({"step": step, "event": "anomaly", "kind": verdict.kind, "reason": verdict.reason, "action": action})
        self.console.print(f"[yellow]step {step}: {verdict.kind} ({verdict.reason}); update {action}[/]")
        self.anomaly.check_consecutive(step, verdict, lr)

    def _rollback(self, logger: MetricsLogger) -> str:
        """Reload the newest valid checkpoint and skip the data from its position to here."""
        self.checkpoints.settle(logger)
        path, _, _ = self.checkpoints.resumable(None, None)
        if path is None:
            return "skipped (no checkpoint to roll back to)"
        window_end, consecutive = self.position.consumed_samples, self.anomaly.consecutive
        self._load(path)
        self.position.skipped_windows.append([self.position.consumed_samples, window_end])
        self.position.consumed_samples = window_end
        self.anomaly.consecutive = consecutive  # repeated rollbacks still count towards the stop
        return f"rolled back to {path.name}, skipping samples [{self.position.skipped_windows[-1][0]}, {window_end})"
