"""Learning-rate schedule and AdamW scalars, computed on the host for every engine.

The schedule is a pure function of the step number and the plan: linear warmup, then a cosine to the floor
(``optim.lr * optim.min_lr_ratio``) at ``train.steps``. A resume that changes ``train.steps`` re-plans the decay from
the step it resumes at (:class:`Replan`): the LR goes on from the value the last step used, along a half cosine, to
the floor at the new end -- continuous, and at the floor where the run now ends. Steps before the resume keep the
LR they had. A resume inside the warmup needs no re-plan (the warmup does not depend on the end), the cosine after it
simply runs to the new end. The plan (the end, the re-plans) is in every checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mindfoundry.backends.base import StepScalars
from mindfoundry.config.schema import OptimConfig


@dataclass(frozen=True)
class Replan:
    """After step ``at``, the LR decays along a half cosine from ``lr`` (the LR step ``at`` used) to the floor at step
    ``until`` (see the module docstring)."""

    at: int
    lr: float
    until: int


def learning_rate(step: int, total_steps: int, optim: OptimConfig, replans: Sequence[Replan] = ()) -> float:
    """LR for optimizer update number `step` (1-based): linear warmup, then cosine to min_lr_ratio*lr at
    `total_steps`; after a re-plan, its decay."""
    peak, floor = optim.lr, optim.lr * optim.min_lr_ratio
    active = [r for r in replans if r.at < step]
    if active:
        replan = active[-1]
        progress = min((step - replan.at) / max(replan.until - replan.at, 1), 1.0)
        return floor + (replan.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if step <= optim.warmup_steps:
        return peak * step / optim.warmup_steps
    decay_steps = max(total_steps - optim.warmup_steps, 1)
    progress = min((step - optim.warmup_steps) / decay_steps, 1.0)
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def step_scalars(
    step: int, total_steps: int, optim: OptimConfig, valid_tokens: int, *, adam_step: int | None = None,
    loss_limit: float = math.inf, grad_limit: float = math.inf, loss_multiplier: float = 1.0, loss_scale: float = 1.0,
    replans: Sequence[Replan] = (),
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
    lr = learning_rate(step, total_steps, optim, replans)
    return StepScalars(
        lr=lr,
        step_size=lr / (1.0 - optim.beta1**t),
        bias_correction2_sqrt=math.sqrt(1.0 - optim.beta2**t),
        loss_scale=loss_multiplier * loss_scale / valid_tokens,
        loss_limit=loss_limit,
        grad_limit=grad_limit,
        grad_unscale=1.0 / loss_scale,
    )
