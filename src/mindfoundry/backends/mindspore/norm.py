"""RMSNorm of the MindSpore model, with a backward written out by hand.

``y = x * r * w`` with ``r = 1 / sqrt(mean(x^2) + eps)`` per row of the C channels. The forward is the
eager formula op for op (the same float32 numbers as before, and as the torch model's). The backward is
written out because MindSpore's automatic one runs its reductions where this CPU's kernels are slowest:
the gradients of ``r`` and of the mean are reductions over the last axis, which MindSpore 2.10 runs at
~1 GB/s (a (4, 512, 512) tensor: 4.5 ms, where a product with a ones vector takes 0.5 ms), and the
weight's gradient is a reduction over the (B, S) axes (2.8 ms, against 0.7 ms over the rows of a (B*S, C)
view). By hand, with the ``r`` the forward returns (not recomputed), ``n = x * r`` and ``p = dy * n``::

    dw = sum over rows of p
    dx = r * dy * w - n * r * (p . w) / C

(``(p . w) = r * sum_c dy*w*x``, the row sums of the automatic backward) as a product with the weight
vector. The gradients equal the automatic ones up to float32 rounding (tests/backends/test_mindspore_backend.py);
docs/benchmarks.md has the step's figures.
"""

from __future__ import annotations

import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from mindfoundry.backends.mindspore.layers import expand


class RMSNormCore(nn.Cell):
    """(x, weight) -> (normalized x times weight, r): the arithmetic and its backward (the module docstring)."""

    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps
        self.row_dot = ops.MatMul()

    def construct(self, x, weight):
        r = ops.rsqrt(ops.mean(x * x, -1, keep_dims=True) + self.eps)  # (..., 1)
        return x * expand(r, x.shape) * expand(weight, x.shape), r

    def bprop(self, x, weight, out, dout):
        r, dy = out[1], dout[0]  # r's own gradient is zero: no caller uses it
        c = x.shape[-1]
        rt = expand(r, x.shape)
        normed = x * rt
        p = (dy * normed).reshape(-1, c)
        dw = p.sum(0)
        dot = self.row_dot(p, weight.reshape(c, 1)).reshape(r.shape)  # (..., 1)
        dx = dy * expand(weight, x.shape) * rt - normed * expand(r * dot / c, x.shape)
        return dx, dw


class RMSNorm(nn.Cell):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = Parameter(Tensor(np.ones(dim, dtype=np.float32)), name="weight")
        # Held outside the Cell tree, so that module paths (hooks, dumps) stay the torch model's: it has no parameters.
        object.__setattr__(self, "core", RMSNormCore(eps))

    def construct(self, x):
        return self.core(x, self.weight)[0]
