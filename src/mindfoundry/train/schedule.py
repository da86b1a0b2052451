"""Learning-rate schedule and AdamW scalars, computed on the host for every engine.

A schedule is a pure function of the step number, so resuming needs to save nothing but the step.
"""

from __future__ import annotations

import math

from mindfoundry.backends.base import StepScalars
from mindfoundry.config.schema import OptimConfig


def learning_rate(step: int, total_steps: int, optim: OptimConfig) -> float:
    """LR for optimizer update number `step` (1-based): linear warmup, then cosine to min_lr_ratio*lr."""
    peak, floor = optim.lr, optim.lr * optim.min_lr_ratio
    if step <= optim.warmup_steps:
        return peak * step / optim.warmup_steps
    decay_steps = max(total_steps - optim.warmup_steps, 1)
    progress = min((step - optim.warmup_steps) / decay_steps, 1.0)
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def step_scalars(
    step: int, total_steps: int, optim: OptimConfig, valid_tokens: int, *, adam_step: int | None = None,
    loss_limit: float = math.inf, grad_limit: float = math.inf, loss_multiplier: float = 1.0, loss_scale: float = 1.0,
) -> StepScalars:
    """Everything the compiled step needs besides the batch, in float64 arithmetic as torch.optim.AdamW uses.

    `step` drives the LR schedule; `adam_step` (default: `step`) is the AdamW update number t for the
    bias corrections, which stays behind `step` once updates have been dropped. `loss_multiplier`
    scales loss and gradients (used to inject faults in drills). `loss_scale` is the dynamic fp16 loss
    scale S: the loss is multiplied by S before the backward pass and the summed gradients by 1/S after
    it (S = 1, the default, leaves the fp32 arithmetic exactly as it is).
    """
    if valid_tokens <= 0:
        raise ValueError(f"step {step}: the global batch has no target tokens (all labels are padding)")
    t = step if adam_step is None else adam_step
    lr = learning_rate(step, total_steps, optim)
    return StepScalars(
        lr=lr,
        step_size=lr / (1.0 - optim.beta1**t),
        bias_correction2_sqrt=math.sqrt(1.0 - optim.beta2**t),
        loss_scale=loss_multiplier * loss_scale / valid_tokens,
        loss_limit=loss_limit,
        grad_limit=grad_limit,
        grad_unscale=1.0 / loss_scale,
    )
