"""The dense attention core of the MindSpore model, with a backward written the way FlashAttention's is.

``softmax(q k^T + mask) v`` over grouped-query heads: queries (B, K, G*S, D), already scaled by
1/sqrt(D), against the K kv heads' (B, K, L, D) keys and values; the scores are viewed as
(B, K, G, S, L) for the (S, L) mask and the softmax (see :meth:`.model.Attention._attend`).

Why a hand-written backward (``bprop``): MindSpore's automatic one differentiates the softmax as
``p * (dp - rowsum(dp * p))``, a reduction over the L keys of a (B, H, S, L) product, from the
probabilities the forward produced. This backward needs only the core's inputs and output: it
recomputes one layer's probabilities at a time and takes the row sums as ``rowsum(dout * out)`` over
the D channels (the same number: ``sum_j p_ij dp_ij = dout_i . sum_j p_ij v_j``), as FlashAttention's
backward does. (On the whole CPU step this did not lower the peak memory: what MindSpore held there was
the broadcasting kernels' workspace, :func:`.layers.expand`.) At the 27.8M-parameter bench size's
shapes one layer's core runs forward + backward in 75-80 ms against 91-100 ms (docs/benchmarks.md);
the gradients are the same up to float32 rounding (2.3e-7 of the largest; the engines' agreement tests
hold them against torch).

With a ``compute`` dtype (mixed precision) every product runs on cast copies in that dtype with a float32
result, as the forward's and as the automatic backward's do; softmax statistics stay float32.
"""

from __future__ import annotations

from mindspore import nn, ops
from mindspore.ops import auto_generate as prims

from mindfoundry.backends.mindspore.layers import cast_matmul, expand


class AttentionCore(nn.Cell):
    """(q, k, v, mask) -> softmax(q k^T + mask) v, (B, K, G*S, D); `group` = G query heads per kv head."""

    def __init__(self, group: int, compute=None):
        super().__init__()
        self.group, self.compute = group, compute
        self.scores_matmul = ops.BatchMatMul(transpose_b=True)  # q k^T, and dout v^T in the backward
        self.probs_matmul = ops.BatchMatMul()  # probs @ v, and dscores @ k
        self.transposed_matmul = ops.BatchMatMul(transpose_a=True)  # probs^T dout and dscores^T q
        self.mask_add, self.softmax = prims.Add(), prims.Softmax(axis=(-1,))

    def probs(self, q, k, mask):
        """softmax(q k^T + mask), (B, K, G*S, L), float32."""
        b, kv, rows, _ = q.shape
        length = k.shape[2]
        scores = cast_matmul(self.scores_matmul, q, k, self.compute)  # (B, K, G*S, L)
        scores = scores.reshape(b, kv, self.group, rows // self.group, length)
        if (
            mask.shape != scores.shape
        ):  # the training forward broadcasts its mask once for all layers (Transformer.tables)
            mask = expand(mask, scores.shape)
        scores = self.mask_add(scores, mask)
        return self.softmax(scores).reshape(b, kv, rows, length)

    def construct(self, q, k, v, mask):
        return cast_matmul(self.probs_matmul, self.probs(q, k, mask), v, self.compute)

    def bprop(self, q, k, v, mask, out, dout):
        """Gradients of q, k and v (the mask is a constant of the ids: zeros) from the recomputed probabilities."""
        probs = self.probs(q, k, mask)
        dv = cast_matmul(self.transposed_matmul, probs, dout, self.compute)  # (B, K, L, D)
        dprobs = cast_matmul(self.scores_matmul, dout, v, self.compute)  # (B, K, G*S, L)
        rowsum = (dout * out).sum(-1, keepdims=True)  # (B, K, G*S, 1): sum over keys of dprobs * probs
        dscores = probs * (dprobs - expand(rowsum, dprobs.shape))
        dq = cast_matmul(self.probs_matmul, dscores, k, self.compute)
        dk = cast_matmul(self.transposed_matmul, dscores, q, self.compute)
        return dq, dk, dv, ops.zeros_like(mask)
