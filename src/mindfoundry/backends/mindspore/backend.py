"""MindSpore engine behind :class:`mindfoundry.backends.base.Backend`.

Training runs as one GRAPH_MODE (compiled) step per optimizer update; evaluation and logits use a
separately compiled forward. All state crosses the boundary as numpy arrays under the shared names.

Under ``msrun`` with a data-parallel layout (``parallel.dp_replicate: N``; :mod:`.distributed`) every
rank holds the whole model and optimizer state, trains on its slice of the global batch
(``dp_rank``/``dp_size``) and the compiled step sums gradients and losses over the ranks;
``weights``/``optimizer_state`` are the (identical) local arrays, ``eval_batch`` splits the batch's
rows over the ranks when they divide it, and ``logits``/``module_outputs`` compute the whole batch on
every rank. Layouts that split the model or its state run in MindSpore's semi-auto parallel mode on
Ascend/GPU (:mod:`.semi_auto`: written, not run here) and are refused on CPU (:func:`.distributed.refusal`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import mindspore as ms
import mindspore.device_context as device_context
import numpy as np
from mindspore import Tensor, nn, ops

from mindfoundry.backends.base import (
    BackendUnavailable,
    StepOutput,
    StepScalars,
    check_state_names,
    device_memory_record,
)
from mindfoundry.backends.mindspore import distributed, memory, probe_hooks, semi_auto
from mindfoundry.backends.mindspore.caption import Captioner, CaptionForward, CaptionLossCell
from mindfoundry.backends.mindspore.model import CachedDecode, LossCell, Transformer, eval_sums
from mindfoundry.backends.mindspore.train_step import AccumulatingStep, AdamW, TrainStep, scalar
from mindfoundry.backends.mindspore.vision import MAE, MAELossCell
from mindfoundry.config.parallel_config import Layout
from mindfoundry.config.schema import RunConfig
from mindfoundry.debug.probe import Probe
from mindfoundry.model.spec import AnySpec, CaptionSpec, frozen_names, module_boundaries, parameter_shapes
from mindfoundry.model.vision_spec import VisionSpec

_DEVICE_TARGETS = {"cpu": "CPU", "ascend": "Ascend", "npu": "Ascend", "gpu": "GPU", "cuda": "GPU"}


def check_device(device: str) -> None:
    """Refuse a device this install cannot reach, in one line: MindSpore itself accepts the name and fails in C++ at
    the first tensor."""
    if device != "auto":
        target = _DEVICE_TARGETS[device]
        if not getattr(device_context, target.lower()).is_available():
            raise BackendUnavailable(
                f"device={device!r}: this MindSpore install cannot reach a {target} device (its plugin, driver or "
                f"the device itself is missing): use device: cpu (or auto), or run on a machine with MindSpore's "
                f"{target} build and drivers")


def configure_context(device: str) -> None:
    """GRAPH_MODE on the requested device ('auto' = whatever MindSpore picks)."""
    check_device(device)
    ms.set_context(mode=ms.GRAPH_MODE)
    if device != "auto":
        ms.set_device(_DEVICE_TARGETS[device])


class _Forward(nn.Cell):
    def __init__(self, model: Transformer):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, ids, labels):
        return eval_sums(self.model(ids), labels)


class _ImageForward(nn.Cell):
    """An image model's evaluation sums: its summed error, the masked patches, and no top-1 count."""

    def __init__(self, model: MAE):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, pixels, labels):
        error, count = self.model(pixels, labels)
        return error, count, ops.zeros((), error.dtype)


class _CaptionLogits(nn.Cell):
    def __init__(self, model: Captioner):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, pixels, labels):
        return self.model.caption_logits(pixels, labels)


def _feed(a: np.ndarray) -> Tensor:
    """A batch's inputs or labels as a Tensor: token ids and masks as int32, pixel values as float32."""
    return Tensor(a.astype(np.float32 if a.dtype.kind == "f" else np.int32))


class MindSporeBackend:
    """Owns the model, AdamW state and compiled steps."""

    name = "mindspore"
    # the compiled step updates in place and raises nothing that says how far it got: a step that raised may be torn
    update_began = True

    def __init__(self, cfg: RunConfig, spec: AnySpec, layout: Layout):
        configure_context(cfg.device)
        # first, before any Tensor: refuses what it cannot run and, under msrun, joins the cluster (msrun's scheduler
        # exits there)
        self.placement = distributed.setup(cfg, layout, ms.get_context("device_target"))
        p = self.placement
        self.rank, self.world_size, self.dp_rank, self.dp_size = p.rank, p.world_size, p.dp_rank, p.dp_size
        # MindSpore reports only the target kind; Ascend training hardware is the 910B family
        self.device_name = {"CPU": "cpu", "Ascend": "Ascend910B"}.get(
            ms.get_context("device_target"), ms.get_context("device_target")
        )
        self.device_kind = {"CPU": "cpu", "Ascend": "npu", "GPU": "cuda"}[ms.get_context("device_target")]
        self.spec = spec
        self.precision = cfg.train.precision
        # fp16/bf16: matmuls in that dtype inside the Cells, fp32 parameters; FlashAttentionScore where
        # train.flash_attention says
        self.image = isinstance(spec, VisionSpec)
        if isinstance(spec, CaptionSpec):
            self.model = Captioner(spec, cfg.train.precision)
        else:
            self.model = MAE(spec) if self.image else Transformer(
                spec, cfg.train.precision, cfg.train.uses_flash_attention(cfg.backend, cfg.device))
        self.params = {p.name: p for p in self.model.get_parameters()}
        expected = parameter_shapes(spec)
        if {n: tuple(p.shape) for n, p in self.params.items()} != expected:
            raise RuntimeError(
                f"MindSpore model parameters {sorted(self.params)} do not match the spec {sorted(expected)}"
            )
        self.order = list(expected)  # the canonical parameter order
        frozen = frozen_names(spec, cfg.train.freeze)  # train.freeze: out of AdamW and the gradients
        self.trained = [n for n in self.order if n not in frozen]  # the optimizer's and the gradients' order
        self._trained_at = np.array([self.order.index(n) for n in self.trained])
        ordered = [self.params[n] for n in self.trained]
        o = cfg.optim
        self.clip = None if o.clip_norm is None else float(o.clip_norm)
        self.optimizer = AdamW(ordered, o.beta1, o.beta2, o.eps, o.weight_decay)
        loss_cell = self._loss_cell(cfg.memory.loss_chunk, cfg.train.seq_len)
        memory.apply_memory(self.model, loss_cell, cfg.memory)  # recompute marks, before anything compiles
        accum, reducer = cfg.train.grad_accum, None
        self.holds_full_state = p.plan is None  # semi-auto: each rank's Parameters hold its slices once compiled
        if p.plan is not None:  # Ascend/GPU only (refused on CPU): strategies, pipeline wrapper
            loss_cell, accum = semi_auto.wrap_loss(p.plan, self.model, loss_cell)
            reducer = semi_auto.grad_reducer(p.plan, ordered)
        self.strategy_dir = semi_auto.strategy_dir(cfg)  # where the compiler writes each rank's layouts (semi-auto)
        step = TrainStep(loss_cell, self.optimizer, accum, self.clip, p.data_parallel, reducer)
        # several micro-batches: looped on the host, so the compiled graphs do not grow with grad_accum (semi-auto
        # layouts keep the in-graph loop: their gradients are the compiler's slices, not run here)
        self.step_cell = AccumulatingStep(step) if accum > 1 and p.plan is None else step
        self._eager_step: TrainStep | None = None  # the debug (hooked, PYNATIVE) step, built on first use
        # in GRAPH_MODE, calling a Cell compiles it once per input shape
        self.forward = self._forward_cell()
        self._decode: CachedDecode | None = None  # cached generation, compiled once per number of new tokens
        self._caption: _CaptionLogits | None = None  # a captioner's logits, built on first use

    def _loss_cell(self, loss_chunk: int = 0, seq_len: int = 0) -> nn.Cell:
        """The objective's training loss Cell (ids or pixels, labels, scale) -> scaled summed loss."""
        if isinstance(self.model, Captioner):
            return CaptionLossCell(self.model)
        return MAELossCell(self.model) if self.image else LossCell(self.model, loss_chunk, seq_len)

    def _forward_cell(self) -> nn.Cell:
        """The objective's evaluation Cell (ids or pixels, labels) -> (summed loss, scored, top-1 hits)."""
        if isinstance(self.model, Captioner):
            return CaptionForward(self.model)
        return (_ImageForward if self.image else _Forward)(self.model)

    # -- state -------------------------------------------------------------------------------
    def global_sum(self, value: float) -> float:
        """`value` summed over the data-parallel ranks (collective; exact for counts); the value itself in one process.
        """
        if self.dp_size == 1:
            return value
        return distributed.all_reduce_sum([value])[0]

    def any_rank(self, flag: bool) -> bool:
        return distributed.all_reduce_sum([float(flag)])[0] > 0 if self.world_size > 1 else flag

    def load_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Full arrays; under semi-auto set before the step first compiles, which keeps each rank's slice of them."""
        _assign(self.params, weights, "weights")

    def weights(self) -> dict[str, np.ndarray]:
        return {n: p.asnumpy().copy() for n, p in self.params.items()}

    def optimizer_state(self) -> dict[str, np.ndarray]:
        """Every parameter's moments: a frozen one's (train.freeze) zeros, as torch.optim.AdamW reports them."""
        moments = list(self.optimizer.exp_avg) + list(self.optimizer.exp_avg_sq)
        out = {p.name: p.asnumpy().copy() for p in moments}
        return {f"{k}.{n}": out.get(f"{k}.{n}", np.zeros(self.params[n].shape, np.float32))
                for n in self.order for k in ("exp_avg", "exp_avg_sq")}

    def load_optimizer_state(self, state: Mapping[str, np.ndarray], step: int) -> None:
        """`step` is unused: the bias corrections arrive from the host with every step. A frozen parameter's moments
        (zeros) are not held."""
        moments = {p.name: p for p in list(self.optimizer.exp_avg) + list(self.optimizer.exp_avg_sq)}
        shapes = {f"{k}.{n}": tuple(self.params[n].shape) for n in self.order for k in ("exp_avg", "exp_avg_sq")}
        check_state_names(shapes, state, "optimizer state", shapes)
        _assign(moments, {name: state[name] for name in moments}, "optimizer state")

    def save_sharded(self, folders: tuple[Path, Path] | None) -> None:
        """checkpoint.format: sharded (semi-auto layouts): this rank's slices and, from rank 0, the strategy file
        (collective: rank 0 passes the checkpoint's folders, the others None). Reading goes through the full arrays
        (:meth:`load_weights` before the first compile), so there is no load_sharded."""
        plan = self.placement.plan
        if plan is None:
            raise ValueError("checkpoint.format: sharded is the form of semi-auto layouts in the MindSpore engine")
        text = distributed.broadcast_text(None if folders is None else "\n".join(map(str, folders)))
        moments = {p.name: p for p in list(self.optimizer.exp_avg) + list(self.optimizer.exp_avg_sq)}
        semi_auto.save_rank_slices(tuple(Path(f) for f in text.split("\n")), self.params, moments, self.rank,
                                   self.strategy_dir, plan.layout.pp)
        distributed.all_reduce_sum([0.0])  # a barrier: every rank's files are written when rank 0 commits

    # -- compute -----------------------------------------------------------------------------
    def train_step(
        self, input_ids: np.ndarray, labels: np.ndarray, scalars: StepScalars, probe: Probe | None = None
    ) -> StepOutput:
        if self.placement.plan is not None:  # a pipeline takes every micro-batch at once
            input_ids, labels = (semi_auto.step_batch(self.placement.plan, a) for a in (input_ids, labels))
        args = (_feed(input_ids), _feed(labels), scalar(scalars.loss_scale))
        limits = (scalar(scalars.lr), scalar(scalars.step_size), scalar(scalars.bias_correction2_sqrt),
                  scalar(scalars.loss_limit), scalar(scalars.grad_limit), scalar(scalars.grad_unscale))
        if probe is None:
            loss, norm, applied, grad_sq = self.step_cell(*args, *limits)
        elif self.placement.data_parallel:
            raise NotImplementedError("debug dumps (probe steps) run in a single process: rerun the step without msrun")
        else:
            loss, norm, applied, grad_sq = self._debug_step(args, limits, probe)
        return StepOutput(loss=float(loss.asnumpy()), grad_norm=float(norm.asnumpy()), applied=bool(applied.asnumpy()),
                          grad_sq=self._every_parameter(grad_sq.asnumpy()))

    def _every_parameter(self, values: np.ndarray) -> np.ndarray:
        """Per-trained-parameter values in the canonical order of every parameter, 0 for a frozen one."""
        if len(self.trained) == len(self.order):
            return values
        out = np.zeros(len(self.order), values.dtype)
        out[self._trained_at] = values
        return out

    def _debug_step(self, args: tuple, limits: tuple, probe: Probe) -> tuple:
        """The same step run eagerly (PYNATIVE) with Cell hooks, streaming state to the probe.

        Same Cells and arithmetic as the compiled step; only the execution mode differs, so the
        dumped numbers are the ones the compiled step computes up to kernel-level rounding.
        """
        ms.set_context(mode=ms.PYNATIVE_MODE)
        try:
            if self._eager_step is None:  # built in PYNATIVE: a grad function made under GRAPH_MODE stays compiled
                self._eager_step = TrainStep(self._loss_cell(), self.optimizer, self.step_cell.accum, self.clip)
            step = self._eager_step
            with memory.suspended(self.model), probe_hooks.installed(self.model, step.loss_cell, probe):
                probe.state("params", ((n, self.params[n]) for n in self.order), probe_hooks.to_numpy)
                loss, grads = step.accumulate(*args)
            probe.state("grads", zip(self.trained, grads), probe_hooks.to_numpy)
            out = step.update(loss, grads, *limits)
            moments = zip(
                self.optimizer.exp_avg, self.optimizer.exp_avg_sq
            )  # interleaved per parameter, as torch's state
            probe.state("optimizer", ((m.name, m) for pair in moments for m in pair), probe_hooks.to_numpy)
        finally:
            ms.set_context(mode=ms.GRAPH_MODE)
        return out

    def eval_batch(self, input_ids: np.ndarray, labels: np.ndarray) -> tuple[float, int, int]:
        """Under data parallelism (collective) each rank scores its share of the rows when dp_size divides them."""
        split = self.dp_size > 1 and len(input_ids) % self.dp_size == 0
        if split:
            share = len(input_ids) // self.dp_size
            input_ids, labels = (a[self.dp_rank * share:(self.dp_rank + 1) * share] for a in (input_ids, labels))
        sums = [
            float(t.asnumpy())
            for t in self.forward(_feed(input_ids), _feed(labels))
        ]
        if split:
            sums = distributed.all_reduce_sum(sums)
        nll, count, correct = sums
        return nll, int(round(count)), int(round(correct))

    def caption_logits(self, pixels: np.ndarray, labels: np.ndarray) -> np.ndarray:
        if self._caption is None:  # compiled once per batch shape
            self._caption = _CaptionLogits(self.model)
        return self._caption(_feed(pixels), _feed(labels)).asnumpy()

    def image_features(self, pixels: np.ndarray) -> np.ndarray:
        every = np.tile(np.arange(self.spec.num_patches, dtype=np.int32), (len(pixels), 1))  # no patch hidden
        return self.model.vision(_feed(pixels), Tensor(every))[:, 1:].mean(axis=1).asnumpy()

    def logits(self, input_ids: np.ndarray) -> np.ndarray:
        return self.model(Tensor(input_ids.astype(np.int32))).asnumpy()

    def new_cache(self, length: int) -> dict:
        """Zero key/value caches of `length` positions (one sequence); the decode Cell is built on first use."""
        if self.placement.world_size > 1:
            raise BackendUnavailable("cached decoding runs in one process: generate from a single-process backend")
        if self._decode is None:
            self._decode = CachedDecode(self.model)
        shape = (1, self.spec.n_kv_heads, length, self.spec.head_dim)
        zeros = tuple(Tensor(np.zeros(shape, np.float32)) for _ in range(self.spec.n_layers))
        return {"k": zeros, "v": zeros, "length": length}

    def decode(self, ids: np.ndarray, start: int, cache: dict) -> np.ndarray:
        positions = np.arange(start, start + len(ids))
        slots = np.arange(cache["length"])
        write = (slots[None] == positions[:, None]).astype(np.float32)  # (T, L) one-hot: where each new token goes
        mask = np.where(slots[None] <= positions[:, None], 0.0, -1e9).astype(np.float32)  # causal over the cache
        # the caches as mutable inputs: a tuple of Tensors would otherwise be a constant, recompiled at every step
        logits, cache["k"], cache["v"] = self._decode(
            Tensor(np.asarray(ids, np.int32)[None]),
            Tensor(positions.astype(np.int32)),
            Tensor(write),
            Tensor(mask),
            ms.mutable(cache["k"]),
            ms.mutable(cache["v"]),
        )
        return logits.asnumpy()[0]

    def start_profile(self, folder: Path) -> None:
        from mindspore.profiler import ProfilerActivity, profile, tensorboard_trace_handler

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.NPU] if self.device_kind == "npu" else [])
        self._profiler = profile(
            activities=activities, start_profile=False, on_trace_ready=tensorboard_trace_handler(dir_name=str(folder))
        )
        self._profiler.start()

    def stop_profile(self) -> None:
        # parses into FOLDER/*_ascend_ms/ (ASCEND_PROFILER_OUTPUT/trace_view.json, FRAMEWORK/*.csv)
        self._profiler.stop()
        self._profiler = None

    def device_memory(self) -> dict[str, float] | None:
        if self.device_kind == "cpu":  # ms.runtime's counters report 0 on CPU
            return None
        runtime = ms.runtime
        return device_memory_record(
            runtime.memory_allocated(), runtime.memory_reserved(), runtime.max_memory_allocated()
        )

    def module_outputs(self, input_ids: np.ndarray) -> dict[str, np.ndarray]:
        """Outputs of the module boundaries via Cell forward hooks, in a PYNATIVE debug pass.

        Hooks' Python side effects do not run inside GRAPH_MODE, so this switches to PYNATIVE for
        one forward pass and back; the compiled steps are unaffected.
        """
        cells = dict(self.model.cells_and_names())
        captured: dict[str, np.ndarray] = {}
        ms.set_context(mode=ms.PYNATIVE_MODE)
        handles = [
            cells[name].register_forward_hook(lambda _c, _i, out, name=name: captured.__setitem__(name, out.asnumpy()))
            for name in module_boundaries(self.spec)
        ]
        try:
            self.model(Tensor(input_ids.astype(np.int32)))
        finally:
            for h in handles:
                h.remove()
            ms.set_context(mode=ms.GRAPH_MODE)
        return captured


def _assign(targets: Mapping[str, ms.Parameter], values: Mapping[str, np.ndarray], what: str) -> None:
    """Copy arrays into parameters after checking names and shapes."""
    check_state_names(targets, values, what, {n: tuple(p.shape) for n, p in targets.items()})
    for name, param in targets.items():
        param.set_data(Tensor(np.asarray(values[name], dtype=np.float32)))


def create(cfg: RunConfig, spec: AnySpec, layout: Layout) -> MindSporeBackend:
    return MindSporeBackend(cfg, spec, layout)
