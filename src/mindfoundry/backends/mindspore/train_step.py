"""The compiled MindSpore train step: accumulate, measure, clip, AdamW.

MindSpore's built-in ``nn.AdamWeightDecay`` has no bias correction and ``mint.optim.AdamW`` does not
run on CPU, so the update is written out here with torch.optim.AdamW's exact arithmetic (decoupled
decay ``p *= 1 - lr*wd``, then ``p -= step_size * m / (sqrt(v)/sqrt(bc2) + eps)``), with the bias
corrections computed on the host. That is what lets a checkpoint continue on either engine.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from mindfoundry.model.spec import decays


class AdamW(nn.Cell):
    """AdamW state (exp_avg / exp_avg_sq per parameter) and its update."""

    def __init__(self, params: list[Parameter], beta1: float, beta2: float, eps: float, weight_decay: float):
        super().__init__(auto_prefix=False)
        self.params = ParameterTuple(params)
        self.exp_avg = self.params.clone(prefix="exp_avg", init="zeros")
        self.exp_avg_sq = self.params.clone(prefix="exp_avg_sq", init="zeros")
        self.beta1, self.beta2, self.eps = beta1, beta2, eps
        self.decay = tuple(weight_decay if decays(p.name, p.shape) else 0.0 for p in params)
        self.num_params = len(params)

    def construct(self, grads, lr, step_size, bc2_sqrt, apply):
        """Update every parameter, or (apply=False) leave parameters and moments untouched."""
        for i in range(self.num_params):
            p, g, m, v = self.params[i], grads[i], self.exp_avg[i], self.exp_avg_sq[i]
            decayed = p * (1.0 - lr * self.decay[i]) if self.decay[i] > 0.0 else p
            m_new = m + (g - m) * (1.0 - self.beta1)
            v_new = v * self.beta2 + g * g * (1.0 - self.beta2)
            p_new = decayed - step_size * m_new / (ops.sqrt(v_new) / bc2_sqrt + self.eps)
            ops.assign(m, ops.where(apply, m_new, m))
            ops.assign(v, ops.where(apply, v_new, v))
            ops.assign(p, ops.where(apply, p_new, p))
        return lr


def squared_norms(grads):
    """Per-parameter squared L2 norms, stacked (the global norm and per-layer monitoring share them)."""
    return ops.stack([(g * g).sum() for g in grads])


class TrainStep(nn.Cell):
    """One optimizer step over `accum` micro-batches: grads summed, then clipped and applied.

    Each micro-batch loss is pre-scaled by 1/(valid tokens of the global batch), so the summed
    gradient is exactly the gradient of the global token-mean loss, padding excluded. Under fp16 that
    scale also carries the dynamic loss scale S, and `grad_unscale` (1/S, else 1.0) brings loss and
    gradients back before anything measures them. The update is dropped inside the graph when the
    loss or the gradient norm is non-finite (an fp16 overflow) or above its limit.

    With ``data_parallel`` (msrun, DATA_PARALLEL mode) each rank feeds its slice of the global batch
    and the summed gradients and losses are all-reduced (summed, not averaged: the scale already
    divides by the global token count) before anything measures or applies them, so every rank
    takes the same update decision on the global numbers and the replicas stay identical.
    """

    def __init__(self, loss_cell: nn.Cell, optimizer: AdamW, accum: int, clip_norm: float | None, data_parallel: bool = False):
        super().__init__(auto_prefix=False)
        self.loss_cell = loss_cell
        self.optimizer = optimizer
        self.accum = accum
        self.clip = clip_norm is not None
        self.clip_norm = float(clip_norm or 0.0)
        self.grad_fn = ms.value_and_grad(loss_cell, None, optimizer.params)
        self.data_parallel = data_parallel
        if data_parallel:  # needs mindspore.communication.init() first
            self.grad_reducer = nn.DistributedGradReducer(optimizer.params, mean=False)
            self.loss_reducer = ops.AllReduce()  # sum over the world group

    def construct(self, ids, labels, scale, lr, step_size, bc2_sqrt, loss_limit, grad_limit, grad_unscale):
        loss, grads = self.accumulate(ids, labels, scale)
        if self.data_parallel:
            loss, grads = self.loss_reducer(loss.reshape((1,))).reshape(()), self.grad_reducer(grads)
        return self.update(loss, grads, lr, step_size, bc2_sqrt, loss_limit, grad_limit, grad_unscale)

    def accumulate(self, ids, labels, scale):
        """Loss and gradients summed over the micro-batches (a debug step calls this eagerly)."""
        loss, grads = self.grad_fn(ids[0], labels[0], scale)
        for i in range(1, self.accum):
            loss_i, grads_i = self.grad_fn(ids[i], labels[i], scale)
            loss = loss + loss_i
            grads = tuple(a + b for a, b in zip(grads, grads_i))
        return loss, grads

    def update(self, loss, grads, lr, step_size, bc2_sqrt, loss_limit, grad_limit, grad_unscale):
        """Unscale, measure, clip and apply the summed gradients, or drop the update."""
        loss = loss * grad_unscale  # exact: 1.0 in fp32, a power of two under dynamic loss scaling
        grads = tuple(g * grad_unscale for g in grads)
        grad_sq = squared_norms(grads)
        norm = ops.sqrt(grad_sq.sum())
        apply = ops.isfinite(loss) & ops.isfinite(norm) & (loss <= loss_limit) & (norm <= grad_limit)
        if self.clip:
            coef = ops.minimum(self.clip_norm / (norm + 1e-6), 1.0)
            grads = tuple(g * coef for g in grads)
        self.optimizer(grads, lr, step_size, bc2_sqrt, apply)
        return loss, norm, apply, grad_sq


def scalar(value: float) -> Tensor:
    return Tensor(np.float32(value))
