"""Mixture-of-experts blocks as MindSpore Cells (:class:`MoE`, the arithmetic of :mod:`mindfoundry.model.spec`).

Every shape is static for GRAPH_MODE. With ``model.moe.capacity_factor`` the tokens are routed: each expert
gets a buffer of C = capacity rows per sequence, filled by gathering the (position, slot) pairs
routed to it, and the experts run on E*C rows per sequence (:meth:`MoE.routed`). Without a capacity
limit (the default) each expert runs on every token (one batched matmul over the stacked expert
weights, E/top_k times the FFN work of a routed dispatch: the only static shape that never drops a
token) and each token then gathers its top_k expert outputs. Either way the outputs are summed with
the router weights in top-k order, as the torch engine does, and the experts a pair does not reach
get no gradient from it, so the function and its gradients are those of the routed model. The router
matmul stays float32 under fp16. The load-balancing term travels functionally in the compiled step (a Cell cannot hand a
value out of a compiled graph on the side): :meth:`.model.Transformer.forward_aux` returns (logits, aux term) and
:class:`~.model.LossCell` adds it. In PYNATIVE (the hooked debug step) the model is called as a Cell, so
every hook fires, and each MoE Cell records its term as an attribute for the LossCell to collect.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import Tensor, nn, ops
from mindspore.ops import auto_generate as prims

from mindfoundry.backends.mindspore.layers import F32, Linear, expand, zeros_weight
from mindfoundry.model.spec import ModelSpec, moe_capacity


class GroupedLinear(nn.Cell):
    """E stacked [out, in] matrices applied batch-wise: (E, N, in) -> (E, N, out)."""

    def __init__(self, num_experts: int, in_features: int, out_features: int, compute=None):
        super().__init__()
        self.weight = zeros_weight(num_experts, out_features, in_features)
        self.bmm = ops.BatchMatMul(transpose_b=True)
        self.compute = compute

    def construct(self, x):
        if self.compute is not None:
            return self.bmm(x.astype(self.compute), self.weight.astype(self.compute)).astype(F32)
        return self.bmm(x, self.weight)


class Experts(nn.Cell):
    """E SwiGLU experts, each on every token: (N, C) -> (E, N, C)."""

    def __init__(self, spec: ModelSpec, compute=None):
        super().__init__()
        e, c, f = spec.num_experts, spec.d_model, spec.ffn_dim
        self.num_experts = e
        self.gate_proj = GroupedLinear(e, c, f, compute)
        self.up_proj = GroupedLinear(e, c, f, compute)
        self.down_proj = GroupedLinear(e, f, c, compute)
        self.silu = prims.SiLU()  # an instance selective recompute can mark

    def construct(self, x):
        n, c = x.shape
        return self.grouped(ops.broadcast_to(x.reshape(1, n, c), (self.num_experts, n, c)))

    def grouped(self, xe):
        """Expert e on row block xe[e]: (E, M, C) -> (E, M, C)."""
        return self.down_proj(self.silu(self.gate_proj(xe)) * self.up_proj(xe))


class MoE(nn.Cell):
    """Top-k softmax router + SwiGLU experts (see model/spec.py for the definition, capacity included)."""

    def __init__(self, spec: ModelSpec, compute=None):
        super().__init__()
        self.num_experts, self.top_k = spec.num_experts, spec.moe_top_k
        self.spec = spec
        self.router = Linear(spec.d_model, spec.num_experts)  # float32 even under fp16: routing decisions
        self.experts = Experts(spec, compute)
        self.record_aux = False  # True only around an eager training forward (Transformer.forward_recording_aux)
        self.aux = None

    def construct(self, x):
        y, aux = self.forward_aux(x)
        if self.record_aux:  # PYNATIVE only: a compiled graph never takes this branch (record_aux is False there)
            self.aux = aux
        return y

    def forward_aux(self, x):
        """(output [B, S, C], this block's N * aux) for the N = B*S tokens of x."""
        b, s, c = x.shape
        n, k = b * s, self.top_k
        tokens = x.reshape(n, c)
        probs = ops.softmax(self.router(tokens), -1)  # (N, E)
        top_p, top_e = ops.topk(probs, k)  # (N, k), largest first
        gates = top_p / top_p.sum(-1, keepdims=True)
        capacity = moe_capacity(self.spec, s)  # a Python int: shapes are static in the compiled graph
        if capacity is None:
            every = self.experts(tokens).transpose(1, 0, 2)  # (N, E, C)
            picked = ops.gather_elements(every, 1, ops.broadcast_to(top_e.reshape(n, k, 1), (n, k, c)))  # (N, k, C)
        else:
            picked = self.routed(x, top_e.reshape(b, s, k), capacity).reshape(n, k, c)
        out = (expand(gates.reshape(n, k, 1), picked.shape) * picked).sum(1)
        routed = ops.stop_gradient(
            ops.one_hot(top_e.reshape(-1), self.num_experts, Tensor(1.0, F32), Tensor(0.0, F32)).sum(0)
        )
        aux = self.num_experts * ((routed / n) * probs.sum(0)).sum()
        return out.reshape(b, s, c), aux

    def routed(self, x, top_e, capacity: int):
        """Each (position, slot) pair through its expert with a per-sequence capacity: (B, S, C) -> (B, S, k, C), a
        dropped pair's row zero. Static shapes: every expert gets a buffer of `capacity` rows per sequence.

        Slots are ordered by priority (all first choices, then all second choices; positions in order); a pair's place
        in its expert's buffer is the number of earlier pairs routed there, and pairs past the capacity go to a dump
        row. The buffers are filled by a gather (each cell's source position, scattered as integers; empty cells read
        an appended zero row) and read back by a gather, so the gradient flows to exactly the kept pairs. The experts
        run on (E, B * capacity, C) rows instead of (E, B * S, C): under expert parallelism the semi-auto compiler turns
        the change from token-split to expert-split rows into an AlltoAll.
        """
        b, s, c = x.shape
        k, e = self.top_k, self.num_experts
        slots = top_e.transpose(0, 2, 1).reshape(b, k * s)  # priority order: slot j of position t is j*S + t
        hot = ops.one_hot(slots, e, Tensor(1.0, F32), Tensor(0.0, F32))  # (B, kS, E); counts stay exact below 2**24
        place = ((ops.cumsum(hot, 1) - hot) * hot).sum(-1).astype(ms.int32)  # earlier pairs to the same expert
        dest = ops.stop_gradient(
            ops.where(place < capacity, slots * capacity + place, e * capacity)
        )  # (B, kS); e*cap = dropped
        position = ops.broadcast_to((ops.arange(k * s, dtype=ms.int32) % s).reshape(1, k * s), (b, k * s))
        source = ops.tensor_scatter_elements(ops.full((b, e * capacity + 1), s, dtype=ms.int32), dest, position, 1)
        source = ops.stop_gradient(source[:, :e * capacity])  # (B, E*cap): the position each cell holds (s: empty)
        rows = ops.gather_elements(ops.concat([x, ops.zeros((b, 1, c), F32)], 1), 1,
                                   ops.broadcast_to(source.reshape(b, e * capacity, 1), (b, e * capacity, c)))
        out = self.experts.grouped(rows.reshape(b, e, capacity, c).transpose(1, 0, 2, 3).reshape(e, b * capacity, c))
        out = out.reshape(e, b, capacity, c).transpose(1, 0, 2, 3).reshape(b, e * capacity, c)
        picked = ops.gather_elements(ops.concat([out, ops.zeros((b, 1, c), F32)], 1), 1,
                                     ops.broadcast_to(dest.reshape(b, k * s, 1), (b, k * s, c)))  # (B, kS, C)
        return picked.reshape(b, k, s, c).transpose(0, 2, 1, 3)
