"""The torch train step — the mirror of backends/mindspore/train_step.py.

torch.optim.AdamW is the reference arithmetic that the MindSpore AdamW reproduces; the LR comes
from the shared schedule each step, and weight decay is split into parameter groups by the same
rule (:func:`mindfoundry.model.spec.decays`).
"""

from __future__ import annotations

import contextlib
import math
from typing import Callable, ContextManager

import torch
from torch import nn

from mindfoundry.backends.base import StepScalars
from mindfoundry.backends.torch.model import token_nll
from mindfoundry.config.schema import OptimConfig
from mindfoundry.debug.probe import Probe
from mindfoundry.model.spec import decays


def build_adamw(model: nn.Module, optim: OptimConfig) -> torch.optim.AdamW:
    """AdamW with decay on matrices only; parameters ordered by name inside each group."""
    named = list(model.named_parameters())
    groups = [
        {"params": [p for n, p in named if decays(n, tuple(p.shape))], "weight_decay": optim.weight_decay},
        {"params": [p for n, p in named if not decays(n, tuple(p.shape))], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=optim.lr, betas=(optim.beta1, optim.beta2), eps=optim.eps, foreach=True)


def autocast_for(device: torch.device, precision: str) -> Callable[[], ContextManager]:
    """bf16 autocast where asked (matmuls in bf16, loss in fp32); fp32 runs without autocast."""
    if precision == "bf16":
        return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext


class TrainStep:
    """One optimizer step over micro-batches: grads summed, global-norm clipped, AdamW applied.

    Each micro-batch loss is pre-scaled by 1/(valid tokens of the global batch), so the summed
    gradient is the gradient of the global token-mean loss, padding excluded. The update is dropped
    when the loss or the gradient norm is non-finite or above its limit.
    """

    def __init__(self, model: nn.Module, step_model: nn.Module, optimizer: torch.optim.AdamW,
                 clip_norm: float | None, autocast: Callable[[], ContextManager]):
        self.model, self.step_model, self.optimizer = model, step_model, optimizer
        self.clip_norm = clip_norm
        self.autocast = autocast
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.model_order = list(model.parameters())  # parameter_shapes order, for per-parameter statistics

    def __call__(self, ids: torch.Tensor, labels: torch.Tensor, scalars: StepScalars) -> tuple[float, float, bool, torch.Tensor]:
        total = self.accumulate(ids, labels, scalars, self.step_model)
        return self.update(total, scalars)

    def accumulate(self, ids: torch.Tensor, labels: torch.Tensor, scalars: StepScalars, model: nn.Module,
                   probe: Probe | None = None) -> torch.Tensor:
        """Forward and backward over the micro-batches; gradients left summed in `.grad`. Returns the loss."""
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=ids.device)
        for i in range(ids.shape[0]):
            with self.autocast():
                logits = model(ids[i])
            nll, _ = token_nll(logits, labels[i])
            loss = nll * scalars.loss_scale
            if probe is not None:
                probe.loss(i, loss.detach().cpu().numpy())
            loss.backward()
            total += loss.detach()
        return total

    def update(self, total: torch.Tensor, scalars: StepScalars) -> tuple[float, float, bool, torch.Tensor]:
        """Measure, clip and apply the summed gradients (or drop the update)."""
        for group in self.optimizer.param_groups:
            group["lr"] = scalars.lr
        grad_sq = torch.stack([torch.linalg.vector_norm(p.grad) for p in self.model_order]) ** 2  # before clipping
        limit = float("inf") if self.clip_norm is None else self.clip_norm
        norm = torch.nn.utils.clip_grad_norm_(self.params, limit, foreach=True)
        loss, grad_norm = float(total), float(norm)
        apply = math.isfinite(loss) and math.isfinite(grad_norm) and loss <= scalars.loss_limit and grad_norm <= scalars.grad_limit
        if apply:  # a dropped update leaves weights, moments and AdamW's step count untouched
            self.optimizer.step()
        return loss, grad_norm, apply, grad_sq
