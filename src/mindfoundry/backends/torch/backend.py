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
"""

from __future__ import annotations

import importlib.util
from typing import Iterator, Mapping

import numpy as np
import torch
from torch.distributed.tensor import DTensor, Shard

from mindfoundry.backends.base import BackendUnavailable, StepOutput, StepScalars, check_state_names
from mindfoundry.backends.torch import probe_hooks
from mindfoundry.backends.torch.distributed import (
    Layout, all_reduce_sum, build_mesh, full_value, init_process_group, shard_like, wants_processes,
)
from mindfoundry.backends.torch.model import Transformer, token_nll
from mindfoundry.backends.torch.train_step import TrainStep, autocast_for, build_adamw
from mindfoundry.config.schema import RunConfig
from mindfoundry.debug.probe import Probe
from mindfoundry.model.spec import ModelSpec, module_boundaries, parameter_shapes


def select_device(requested: str) -> torch.device:
    """auto: CUDA, else Ascend NPU (torch_npu), else CPU; explicit names must be available."""
    wants_npu = requested in ("ascend", "npu")
    if wants_npu or (requested == "auto" and not torch.cuda.is_available() and importlib.util.find_spec("torch_npu")):
        try:
            importlib.import_module("torch_npu")
        except ImportError:
            raise BackendUnavailable(f"device={requested!r} needs torch_npu: install torch_npu for your CANN version") from None
        return torch.device("npu")
    if requested in ("gpu", "cuda") or (requested == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise BackendUnavailable(f"device={requested!r} but torch sees no CUDA device: use device: cpu or install a CUDA build of torch")
        return torch.device("cuda")
    return torch.device("cpu")


class TorchBackend:
    """Owns the model, AdamW and the (optionally compiled) step."""

    name = "torch"

    def __init__(self, cfg: RunConfig, spec: ModelSpec):
        torch.manual_seed(cfg.seed)
        self.device = select_device(cfg.device)
        self.layout = Layout.from_config(cfg.parallel)
        self.mesh = self.dp_mesh = None  # the world DeviceMesh and its flattened dp dims, with several processes
        if wants_processes(self.layout):
            init_process_group(self.device)  # pins the rank's accelerator before anything is allocated
            self.mesh, self.dp_mesh = build_mesh(self.layout, self.device.type)
        self.device_name = "cpu" if self.device.type == "cpu" else getattr(torch, self.device.type).get_device_name()
        self.spec = spec
        self.model = Transformer(spec).to(self.device)
        if self.mesh is not None:  # before the optimizer: TP and FSDP2 replace the parameters (same names)
            from mindfoundry.backends.torch.parallelize import parallelize

            parallelize(self.model, self.mesh, self.layout, cfg.train.seq_len)
        self.params = dict(self.model.named_parameters())
        expected = parameter_shapes(spec)
        if {n: tuple(p.shape) for n, p in self.params.items()} != expected:
            raise RuntimeError(f"torch model parameters {sorted(self.params)} do not match the spec {sorted(expected)}")
        self.params = {n: self.params[n] for n in expected}  # the canonical order, as in the MindSpore engine
        self.optimizer = build_adamw(self.model, cfg.optim)
        step_model = torch.compile(self.model) if cfg.train.compile else self.model
        clip = None if cfg.optim.clip_norm is None else float(cfg.optim.clip_norm)
        self.autocast = autocast_for(self.device, cfg.train.precision)
        self.step_fn = TrainStep(self.model, step_model, self.optimizer, clip, self.autocast)

    def _tensor(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(self.device)

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

    # -- state -------------------------------------------------------------------------------
    def load_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        check_state_names(self.params, weights, "weights", {n: tuple(p.shape) for n, p in self.params.items()})
        with torch.no_grad():
            for name, p in self.params.items():
                p.copy_(shard_like(p, self._tensor(np.asarray(weights[name], dtype=np.float32))))

    def weights(self) -> dict[str, np.ndarray]:
        return {n: full_value(p.detach()).float().cpu().numpy().copy() for n, p in self.params.items()}

    def _moments(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(exp_avg.NAME / exp_avg_sq.NAME, tensor), zeros before the first update."""
        for name, p in self.params.items():
            st = self.optimizer.state.get(p, {})
            for key in ("exp_avg", "exp_avg_sq"):
                yield f"{key}.{name}", st[key] if key in st else torch.zeros_like(p)

    def optimizer_state(self) -> dict[str, np.ndarray]:
        return {name: full_value(value).float().cpu().numpy().copy() for name, value in self._moments()}

    def load_optimizer_state(self, state: Mapping[str, np.ndarray], step: int) -> None:
        shapes = {f"{k}.{n}": tuple(p.shape) for n, p in self.params.items() for k in ("exp_avg", "exp_avg_sq")}
        check_state_names(shapes, state, "optimizer state", shapes)
        for name, p in self.params.items():
            self.optimizer.state[p] = {
                "step": torch.tensor(float(step)),
                "exp_avg": shard_like(p, self._tensor(np.asarray(state[f"exp_avg.{name}"], np.float32))),
                "exp_avg_sq": shard_like(p, self._tensor(np.asarray(state[f"exp_avg_sq.{name}"], np.float32))),
            }

    # -- compute -----------------------------------------------------------------------------
    def train_step(self, input_ids: np.ndarray, labels: np.ndarray, scalars: StepScalars, probe: Probe | None = None) -> StepOutput:
        self.model.train()
        ids, labels_t = self._tensor(input_ids.astype(np.int64)), self._tensor(labels.astype(np.int64))
        if self.mesh is not None:
            if probe is not None:
                raise NotImplementedError("debug dumps (probe steps) run in a single process: rerun the step without torchrun")
            total = self.step_fn.accumulate(ids, labels_t, scalars, self.step_fn.step_model)
            all_reduce_sum(total, self.dp_mesh)  # the global loss, so every rank takes the same update decision
            loss, norm, applied, grad_sq = self.step_fn.update(total, scalars)
            grad_sq = full_value(grad_sq)
        elif probe is None:
            loss, norm, applied, grad_sq = self.step_fn(ids, labels_t, scalars)
        else:  # a debug step: eager model (never the compiled one), hooks on, state streamed to the dump
            with probe_hooks.installed(self.model, probe):
                probe.state("params", self.params.items(), probe_hooks.to_numpy)
                total = self.step_fn.accumulate(ids, labels_t, scalars, self.model, probe)
            probe.state("grads", ((n, p.grad) for n, p in self.params.items()), probe_hooks.to_numpy)
            loss, norm, applied, grad_sq = self.step_fn.update(total, scalars)
            probe.state("optimizer", self._moments(), probe_hooks.to_numpy)
        return StepOutput(loss=loss, grad_norm=norm, applied=applied, grad_sq=grad_sq.detach().cpu().numpy())

    @torch.no_grad()
    def eval_batch(self, input_ids: np.ndarray, labels: np.ndarray) -> tuple[float, int]:
        self.model.eval()
        split = self.dp_size > 1 and len(input_ids) % self.dp_size == 0
        if split:  # this dp rank's rows; the sums are added up below
            rows = slice(self.dp_rank * len(input_ids) // self.dp_size, (self.dp_rank + 1) * len(input_ids) // self.dp_size)
            input_ids, labels = input_ids[rows], labels[rows]
        with self.autocast():
            logits = self.model(self._tensor(input_ids.astype(np.int64)))
        nll, count = token_nll(logits, self._tensor(labels.astype(np.int64)))
        if split:
            total = all_reduce_sum(torch.stack([nll.double(), count.double()]), self.dp_mesh)
            return float(total[0]), int(total[1])
        return float(nll), int(count)

    @torch.no_grad()
    def logits(self, input_ids: np.ndarray) -> np.ndarray:
        self.model.eval()
        with self.autocast():
            return self.model(self._tensor(input_ids.astype(np.int64))).float().cpu().numpy()

    def device_memory_mb(self) -> float | None:
        if self.device.type == "cpu":
            return None
        return getattr(torch, self.device.type).max_memory_allocated() / 2**20

    @torch.no_grad()
    def module_outputs(self, input_ids: np.ndarray) -> dict[str, np.ndarray]:
        """Outputs of the module boundaries (embed, each block, final norm) via forward hooks."""
        captured: dict[str, np.ndarray] = {}
        modules = dict(self.model.named_modules())
        handles = [
            modules[name].register_forward_hook(lambda _m, _i, out, name=name: captured.__setitem__(name, self._whole(out)))
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
        if self.mesh is not None and self.layout.tp > 1 and self.layout.sequence_parallel and not isinstance(out, DTensor):
            out = DTensor.from_local(out, self.mesh["tp"], [Shard(1)], run_check=False)
        return full_value(out).float().cpu().numpy()


def create(cfg: RunConfig, spec: ModelSpec) -> TorchBackend:
    return TorchBackend(cfg, spec)
