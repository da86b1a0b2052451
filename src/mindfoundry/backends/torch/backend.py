"""PyTorch engine behind :class:`mindfoundry.backends.base.Backend` — the mirror of the MindSpore one.

It is the numerical baseline for the MindSpore engine (same names, same init, same arithmetic) and
runs on CPU, CUDA and, through torch_npu, Ascend.

Under ``torchrun`` (or when ``cfg.parallel`` needs several processes) every rank builds the same
model, joins the process group, lays the ranks out as a device mesh and applies tensor
parallelism and FSDP2 (:mod:`.parallelize`). The interface stays the single-process one:

- ``weights``/``optimizer_state`` gather full arrays (collective: every rank calls them) and
  ``load_weights``/``load_optimizer_state`` take full arrays and keep each rank's part;
- ``train_step`` gets this rank's slice of the global batch (``dp_rank``/``dp_size``) and returns
  the global loss (local scaled losses summed over dp ranks) and the global gradient norm;
- ``eval_batch`` takes the same batch on every rank, splits its rows over the dp ranks when they
  divide it (else every rank computes all of it) and returns the summed result of the whole
  batch; ``logits``/``module_outputs`` compute the whole batch on every rank. All are collective.

With ``parallel.pp > 1`` each rank holds its pipeline stages only (:mod:`.pipeline_parallel`): ``self.model``
is those modules under the full model's names, the step runs the pipeline schedule, and the state
and evaluation calls gather across the pipeline ranks. With ``parallel.cp > 1`` each sequence is
split over the cp ranks for training and ``eval_batch`` (:mod:`.context_parallel`); ``logits`` and
``module_outputs`` compute whole sequences on every rank.
"""

from __future__ import annotations

import contextlib
import importlib.util
from pathlib import Path
from typing import Iterator, Mapping

import numpy as np
import torch
from torch.distributed.tensor import DTensor, Shard

from mindfoundry.backends.base import (
    BackendUnavailable,
    StepOutput,
    StepScalars,
    check_state_names,
    device_memory_record,
)
from mindfoundry.backends.torch import memory, probe_hooks
from mindfoundry.backends.torch.caption import Captioner
from mindfoundry.backends.torch.distributed import (
    all_reduce_sum,
    build_mesh,
    full_value,
    init_process_group,
    shard_like,
    wants_processes,
)
from mindfoundry.backends.torch.memory import apply_memory
from mindfoundry.backends.torch.model import Transformer, eval_sums
from mindfoundry.backends.torch.train_step import TrainStep, autocast_for, build_adamw
from mindfoundry.backends.torch.vision import MAE
from mindfoundry.config.parallel_config import Layout
from mindfoundry.config.schema import RunConfig
from mindfoundry.debug.probe import Probe
from mindfoundry.model.spec import AnySpec, CaptionSpec, frozen_names, module_boundaries, parameter_shapes
from mindfoundry.model.vision_spec import VisionSpec


def build_model(spec: AnySpec) -> Transformer | MAE | Captioner:
    """The module of the configured objective."""
    if isinstance(spec, VisionSpec):
        return MAE(spec)
    return Captioner(spec) if isinstance(spec, CaptionSpec) else Transformer(spec)


def select_device(requested: str) -> torch.device:
    """auto: CUDA, else Ascend NPU (torch_npu), else CPU; explicit names must be available."""
    wants_npu = requested in ("ascend", "npu")
    if wants_npu or (requested == "auto" and not torch.cuda.is_available() and importlib.util.find_spec("torch_npu")):
        try:
            importlib.import_module("torch_npu")
        except ImportError:
            raise BackendUnavailable(
                f"device={requested!r} needs torch_npu: install torch_npu for your CANN version"
            ) from None
        return torch.device("npu")
    if requested in ("gpu", "cuda") or (requested == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise BackendUnavailable(
                f"device={requested!r} but torch sees no CUDA device: use device: cpu or install a CUDA build of torch"
            )
        return torch.device("cuda")
    return torch.device("cpu")


class TorchBackend:
    """Owns the model, AdamW and the (optionally compiled) step."""

    name = "torch"
    shard_format = "torch.distributed.checkpoint"  # what save_sharded writes and load_sharded reads

    def __init__(self, cfg: RunConfig, spec: AnySpec, layout: Layout):
        torch.manual_seed(cfg.seed)
        self.device = select_device(cfg.device)
        self.layout = layout
        self.mesh = self.dp_mesh = None  # the world DeviceMesh and its flattened dp dims, with several processes
        if wants_processes(self.layout):
            init_process_group(self.device)  # pins the rank's accelerator before anything is allocated
            self.mesh, self.dp_mesh = build_mesh(self.layout, self.device.type)
        self.device_name = "cpu" if self.device.type == "cpu" else getattr(torch, self.device.type).get_device_name()
        self.spec = spec
        self.model = build_model(spec).to(self.device)
        apply_memory(self.model, cfg.memory)  # recompute flags and the loss chunk, before TP/FSDP wrap the blocks
        saved_tensors = memory.saved_tensors(cfg.memory, self.device)
        self.autocast = autocast_for(self.device, cfg.train.precision)
        self.pipeline = self.cp = None  # this rank's pipeline stages (pp > 1); the sequence split (cp > 1)
        if self.mesh is not None:  # before the optimizer: TP and FSDP2 replace the parameters (same names)
            from mindfoundry.backends.torch.parallelize import parallelize, refuse_unsupported

            if cfg.train.compile and (self.layout.pp > 1 or self.layout.cp > 1):
                raise NotImplementedError(
                    "train.compile with parallel.pp > 1 or cp > 1 is not supported in this version: "
                    "set train.compile: false"
                )
            if self.layout.pp > 1:
                from mindfoundry.backends.torch.pipeline_parallel import Pipeline

                refuse_unsupported(self.model, self.layout)
                self.pipeline = Pipeline(
                    self.model, self.mesh, self.layout, self.device, self.autocast, cfg.train.grad_accum
                )
                self.model = self.pipeline.module  # this rank's stages, under the full model's names
            else:
                parallelize(self.model, self.mesh, self.layout)
            if self.layout.cp > 1:
                from mindfoundry.backends.torch.context_parallel import ContextParallel

                self.cp = ContextParallel(self.model, self.mesh["cp"])
        self.params = dict(self.model.named_parameters())
        self.shapes = parameter_shapes(spec)
        got = {n: tuple(p.shape) for n, p in self.params.items()}
        partial = self.pipeline is not None  # a pipeline rank holds its stages' parameters only
        if any(self.shapes.get(n) != s for n, s in got.items()) if partial else got != self.shapes:
            raise RuntimeError(
                f"torch model parameters {sorted(self.params)} do not match the spec {sorted(self.shapes)}"
            )
        self.params = {
            n: self.params[n] for n in self.shapes if n in self.params
        }  # the canonical order, as in MindSpore
        for name in frozen_names(spec, cfg.train.freeze):  # train.freeze: no gradient, out of AdamW
            self.params[name].requires_grad_(False)
        self.optimizer = build_adamw(self.model, cfg.optim)
        self._steps_before = 0.0  # AdamW's update count when the current train_step began
        step_model = torch.compile(self.model) if cfg.train.compile else self.model
        clip = None if cfg.optim.clip_norm is None else float(cfg.optim.clip_norm)
        if self.pipeline is not None:
            from mindfoundry.backends.torch.pipeline_parallel import PipelineTrainStep

            self.step_fn = PipelineTrainStep(self.pipeline, self.optimizer, clip, saved_tensors)
        else:
            self.step_fn = TrainStep(self.model, step_model, self.optimizer, clip, self.autocast, saved_tensors)

    def _tensor(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(self.device)

    def _inputs(self, a: np.ndarray) -> torch.Tensor:
        """A batch's inputs or labels on the device: token ids and masks as int64, pixel values as float32."""
        return self._tensor(a.astype(np.float32 if a.dtype.kind == "f" else np.int64))

    @property
    def rank(self) -> int:
        """This process's rank (0 in one process)."""
        return 0 if self.mesh is None else torch.distributed.get_rank()

    @property
    def world_size(self) -> int:
        return 1 if self.mesh is None else torch.distributed.get_world_size()

    @property
    def dp_rank(self) -> int:
        """This rank's index among the data-parallel ranks (the slice of the global batch it trains on)."""
        return 0 if self.dp_mesh is None else self.dp_mesh.get_local_rank()

    @property
    def dp_size(self) -> int:
        """Data-parallel ranks the global batch is split over."""
        return 1 if self.dp_mesh is None else self.dp_mesh.size()

    def global_sum(self, value: float) -> float:
        """`value` summed over the data-parallel ranks (collective; unchanged in one process)."""
        if self.dp_size == 1:
            return value
        return float(all_reduce_sum(torch.tensor([value], dtype=torch.float64, device=self.device), self.dp_mesh))

    def any_rank(self, flag: bool) -> bool:
        if self.mesh is None:
            return flag
        value = torch.tensor([float(flag)], device=self.device)
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
        return bool(value.item())

    @property
    def holds_full_state(self) -> bool:
        """One process, or data-parallel replicas (no sharding, tensor, pipeline, context or expert split)."""
        lay = self.layout
        return self.mesh is None or (lay.dp_shard == lay.tp == lay.pp == lay.cp == lay.ep == 1)

    def _adam_steps(self) -> float:
        """AdamW's update count as its state holds it (this rank's first parameter; 0 before the first update).
        torch's AdamW increments it for every parameter before it changes any weight or moment."""
        first = next(p for group in self.optimizer.param_groups for p in group["params"])  # (a trained one)
        state = self.optimizer.state.get(first, {})
        return float(state["step"]) if "step" in state else 0.0

    @property
    def update_began(self) -> bool:
        return self._adam_steps() != self._steps_before

    # -- state -------------------------------------------------------------------------------
    def load_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        check_state_names(self.shapes, weights, "weights", self.shapes)
        with torch.no_grad():
            for name, p in self.params.items():
                p.copy_(shard_like(p, self._tensor(np.asarray(weights[name], dtype=np.float32))))

    def weights(self) -> dict[str, np.ndarray]:
        if self.pipeline is not None:
            return self.pipeline.weights()
        return {n: full_value(p.detach()).float().cpu().numpy().copy() for n, p in self.params.items()}

    def _moments(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(exp_avg.NAME / exp_avg_sq.NAME, tensor), zeros before the first update."""
        for name, p in self.params.items():
            st = self.optimizer.state.get(p, {})
            for key in ("exp_avg", "exp_avg_sq"):
                yield f"{key}.{name}", st[key] if key in st else torch.zeros_like(p)

    def optimizer_state(self) -> dict[str, np.ndarray]:
        if self.pipeline is not None:
            return self.pipeline.optimizer_state(self.optimizer)
        return {name: full_value(value).float().cpu().numpy().copy() for name, value in self._moments()}

    def load_optimizer_state(self, state: Mapping[str, np.ndarray], step: int) -> None:
        shapes = {f"{k}.{n}": shape for n, shape in self.shapes.items() for k in ("exp_avg", "exp_avg_sq")}
        check_state_names(shapes, state, "optimizer state", shapes)
        for name, p in self.params.items():
            if not p.requires_grad:  # frozen (train.freeze): its moments stay zero
                continue
            self.optimizer.state[p] = {
                "step": torch.tensor(float(step)),
                "exp_avg": shard_like(p, self._tensor(np.asarray(state[f"exp_avg.{name}"], np.float32))),
                "exp_avg_sq": shard_like(p, self._tensor(np.asarray(state[f"exp_avg_sq.{name}"], np.float32))),
            }

    def save_sharded(self, folders) -> None:
        """checkpoint.format: sharded: this rank's shards only (collective; rank 0 passes the folders)."""
        from mindfoundry.backends.torch import sharded_checkpoint

        sharded_checkpoint.save(self.model, self.params, self.optimizer, folders, self.shapes)

    def load_sharded(self, folders, adam_step: int) -> None:
        """A sharded checkpoint from any layout, resharded into this one (collective)."""
        from mindfoundry.backends.torch import sharded_checkpoint

        sharded_checkpoint.load(self.model, self.params, self.optimizer, folders, adam_step, self.shapes)

    # -- compute -----------------------------------------------------------------------------
    def train_step(
        self, input_ids: np.ndarray, labels: np.ndarray, scalars: StepScalars, probe: Probe | None = None
    ) -> StepOutput:
        self._steps_before = self._adam_steps()  # for update_began, should this step raise
        self.model.train()
        ids, labels_t = self._inputs(input_ids), self._inputs(labels)
        if self.mesh is not None:
            if probe is not None:
                raise NotImplementedError(
                    "debug dumps (probe steps) run in a single process: rerun the step without torchrun"
                )
            if self.cp is not None:  # this rank's chunks of every sequence; the loss summed over the cp ranks
                with self.cp.active(ids.shape[-1], self.device):
                    total = self.step_fn.accumulate(
                        self.cp.split(ids), self.cp.split(labels_t), scalars, self.step_fn.step_model
                    )
                all_reduce_sum(total, self.mesh["cp"])
            else:
                total = self.step_fn.accumulate(ids, labels_t, scalars, self.step_fn.step_model)
            all_reduce_sum(total, self.dp_mesh)  # the global loss, so every rank takes the same update decision
            loss, norm, applied, grad_sq = self.step_fn.update(total, scalars)
            grad_sq = full_value(grad_sq)
        elif probe is None:
            loss, norm, applied, grad_sq = self.step_fn(ids, labels_t, scalars)
        else:  # a debug step: eager model (never the compiled one), hooks on, state streamed to the dump
            with probe_hooks.installed(self.model, probe), memory.suspended(self.model):
                probe.state("params", self.params.items(), probe_hooks.to_numpy)
                total = self.step_fn.accumulate(ids, labels_t, scalars, self.model, probe)
            # the trained parameters' (MindSpore's gradients); one the loss does not reach has zeros there too
            probe.state("grads", ((n, torch.zeros_like(p) if p.grad is None else p.grad)
                                  for n, p in self.params.items() if p.requires_grad), probe_hooks.to_numpy)
            loss, norm, applied, grad_sq = self.step_fn.update(total, scalars)
            probe.state("optimizer", self._moments(), probe_hooks.to_numpy)
        return StepOutput(loss=loss, grad_norm=norm, applied=applied, grad_sq=grad_sq.detach().cpu().numpy())

    @torch.no_grad()
    def eval_batch(self, input_ids: np.ndarray, labels: np.ndarray) -> tuple[float, int, int]:
        self.model.eval()
        split = self.dp_size > 1 and len(input_ids) % self.dp_size == 0
        if split:  # this dp rank's rows; the sums are added up below
            rows = slice(
                self.dp_rank * len(input_ids) // self.dp_size, (self.dp_rank + 1) * len(input_ids) // self.dp_size
            )
            input_ids, labels = input_ids[rows], labels[rows]
        ids_t, labels_t = self._inputs(input_ids), self._inputs(labels)
        if isinstance(self.model, MAE):  # the error over the masked patches and their number
            with self.autocast():
                error, count = self.model(ids_t, labels_t)
            total = torch.stack([error.double(), count.double(), torch.zeros((), dtype=torch.float64)])
            if split:
                all_reduce_sum(total, self.dp_mesh)
            return float(total[0]), int(total[1]), 0
        if isinstance(self.model, Captioner):
            with self.autocast():
                total = eval_sums(self.model(ids_t, labels_t, logits=True).float(), labels_t)
            if split:
                all_reduce_sum(total, self.dp_mesh)
            return float(total[0]), int(total[1]), int(total[2])
        cp = self.cp is not None and self.cp.fits(ids_t.shape[-1])  # else whole sequences on every cp rank
        if self.pipeline is not None:  # summed over the pipeline ranks
            total = self.pipeline.eval_sums(ids_t, labels_t)
        else:
            with self.cp.active(ids_t.shape[-1], self.device) if cp else contextlib.nullcontext(), self.autocast():
                logits = full_value(self.model(self.cp.split(ids_t) if cp else ids_t))
            total = eval_sums(logits, self.cp.split(labels_t) if cp else labels_t)
            if cp:
                all_reduce_sum(total, self.mesh["cp"])
        if split:
            all_reduce_sum(total, self.dp_mesh)
        return float(total[0]), int(total[1]), int(total[2])

    @torch.no_grad()
    def caption_logits(self, pixels: np.ndarray, labels: np.ndarray) -> np.ndarray:
        self.model.eval()
        with self.autocast():
            return self.model(self._inputs(pixels), self._inputs(labels), logits=True).float().cpu().numpy()

    @torch.no_grad()
    def image_features(self, pixels: np.ndarray) -> np.ndarray:
        self.model.eval()
        with self.autocast():
            return self.model(self._inputs(pixels)).float().cpu().numpy()

    @torch.no_grad()
    def logits(self, input_ids: np.ndarray) -> np.ndarray:
        self.model.eval()
        if self.pipeline is not None:
            return self.pipeline.logits(self._tensor(input_ids.astype(np.int64))).cpu().numpy()
        with self.autocast():
            return self.model(self._tensor(input_ids.astype(np.int64))).float().cpu().numpy()

    def new_cache(self, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if self.mesh is not None:
            raise BackendUnavailable("cached decoding runs in one process: generate from a single-process backend")
        return self.model.new_cache(length)

    @torch.no_grad()
    def decode(self, ids: np.ndarray, start: int, cache) -> np.ndarray:
        self.model.eval()
        positions = torch.arange(start, start + len(ids), device=self.device)
        with self.autocast():
            return (
                self.model.decode(self._tensor(np.asarray(ids, np.int64)[None]), positions, cache)[0]
                .float()
                .cpu()
                .numpy()
            )

    @property
    def device_kind(self) -> str:
        return self.device.type

    def start_profile(self, folder: Path) -> None:
        from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        self._profiler = profile(
            activities=activities, on_trace_ready=tensorboard_trace_handler(str(folder), worker_name=f"rank{self.rank}")
        )
        self._profiler.start()

    def stop_profile(self) -> None:
        self._profiler.stop()  # on_trace_ready writes RANK.TIME.pt.trace.json
        self._profiler = None

    def device_memory(self) -> dict[str, float] | None:
        if self.device.type == "cpu":
            return None
        module = getattr(torch, self.device.type)  # torch.cuda, or torch.npu with torch_npu
        return device_memory_record(module.memory_allocated(), module.memory_reserved(), module.max_memory_allocated())

    @torch.no_grad()
    def module_outputs(self, input_ids: np.ndarray) -> dict[str, np.ndarray]:
        """Outputs of the module boundaries (embed, each block, final norm) via forward hooks."""
        if self.pipeline is not None:
            self.model.eval()
            return self.pipeline.module_outputs(self._tensor(input_ids.astype(np.int64)))
        captured: dict[str, np.ndarray] = {}
        modules = dict(self.model.named_modules())
        handles = [
            modules[name].register_forward_hook(
                lambda _m, _i, out, name=name: captured.__setitem__(name, self._whole(out))
            )
            for name in module_boundaries(self.spec)
        ]
        try:
            self.logits(input_ids)
        finally:
            for h in handles:
                h.remove()
        return captured

    def _whole(self, out: torch.Tensor) -> np.ndarray:
        """A module output as a full array; under sequence parallelism plain outputs are this rank's sequence slice."""
        if (
            self.mesh is not None
            and self.layout.tp > 1
            and self.layout.sequence_parallel
            and not isinstance(out, DTensor)
        ):
            out = DTensor.from_local(out, self.mesh["tp"], [Shard(1)], run_check=False)
        return full_value(out).float().cpu().numpy()


def check_device(device: str) -> None:
    """Refuse a device this install cannot reach, in one line (:func:`select_device`)."""
    select_device(device)


def create(cfg: RunConfig, spec: AnySpec, layout: Layout) -> TorchBackend:
    return TorchBackend(cfg, spec, layout)
