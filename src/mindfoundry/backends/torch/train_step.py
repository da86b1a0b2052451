"""The torch train step — the mirror of backends/mindspore/train_step.py.

torch.optim.AdamW is the reference arithmetic that the MindSpore AdamW reproduces; the LR comes
from the shared schedule each step, and weight decay is split into parameter groups by the same
rule (:func:`mindfoundry.model.spec.decays`).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from typing import Callable, ContextManager

import torch
from torch import nn

from mindfoundry.backends.base import BackendUnavailable, StepScalars
from mindfoundry.backends.torch.caption import Captioner
from mindfoundry.backends.torch.model import aux_loss_sum, token_nll
from mindfoundry.backends.torch.vision import MAE
from mindfoundry.config.schema import OptimConfig
from mindfoundry.debug.probe import Probe
from mindfoundry.model.spec import decays


def build_adamw(model: nn.Module, optim: OptimConfig) -> torch.optim.AdamW:
    """AdamW with decay on matrices only; parameters ordered by name inside each group; frozen ones (train.freeze:
    requires_grad off) left out."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in named if decays(n, tuple(p.shape))], "weight_decay": optim.weight_decay},
        {"params": [p for n, p in named if not decays(n, tuple(p.shape))], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=optim.lr, betas=(optim.beta1, optim.beta2), eps=optim.eps, foreach=True)


_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_for(device: torch.device, precision: str) -> Callable[[], ContextManager]:
    """bf16/fp16 autocast where asked (matmuls in reduced precision, loss in fp32); fp32 runs without autocast.

    Refuses a device whose autocast does not produce the dtype (torch silently disables autocast
    with a warning there): a matmul under autocast is tried once and its dtype checked.
    """
    if precision not in _AUTOCAST_DTYPES:
        return contextlib.nullcontext
    dtype = _AUTOCAST_DTYPES[precision]
    ok = torch.amp.is_autocast_available(device.type)
    if ok:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.autocast(device_type=device.type, dtype=dtype):
                probe = torch.ones(2, 2, device=device) @ torch.ones(2, 2, device=device)
        ok = probe.dtype == dtype
    if not ok:
        other = "bf16" if precision == "fp16" else "fp16"
        raise BackendUnavailable(
            f"train.precision={precision}: torch {torch.__version__} has no {dtype} autocast on device "
            f"'{device.type}': use train.precision: fp32 (or {other} where the device supports it)"
        )
    return lambda: torch.autocast(device_type=device.type, dtype=dtype)


class TrainStep:
    """One optimizer step over micro-batches: grads summed, global-norm clipped, AdamW applied.

    Each micro-batch loss is pre-scaled by 1/(valid tokens of the global batch), so the summed
    gradient is the gradient of the global token-mean loss, padding excluded. Under fp16 that scale
    also carries the dynamic loss scale S, and `scalars.grad_unscale` (1/S) brings loss and gradients
    back before they are measured. The update is dropped when the loss or the gradient norm is
    non-finite (an fp16 overflow) or above its limit.
    """

    def __init__(self, model: nn.Module, step_model: nn.Module, optimizer: torch.optim.AdamW,
                 clip_norm: float | None, autocast: Callable[[], ContextManager],
                 saved_tensors: Callable[[], ContextManager] = contextlib.nullcontext):
        self.model, self.step_model, self.optimizer = model, step_model, optimizer
        self.clip_norm = clip_norm
        self.autocast = autocast
        self.saved_tensors = saved_tensors  # activation offload (memory.offload_activations), else a no-op
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.model_order = list(model.parameters())  # parameter_shapes order, for per-parameter statistics

    def __call__(
        self, ids: torch.Tensor, labels: torch.Tensor, scalars: StepScalars
    ) -> tuple[float, float, bool, torch.Tensor]:
        total = self.accumulate(ids, labels, scalars, self.step_model)
        return self.update(total, scalars)

    def accumulate(self, ids: torch.Tensor, labels: torch.Tensor, scalars: StepScalars, model: nn.Module,
                   probe: Probe | None = None) -> torch.Tensor:
        """Forward and backward over the micro-batches; gradients left summed in `.grad`. Returns the loss."""
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=ids.device)
        # the loss inside the forward: an image model always (its labels are its masks), a language model when it
        # computes the loss in chunks and no dump records the whole logits as its output
        in_forward = isinstance(self.model, (MAE, Captioner)) or (probe is None and self.model.loss_chunk > 0)
        for i in range(ids.shape[0]):
            with self.autocast(), self.saved_tensors():
                if in_forward:
                    nll, _ = model(ids[i], labels[i])
                else:
                    nll, _ = token_nll(model(ids[i]), labels[i])
            aux = aux_loss_sum(self.model)  # MoE load balancing (None for a dense model): part of the loss
            loss = nll * scalars.loss_scale if aux is None else (nll + aux) * scalars.loss_scale
            if probe is not None:
                probe.loss(i, loss.detach().cpu().numpy())
            loss.backward()
            total += loss.detach()
        return total

    def update(self, total: torch.Tensor, scalars: StepScalars) -> tuple[float, float, bool, torch.Tensor]:
        """Unscale, measure, clip and apply the summed gradients (or drop the update)."""
        for group in self.optimizer.param_groups:
            group["lr"] = scalars.lr
        if (
            scalars.grad_unscale != 1.0
        ):  # the same fp32 products as the MindSpore step (which multiplies by 1.0 otherwise)
            total = total * scalars.grad_unscale
            torch._foreach_mul_([p.grad for p in self.params if p.grad is not None], scalars.grad_unscale)
        # before clipping; a parameter the loss does not reach (a captioner's unused final encoder norm, a frozen part)
        # has no gradient: zero
        grad_sq = torch.stack([torch.linalg.vector_norm(p.grad) if p.grad is not None else p.new_zeros(())
                               for p in self.model_order]) ** 2
        limit = float("inf") if self.clip_norm is None else self.clip_norm
        norm = torch.nn.utils.clip_grad_norm_(self.params, limit, foreach=True)
        loss, grad_norm = float(total), float(norm)
        apply = (
            math.isfinite(loss)
            and math.isfinite(grad_norm)
            and loss <= scalars.loss_limit
            and grad_norm <= scalars.grad_limit
        )
        if apply:  # a dropped update leaves weights, moments and AdamW's step count untouched
            self.optimizer.step()
        return loss, grad_norm, apply, grad_sq
