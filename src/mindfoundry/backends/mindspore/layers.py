"""Building blocks shared by the MindSpore model's Cells: float32 zero Parameters and the Linear layer whose matmul
runs in the compute dtype of mixed precision (see :mod:`.model`)."""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

F16, F32 = ms.float16, ms.float32


def zeros_weight(*shape: int) -> Parameter:
    return Parameter(Tensor(np.zeros(shape, dtype=np.float32)), name="weight")


def cast_matmul(matmul, x, y, compute):
    """`matmul(x, y)` (the primitive carries any transpose); with a `compute` dtype (float16, bfloat16), on cast copies
    in that dtype with a float32 result: the Linear layers, the tied head, each loss chunk and attention's probs @ v all
    compute it so."""
    if compute is not None:
        return matmul(x.astype(compute), y.astype(compute)).astype(F32)
    return matmul(x, y)


class Linear(nn.Cell):
    """y = x W^T with W stored [out, in] (torch.nn.Linear layout), no bias."""

    def __init__(self, in_features: int, out_features: int, compute=None):
        super().__init__()
        self.weight = zeros_weight(out_features, in_features)
        self.matmul = ops.MatMul(transpose_b=True)
        self.compute = compute  # None: float32; else the matmul on cast copies in this dtype, float32 result

    def construct(self, x):
        lead = x.shape[:-1]
        y = cast_matmul(self.matmul, x.reshape(-1, x.shape[-1]), self.weight, self.compute)
        return y.reshape(lead + (y.shape[-1],))
