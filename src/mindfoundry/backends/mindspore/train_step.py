"""The compiled MindSpore train step: accumulate, measure, clip, AdamW.

MindSpore's built-in ``nn.AdamWeightDecay`` has no bias correction and ``mint.optim.AdamW`` does not
run on CPU, so the step drives MindSpore's fused ``AdamWeightDecay`` kernel (one pass over each
parameter, its moments and its gradient) with scalars chosen so that it computes torch.optim.AdamW's
update: torch's ``p*(1 - lr*wd) - step_size * m / (sqrt(v)/c + eps)`` (``c = sqrt(bias_correction2)``,
bias corrections from the host) equals the kernel's ``p - lr' * (m / (sqrt(v) + eps') + wd' * p)``
with ``lr' = step_size*c``, ``eps' = c*eps`` and ``wd' = lr*wd/lr'``: the same arithmetic up to float32
rounding (tests/backends/test_mindspore_backend.py holds it against float64). The moments are torch's
exp_avg / exp_avg_sq, which is what lets a checkpoint continue on either engine. One fused kernel
instead of a dozen elementwise ops per parameter holds a third less memory at the peak
(docs/benchmarks.md, "What changed in the MindSpore engine").
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from mindfoundry.model.spec import decays


class AdamW(nn.Optimizer):
    """AdamW state (exp_avg / exp_avg_sq per parameter) and its update through the fused kernel.

    An ``nn.Optimizer`` so that MindSpore's parallel optimizer (``enable_parallel_optimizer`` under semi-auto
    parallel) recognises it and can shard its moments; the base class's own learning rate is unused (0: the
    rate comes from the shared schedule each step, as an input of :meth:`construct`).
    """

    def __init__(self, params: list[Parameter], beta1: float, beta2: float, eps: float, weight_decay: float):
        super().__init__(0.0, params)
        self.params = ParameterTuple(params)
        self.exp_avg = self.params.clone(prefix="exp_avg", init="zeros")
        self.exp_avg_sq = self.params.clone(prefix="exp_avg_sq", init="zeros")
        self.beta1, self.beta2 = Tensor(np.float32(beta1)), Tensor(np.float32(beta2))
        self.eps = eps
        self.decay = tuple(weight_decay if decays(p.name, p.shape) else 0.0 for p in params)
        self.num_params = len(params)
        self.kernel = ops.AdamWeightDecay()

    def construct(self, grads, grad_scale, lr, step_size, bc2_sqrt, apply):
        """Update every parameter from ``grad * grad_scale``, or (apply=False) leave it, its moments and all bit for
        bit.

        The scale (loss-scale unscale times clip coefficient) is applied here, one multiply per gradient
        feeding the kernel, instead of separate passes over every gradient before the update. A dropped
        step feeds the kernel zero gradients with betas 1 and rate 0, which keeps m, v and p exactly. (The
        same update under a graph-level ``if apply:`` compiled, but MindSpore 2.10 then computed wrong
        updates from the second step on in the fp16 and MoE tests; the gating stays arithmetic.)
        """
        rate = ops.where(apply, step_size * bc2_sqrt, 0.0)
        decay_ratio = ops.where(rate > 0.0, lr / ops.maximum(rate, 1e-30), 0.0)  # wd' / wd; lr 0 decays nothing
        beta1, beta2 = ops.where(apply, self.beta1, 1.0), ops.where(apply, self.beta2, 1.0)
        eps = bc2_sqrt * self.eps
        for i in range(self.num_params):
            grad = ops.where(apply, grads[i] * grad_scale, 0.0)  # a dropped step's gradients may be non-finite
            self.kernel(self.params[i], self.exp_avg[i], self.exp_avg_sq[i], rate, beta1, beta2, eps,
                        decay_ratio * self.decay[i], grad)
        return lr


#: Partial sums per squared norm: MindSpore's CPU ReduceSum of a whole tensor to a scalar runs on one thread,
#: a reduction along an axis on all of them (27.8M values: 117 ms -> 15 ms, as accurate: 6e-8 relative).
NORM_PARTS = 512


def _sum_of_squares(g):
    n = g.size
    if n % NORM_PARTS:
        return (g * g).sum()
    return (g * g).reshape(NORM_PARTS, n // NORM_PARTS).sum(1).sum()


def squared_norms(grads):
    """Per-parameter squared L2 norms, stacked (the global norm and per-layer monitoring share them)."""
    return ops.stack([_sum_of_squares(g) for g in grads])


class TrainStep(nn.Cell):
    """One optimizer step over `accum` micro-batches: grads summed, then clipped and applied.

    Each micro-batch loss is pre-scaled by 1/(valid tokens of the global batch), so the summed
    gradient is exactly the gradient of the global token-mean loss, padding excluded. Under fp16 that
    scale also carries the dynamic loss scale S, and `grad_unscale` (1/S, else 1.0) brings loss and
    gradients back before anything measures them. The update is dropped inside the graph when the
    loss or the gradient norm is non-finite (an fp16 overflow) or above its limit.

    Under semi-auto parallel (:mod:`.semi_auto`) the compiler inserts every collective; a pipeline's
    micro-batches run inside the loss Cell and `pipeline_reducer` gathers their gradients.

    With ``data_parallel`` (msrun, DATA_PARALLEL mode) each rank feeds its slice of the global batch
    and the summed gradients and losses are all-reduced (summed, not averaged: the scale already
    divides by the global token count) before anything measures or applies them, so every rank
    takes the same update decision on the global numbers and the replicas stay identical.
    """

    def __init__(
        self,
        loss_cell: nn.Cell,
        optimizer: AdamW,
        accum: int,
        clip_norm: float | None,
        data_parallel: bool = False,
        pipeline_reducer: nn.Cell | None = None,
    ):
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
        self.pipeline_reducer = pipeline_reducer  # semi-auto pipelines: PipelineGradReducer (see .semi_auto)

    def construct(self, ids, labels, scale, lr, step_size, bc2_sqrt, loss_limit, grad_limit, grad_unscale):
        loss, grads = self.accumulate(ids, labels, scale)
        return self.reduce_and_update(loss, grads, lr, step_size, bc2_sqrt, loss_limit, grad_limit, grad_unscale)

    def reduce_and_update(self, loss, grads, lr, step_size, bc2_sqrt, loss_limit, grad_limit, grad_unscale):
        """The summed loss and gradients over the ranks (data parallel, pipeline), then :meth:`update`."""
        if self.data_parallel:
            loss, grads = self.loss_reducer(loss.reshape((1,))).reshape(()), self.grad_reducer(grads)
        if self.pipeline_reducer is not None:
            grads = self.pipeline_reducer(grads)
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
        """Unscale, measure, clip and apply the summed gradients, or drop the update.

        `grad_unscale` is 1.0 or a power of two, so multiplying by it is exact: the squared norms of the
        scaled gradients times its square are bit for bit those of the unscaled gradients, and unscale and
        clip fold into one factor the optimizer applies as it reads each gradient (one pass, not three).
        """
        loss = loss * grad_unscale
        grad_sq = squared_norms(grads) * (grad_unscale * grad_unscale)
        norm = ops.sqrt(grad_sq.sum())
        apply = ops.isfinite(loss) & ops.isfinite(norm) & (loss <= loss_limit) & (norm <= grad_limit)
        factor = grad_unscale
        if self.clip:
            factor = factor * ops.minimum(self.clip_norm / (norm + 1e-6), 1.0)
        self.optimizer(grads, factor, lr, step_size, bc2_sqrt, apply)
        return loss, norm, apply, grad_sq


class _MicroBatch(nn.Cell):
    """One micro-batch's loss and gradients; the gradients are added into `sums` (in place), the loss returned."""

    def __init__(self, step: TrainStep, sums: ParameterTuple):
        super().__init__(auto_prefix=False)
        self.grad_fn = step.grad_fn
        self.sums = sums

    def construct(self, ids, labels, scale):
        loss, grads = self.grad_fn(ids, labels, scale)
        for i in range(len(grads)):
            loss = ops.depend(loss, ops.assign(self.sums[i], self.sums[i] + grads[i]))
        return loss


class _Zero(nn.Cell):
    """Sets every accumulation buffer to zero."""

    def __init__(self, sums: ParameterTuple):
        super().__init__(auto_prefix=False)
        self.sums = sums

    def construct(self):
        done = True
        for i in range(len(self.sums)):
            done = ops.depend(done, ops.assign(self.sums[i], ops.zeros_like(self.sums[i])))
        return done


class _SummedUpdate(nn.Cell):
    """The step's reduction and update (:meth:`TrainStep.reduce_and_update`) on the buffers' sums."""

    def __init__(self, step: TrainStep, sums: ParameterTuple):
        super().__init__(auto_prefix=False)
        self.step = step
        self.sums = sums

    def construct(self, loss, lr, step_size, bc2_sqrt, loss_limit, grad_limit, grad_unscale):
        return self.step.reduce_and_update(
            loss, tuple(self.sums), lr, step_size, bc2_sqrt, loss_limit, grad_limit, grad_unscale
        )


class AccumulatingStep:
    """:class:`TrainStep`'s call with the micro-batches looped on the host: for ``train.grad_accum`` > 1 outside
    semi-auto.

    TrainStep's Python loop over micro-batches unrolls inside the compiled graph, so its compile time and the
    memory the compiled graph holds grow with grad_accum (demo size, `bench/grad_accum.py`: first step 8.8 s and peak
    RSS 1,556 MiB at 1 micro-batch, 32.2 s and 5,717 MiB at 8; docs/benchmarks.md). Here one graph runs a micro-batch
    and adds its
    gradients into buffers (one set of float32 gradients, which the unrolled graph also holds), a second graph reduces
    and applies the sums; both compile once whatever grad_accum is. The arithmetic is TrainStep's: losses and
    gradients summed in micro-batch order from zero (0 + g is g), so the two give the same floats.
    """

    def __init__(self, step: TrainStep):
        self.accum = step.accum
        sums = step.optimizer.params.clone(prefix="grad_sum", init="zeros")
        self.zero, self.micro, self.apply = _Zero(sums), _MicroBatch(step, sums), _SummedUpdate(step, sums)

    def __call__(self, ids, labels, scale, *scalars):
        self.zero()
        loss = self.micro(ids[0], labels[0], scale)
        for i in range(1, self.accum):
            loss = loss + self.micro(ids[i], labels[i], scale)
        return self.apply(loss, *scalars)


def scalar(value: float) -> Tensor:
    return Tensor(np.float32(value))
