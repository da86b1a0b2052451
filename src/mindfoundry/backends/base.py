"""The narrow interface every training engine implements.

The trainer, evaluator and generator only talk to a backend through numpy arrays and plain
floats, so everything around the engine (data order, LR schedule, checkpoints, metrics) is shared.
Weights cross this boundary as ``{name: float32 array}`` under the names of
:func:`mindfoundry.model.spec.parameter_shapes`; optimizer moments as ``exp_avg.NAME`` and
``exp_avg_sq.NAME`` (torch.optim.AdamW's state names).
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping, Protocol, TypeGuard, runtime_checkable

import numpy as np

from mindfoundry.config.parallel_config import Layout
from mindfoundry.config.schema import RunConfig
from mindfoundry.debug.probe import Probe
from mindfoundry.errors import MindFoundryError
from mindfoundry.model.spec import ModelSpec


@dataclass(frozen=True)
class StepScalars:
    """Per-step numbers computed once, framework-free, and fed to the compiled step.

    Computing the AdamW bias corrections in float64 on the host (as torch.optim.AdamW does)
    keeps both engines on the same arithmetic.
    """

    lr: float
    step_size: float  # lr / (1 - beta1**t)
    bias_correction2_sqrt: float  # sqrt(1 - beta2**t)
    loss_scale: float  # 1 / (valid target tokens in the global batch): mean over tokens, not batches (x S in fp16)
    loss_limit: float = math.inf  # the update is dropped when the loss exceeds this (spike policy)
    grad_limit: float = math.inf  # ... or the gradient norm exceeds this; non-finite values always drop it
    # 1/S for a dynamic loss scale S (fp16): the summed gradients and the loss are multiplied by it before
    # the norm, the limits and clipping, so everything after the backward pass sees unscaled values
    grad_unscale: float = 1.0


@dataclass(frozen=True)
class StepOutput:
    loss: float  # mean token loss over the global batch (before the update)
    grad_norm: float  # global L2 norm of the gradient before clipping
    applied: bool = True  # False when the update was dropped (non-finite, or over a limit)
    grad_sq: np.ndarray | None = None  # per-parameter squared gradient norms, in parameter_shapes order


class Backend(Protocol):
    """What the trainer needs from an engine."""

    name: str
    device_name: str  # as drivers report it ('cpu', 'NVIDIA H200', 'Ascend910B'): picks the MFU peak
    device_kind: str  # 'cpu', 'cuda' or 'npu': which vendor tool reports the device (monitor/hardware.py)
    # Several processes (torchrun): this process's rank and their number, and the slice of the global batch
    # it trains on (dp_rank of dp_size); 0, 1, 0, 1 in one process. Only rank 0 writes files, but every rank
    # calls weights()/optimizer_state() (collective under sharding) and eval_batch/logits (same batches).
    rank: int
    world_size: int
    dp_rank: int
    dp_size: int
    # Every rank holds the whole model and optimizer state (one process, or data parallel alone): weights() and
    # optimizer_state() need no other rank, so this one can write a checkpoint after the others failed.
    holds_full_state: bool
    # After a train_step that raised: whether it may have begun changing weights or moments (a torn state that
    # no checkpoint may take). False when the failure came before the optimizer touched anything.
    update_began: bool

    def global_sum(self, value: float) -> float:
        """`value` summed over the data-parallel ranks (collective); `value` itself in one process."""
        ...

    def any_rank(self, flag: bool) -> bool:
        """Whether `flag` is set on any process of the job (collective over every rank; `flag` in one process)."""
        ...

    def load_weights(self, weights: Mapping[str, np.ndarray]) -> None: ...

    def weights(self) -> dict[str, np.ndarray]: ...

    def optimizer_state(self) -> dict[str, np.ndarray]: ...

    def load_optimizer_state(self, state: Mapping[str, np.ndarray], step: int) -> None:
        """Restore AdamW moments; `step` = optimizer updates already applied (for bias correction)."""
        ...

    def device_memory(self) -> dict[str, float] | None:
        """The accelerator memory of this process's device, from the engine's allocator, MiB:
        `device_mem_allocated_mb` (in tensors now), `device_mem_reserved_mb` (held by the allocator's pool) and
        `device_mem_peak_mb` (the most ever allocated); None on CPU (the trainer records the process's RSS)."""
        ...

    def module_outputs(self, input_ids: np.ndarray) -> dict[str, np.ndarray]:
        """Outputs of :func:`mindfoundry.model.spec.module_boundaries` for one [B, S] batch."""
        ...

    def start_profile(self, folder: Path) -> None:
        """Start the engine's own profiler (host and device activity); its trace goes into `folder` when stopped."""
        ...

    def stop_profile(self) -> None:
        """Stop the profiler started by :meth:`start_profile` and write its trace."""
        ...

    def train_step(
        self, input_ids: np.ndarray, labels: np.ndarray, scalars: StepScalars, probe: Probe | None = None
    ) -> StepOutput:
        """One optimizer step over micro-batches shaped [grad_accum, micro_batch, seq_len].

        With a probe the step runs eagerly with module hooks (forward inputs/outputs, backward
        gradients) and streams parameters, gradients and moments to it; same arithmetic otherwise.
        """
        ...

    def eval_batch(self, input_ids: np.ndarray, labels: np.ndarray) -> tuple[float, int, int]:
        """Summed token loss (nats), the number of scored tokens (labels != IGNORE_INDEX) and how many of them are the
        top-1 prediction, for one [B, S] batch."""
        ...

    def logits(self, input_ids: np.ndarray) -> np.ndarray:
        """Logits [B, S, vocab] (float32) for a [B, S] batch, no gradient."""
        ...

    def caption_logits(self, pixels: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """A captioner's logits [B, S, vocab] (float32) at each caption slot of pixel values [B, 3, H, W] and caption
        labels [B, S] (:class:`mindfoundry.data.dataset.captions.CaptionSamples`), no gradient."""
        ...

    def image_features(self, pixels: np.ndarray) -> np.ndarray:
        """An image model's features [B, d_model] (float32) of pixel values [B, 3, H, W]: its encoder over every patch,
        the mean of the patch tokens after the final norm (what a linear probe reads), no gradient."""
        ...

    def new_cache(self, length: int) -> Any:
        """An empty key/value cache for one sequence of up to `length` tokens (engine-owned; for :meth:`decode`)."""
        ...

    def decode(self, ids: np.ndarray, start: int, cache: Any) -> np.ndarray:
        """Logits [T, vocab] (float32) of the T tokens `ids` at positions start..start+T-1, each attending the
        cached positions before it; afterwards `cache` holds positions < start+T. No gradient."""
        ...


@runtime_checkable
class ShardedCheckpoints(Protocol):
    """Optional, for ``checkpoint.format: sharded`` (the torch engine): each rank writes and reads only its own
    shards of the weights and AdamW moments, so no process ever holds the full state. ``shard_format`` names the
    form on disk that load_sharded reads ("torch.distributed.checkpoint"). (MindSpore's semi-auto engine has only
    ``save_sharded``: its "rank_slices" folders are read back as full arrays,
    :mod:`mindfoundry.checkpoint.rank_slices`.)"""

    shard_format: str

    def save_sharded(self, folders: tuple[Path, Path] | None) -> None:
        """Write this rank's shards of the weights and of the AdamW moments into `folders` (collective: rank 0
        passes the checkpoint's two shard folders, the other ranks None); every rank's files are written when
        it returns."""
        ...

    def load_sharded(self, folders: tuple[Path, Path], adam_step: int) -> None:
        """Read a sharded checkpoint's (weights, moments) shard folders into this layout, whatever layout wrote
        them (collective)."""
        ...


def device_memory_record(allocated: int, reserved: int, peak: int) -> dict[str, float]:
    """An engine allocator's byte counts as the step record's device memory keys (MiB)."""
    return {
        "device_mem_allocated_mb": allocated / 2**20,
        "device_mem_reserved_mb": reserved / 2**20,
        "device_mem_peak_mb": peak / 2**20,
    }


def supports_sharded(backend: object, form: str) -> TypeGuard[ShardedCheckpoints]:
    """Whether `backend` implements :class:`ShardedCheckpoints` and reads shard `form`
    (:func:`mindfoundry.checkpoint.reader.shard_format`) itself; any other backend gets the checkpoint as full
    arrays."""
    return isinstance(backend, ShardedCheckpoints) and backend.shard_format == form


def check_state_names(
    targets: Mapping[str, object], values: Mapping[str, np.ndarray], what: str, shapes: Mapping[str, tuple[int, ...]]
) -> None:
    """Refuse state whose names (both ways) or shapes differ from the model's, naming the first offenders."""
    missing = sorted(set(targets) - set(values))
    unexpected = sorted(set(values) - set(targets))
    if missing or unexpected:
        raise ValueError(f"{what} do not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    for name, shape in shapes.items():
        got = tuple(np.shape(values[name]))
        if got != tuple(shape):
            raise ValueError(f"{what}: '{name}' has shape {got}, the model expects {tuple(shape)}")


_BACKENDS = {"mindspore": "mindfoundry.backends.mindspore.backend", "torch": "mindfoundry.backends.torch.backend"}
_EXTRAS = {"mindspore": "mindspore", "torch": "torch"}


class BackendUnavailable(MindFoundryError, RuntimeError):
    """The configured engine cannot be imported here."""


def import_engine(backend: str) -> ModuleType:
    """The configured engine's module, imported on first use (neither framework is imported unless used)."""
    module_name = _BACKENDS[backend]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("mindfoundry"):
            raise BackendUnavailable(
                f"backend '{backend}' is not implemented in this version (set backend: mindspore)"
            ) from None
        raise BackendUnavailable(
            f"backend '{backend}' needs {exc.name!r}: pip install 'mindfoundry[{_EXTRAS[backend]}]'"
        ) from None


def check_device(cfg: RunConfig) -> None:
    """Refuse, in one line, a ``device`` the configured engine cannot reach here (before any data is prepared)."""
    import_engine(cfg.backend).check_device(cfg.device)


def create_backend(cfg: RunConfig, spec: ModelSpec, layout: Layout) -> Backend:
    """The configured engine, built for this model on the launch's layout (resolved and checked once, by
    :func:`mindfoundry.parallel.layout.launch_layout`; the engine refuses only what it cannot run)."""
    return import_engine(cfg.backend).create(cfg, spec, layout)
