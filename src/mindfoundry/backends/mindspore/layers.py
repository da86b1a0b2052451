"""Building blocks shared by the MindSpore model's Cells: float32 zero Parameters and the Linear layer whose matmul
runs in the compute dtype of mixed precision (see :mod:`.model`)."""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

F16, F32 = ms.float16, ms.float32
#: One Tile primitive for expand (a bprop graph cannot create one through ops.tile, nor iterate a zip)
_TILE = ops.Tile()


def zeros_weight(*shape: int) -> Parameter:
    return Parameter(Tensor(np.zeros(shape, dtype=np.float32)), name="weight")


def expand(x, shape: tuple):
    """`x` broadcast to `shape` as a tensor of its own (a Tile), for a binary op between equal shapes.

    MindSpore 2.10's CPU kernels for Add/Sub/Mul on operands of different shapes keep about four times the
    result's size resident until the compiled step ends, where the same op on equal shapes reuses its buffers
    (40 chained (4096, 2048) adds: 5.2 GB against 0.13 GB), and Tile writes the copy faster than BroadcastTo
    (which is ~10x slower when it expands the last axis) or the broadcasting op itself (docs/benchmarks.md).
    The values are the same either way: broadcasting copies.
    """
    own = (1,) * (len(shape) - len(x.shape)) + x.shape
    return _TILE(x.reshape(own), tuple(shape[i] // own[i] for i in range(len(shape))))


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
