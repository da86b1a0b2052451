"""The decoder-only model as MindSpore Cells.

Attribute paths are the parameter names of :mod:`mindfoundry.model.spec` (MindSpore prefixes each
Parameter with its Cell path), so ``layers.0.attn.q_proj.weight`` here is the same tensor, with the
same ``[out, in]`` layout, as in the PyTorch backend. Parameters are created as zeros and filled
from :func:`mindfoundry.model.spec.init_weights` by the backend.

Shapes in comments: B batch, S sequence, H query heads, K kv heads, D head dim, C d_model, V vocab.

Mixed precision (``train.precision: fp16``, and ``bf16`` on Ascend) lives in the Cells too, in the style of
autocast/O1: with a ``compute`` dtype every matmul (the Linear layers, attention scores and probs @ v, the
tied LM head) casts its inputs and weights to it and its result back to float32; parameters, the
residual stream, RMSNorm, RoPE, softmax and the loss stay float32. Parameter names, Cell paths
and module outputs (float32) are those of the fp32 model, and ``compute=None`` is the fp32 model
op for op.

FlashAttention (``train.flash_attention``, Ascend only: :func:`flash_attention_enabled` decides): the
attention core becomes one ``ops.flash_attention_score`` call on the (B, H, S, D) queries and (B, K, S, D)
keys/values ("BNSD", grouped-query heads read directly, scale 1/sqrt(D)) in the compute dtype, with a
uint8 mask, 1 = hidden: causal runs use sparse_mode 2 (left-up causal) with the kernel's compressed
(2048, 2048) upper triangle; mlm runs sparse_mode 0 with a (B, 1, S, S) mask of the padding keys (each
position keeps itself), the same visibility as the additive mask of the CPU path
(:func:`mindfoundry.model.spec.visible_keys`). Cached decoding keeps the additive path.

Mixture-of-experts blocks (:class:`MoE`, the arithmetic of :mod:`mindfoundry.model.spec`) keep every
shape static for GRAPH_MODE. With ``model.moe.capacity_factor`` the tokens are routed: each expert
gets a buffer of C = capacity rows per sequence, filled by gathering the (position, slot) pairs
routed to it, and the experts run on E*C rows per sequence (:meth:`MoE.routed`). Without a capacity
limit (the default) each expert runs on every token (one batched matmul over the stacked expert
weights, E/top_k times the FFN work of a routed dispatch: the only static shape that never drops a
token) and each token then gathers its top_k expert outputs. Either way the outputs are summed with
the router weights in top-k order, as the torch engine does, and the experts a pair does not reach
get no gradient from it, so the function and its gradients are those of the routed model. The router matmul stays float32 under fp16. The load-
balancing term travels functionally in the compiled step (a Cell cannot hand a value out of a
compiled graph on the side): :meth:`Transformer.forward_aux` returns (logits, aux term) and
:class:`LossCell` adds it. In PYNATIVE (the hooked debug step) the model is called as a Cell, so
every hook fires, and each MoE Cell records its term as an attribute for the LossCell to collect.

Memory options (:mod:`.memory` applies them; the arithmetic never changes): the attention core
(scores, mask, softmax) and the SwiGLU activation run through primitive instances of their own,
which selective recompute marks; full recompute is ``Cell.recompute()`` on the chosen blocks; with
``loss_chunk`` the :class:`LossCell` computes the head and the loss in chunks of positions
(:class:`ChunkNLL`, recomputed in the backward).
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.ops import auto_generate as prims

from mindfoundry.data.dataset.packing import IGNORE_INDEX
from mindfoundry.model.spec import PAD_ID, ModelSpec, chunk_bounds, is_moe_layer, moe_capacity, rope_tables


F16, F32 = ms.float16, ms.float32
#: train.precision -> the matmuls' compute dtype (None: float32 throughout)
COMPUTE_DTYPES = {"fp32": None, "fp16": F16, "bf16": ms.bfloat16}
#: Side of FlashAttentionScore's compressed causal mask (sparse_mode 2), whatever the sequence length.
FLASH_CAUSAL_MASK = 2048


def _zeros(*shape: int) -> Parameter:
    return Parameter(Tensor(np.zeros(shape, dtype=np.float32)), name="weight")


def _matmul(matmul, x, y, compute):
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
        self.weight = _zeros(out_features, in_features)
        self.matmul = ops.MatMul(transpose_b=True)
        self.compute = compute  # None: float32; else the matmul on cast copies in this dtype, float32 result

    def construct(self, x):
        lead = x.shape[:-1]
        y = _matmul(self.matmul, x.reshape(-1, x.shape[-1]), self.weight, self.compute)
        return y.reshape(lead + (y.shape[-1],))


class Embedding(nn.Cell):
    """Token lookup; the table doubles as the output head when embeddings are tied."""

    def __init__(self, vocab_size: int, dim: int):
        super().__init__()
        self.weight = _zeros(vocab_size, dim)

    def construct(self, ids):
        return ops.gather(self.weight, ids, 0)


class RMSNorm(nn.Cell):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = Parameter(Tensor(np.ones(dim, dtype=np.float32)), name="weight")
        self.eps = eps

    def construct(self, x):
        var = ops.mean(x * x, -1, keep_dims=True)
        return x * ops.rsqrt(var + self.eps) * self.weight


def _rotate_half(x):
    mid = x.shape[-1] // 2
    return ops.cat((-x[..., mid:], x[..., :mid]), -1)


class Attention(nn.Cell):
    """Self-attention with RoPE and grouped-query heads under an additive mask: causal (clm) or padding (mlm); with
    ``flash``, FlashAttentionScore under the equivalent uint8 mask (see the module docstring)."""

    def __init__(self, spec: ModelSpec, compute=None, flash: bool = False):
        super().__init__()
        self.flash = flash
        self.sparse_mode = 2 if spec.causal else 0  # left-up causal on the compressed mask, or the full (B, 1, S, S) mask
        self.n_heads, self.n_kv_heads, self.head_dim = spec.n_heads, spec.n_kv_heads, spec.head_dim
        self.q_proj = Linear(spec.d_model, spec.n_heads * spec.head_dim, compute)
        self.k_proj = Linear(spec.d_model, spec.n_kv_heads * spec.head_dim, compute)
        self.v_proj = Linear(spec.d_model, spec.n_kv_heads * spec.head_dim, compute)
        self.o_proj = Linear(spec.n_heads * spec.head_dim, spec.d_model, compute)
        self.scale = 1.0 / float(np.sqrt(spec.head_dim))
        self.compute = compute
        # The attention core's primitives (the ops.matmul / softmax kernels), as instances selective recompute can mark
        self.scores_matmul, self.scale_mul, self.mask_add = ops.BatchMatMul(transpose_b=True), prims.Mul(), prims.Add()
        self.probs_matmul = ops.BatchMatMul()  # transposes as kernel flags: no Transpose ops in the backward
        self.scores_cast, self.softmax = prims.Cast(), prims.Softmax(axis=(-1,))

    def _heads(self, x, n):
        b, s, _ = x.shape
        return x.reshape(b, s, n, self.head_dim).transpose(0, 2, 1, 3)  # (B, n, S, D)

    def construct(self, x, cos, sin, mask):
        b, s, _ = x.shape
        q = self._heads(self.q_proj(x), self.n_heads)  # (B, H, S, D)
        k = self._heads(self.k_proj(x), self.n_kv_heads)  # (B, K, S, D)
        v = self._heads(self.v_proj(x), self.n_kv_heads)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if self.flash:
            out = ops.flash_attention_score(q.astype(self.compute), k.astype(self.compute), v.astype(self.compute), self.n_heads,
                                            attn_mask=mask, scalar_value=self.scale, input_layout="BNSD",
                                            sparse_mode=self.sparse_mode).astype(F32)  # (B, H, S, D)
            return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, s, self.n_heads * self.head_dim))
        return self._attend(q, k, v, mask)

    def _attend(self, q, k, v, mask):
        """softmax(q k^T / sqrt(D) + mask) v over the (B, K, L, D) keys/values, then the output projection.

        Grouped-query heads without copies of the keys/values: query head h = k*G + g uses kv head k, so
        (B, H, S, D) reshapes for free to (B, K, G*S, D) and multiplies the K kv heads directly; scores
        are viewed as (B, K, G, S, L) for the (S, L) mask and the softmax.
        """
        b, _, s, _ = q.shape
        kv, length = k.shape[1], k.shape[2]
        group = self.n_heads // kv
        # 1/sqrt(D) on the queries, not on the D/L times larger scores (exact when D is a power of 4); under fp16 it
        # also keeps q.k far from float16's 65504. Softmax statistics stay float32.
        q = self.scale_mul(q.reshape(b, kv, group * s, self.head_dim), self.scale)
        if self.compute is not None:
            scores = self.scores_cast(self.scores_matmul(q.astype(self.compute), k.astype(self.compute)), F32)
        else:
            scores = self.scores_matmul(q, k)  # (B, K, G*S, L)
        scores = self.mask_add(scores.reshape(b, kv, group, s, length), mask)
        probs = self.softmax(scores).reshape(b, kv, group * s, length)
        out = _matmul(self.probs_matmul, probs, v, self.compute)  # (B, K, G*S, D)
        out = out.reshape(b, self.n_heads, s, self.head_dim).transpose(0, 2, 1, 3).reshape(b, s, self.n_heads * self.head_dim)
        return self.o_proj(out)

    def decode(self, x, cos, sin, mask, write, k_cache, v_cache):
        """x: (1, T, C) new tokens; `write` (T, L) one-hot puts their keys/values into the (1, K, L, D) caches
        (functionally: the updated caches are returned), and `mask` (T, L) hides the positions after each token."""
        q = self._heads(self.q_proj(x), self.n_heads)  # (1, H, T, D)
        k = self._heads(self.k_proj(x), self.n_kv_heads)  # (1, K, T, D)
        v = self._heads(self.v_proj(x), self.n_kv_heads)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        keep = (1.0 - write.sum(0)).reshape(1, 1, -1, 1)  # positions not written now keep their cached values
        k_cache = k_cache * keep + ops.matmul(write.transpose(1, 0), k)  # (L, T) @ (1, K, T, D) -> (1, K, L, D)
        v_cache = v_cache * keep + ops.matmul(write.transpose(1, 0), v)
        return self._attend(q, k_cache, v_cache, mask), k_cache, v_cache


class MLP(nn.Cell):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, spec: ModelSpec, compute=None):
        super().__init__()
        self.gate_proj = Linear(spec.d_model, spec.ffn_dim, compute)
        self.up_proj = Linear(spec.d_model, spec.ffn_dim, compute)
        self.down_proj = Linear(spec.ffn_dim, spec.d_model, compute)
        self.silu = prims.SiLU()  # an instance selective recompute can mark

    def construct(self, x):
        return self.down_proj(self.silu(self.gate_proj(x)) * self.up_proj(x))


class GroupedLinear(nn.Cell):
    """E stacked [out, in] matrices applied batch-wise: (E, N, in) -> (E, N, out)."""

    def __init__(self, num_experts: int, in_features: int, out_features: int, compute=None):
        super().__init__()
        self.weight = _zeros(num_experts, out_features, in_features)
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
        out = (gates.reshape(n, k, 1) * picked).sum(1)
        routed = ops.stop_gradient(ops.one_hot(top_e.reshape(-1), self.num_experts, Tensor(1.0, F32), Tensor(0.0, F32)).sum(0))
        aux = self.num_experts * ((routed / n) * probs.sum(0)).sum()
        return out.reshape(b, s, c), aux


    def routed(self, x, top_e, capacity: int):
        """Each (position, slot) pair through its expert with a per-sequence capacity: (B, S, C) -> (B, S, k, C), a
        dropped pair's row zero. Static shapes: every expert gets a buffer of `capacity` rows per sequence.

        Slots are ordered by priority (all first choices, then all second choices; positions in order); a pair's place
        in its expert's buffer is the number of earlier pairs routed there, and pairs past the capacity go to a dump
        row. The buffers are filled by a gather (each cell's source position, scattered as integers; empty cells read
        an appended zero row) and read back by a gather, so the gradient flows to exactly the kept pairs. The experts run
        on (E, B * capacity, C) rows instead of (E, B * S, C): under expert parallelism the semi-auto compiler turns
        the change from token-split to expert-split rows into an AlltoAll.
        """
        b, s, c = x.shape
        k, e = self.top_k, self.num_experts
        slots = top_e.transpose(0, 2, 1).reshape(b, k * s)  # priority order: slot j of position t is j*S + t
        hot = ops.one_hot(slots, e, Tensor(1.0, F32), Tensor(0.0, F32))  # (B, kS, E); counts stay exact below 2**24
        place = ((ops.cumsum(hot, 1) - hot) * hot).sum(-1).astype(ms.int32)  # earlier pairs to the same expert
        dest = ops.stop_gradient(ops.where(place < capacity, slots * capacity + place, e * capacity))  # (B, kS); e*cap = dropped
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


class Block(nn.Cell):
    """Pre-norm residual block."""

    def __init__(self, spec: ModelSpec, compute=None, moe: bool = False, flash: bool = False):
        super().__init__()
        self.attn_norm = RMSNorm(spec.d_model, spec.norm_eps)
        self.attn = Attention(spec, compute, flash)
        self.mlp_norm = RMSNorm(spec.d_model, spec.norm_eps)
        self.mlp = MoE(spec, compute) if moe else MLP(spec, compute)
        self.moe = moe

    def construct(self, x, cos, sin, mask):
        x = x + self.attn(self.attn_norm(x), cos, sin, mask)
        return x + self.mlp(self.mlp_norm(x))

    def decode(self, x, cos, sin, mask, write, k_cache, v_cache):
        h, k_cache, v_cache = self.attn.decode(self.attn_norm(x), cos, sin, mask, write, k_cache, v_cache)
        x = x + h
        return x + self.mlp(self.mlp_norm(x)), k_cache, v_cache

    def forward_aux(self, x, cos, sin, mask):
        """A MoE block's (output, N * aux)."""
        x = x + self.attn(self.attn_norm(x), cos, sin, mask)
        y, aux = self.mlp.forward_aux(self.mlp_norm(x))
        return x + y, aux


class Transformer(nn.Cell):
    """Token ids (B, S) -> logits (B, S, V), float32; causal (clm) or bidirectional over the non-padding keys (mlm).

    `precision` is ``train.precision``: 'fp32', or 'fp16' / 'bf16' (Ascend) for matmuls in that dtype (see the module
    docstring); `flash` runs the attention core through FlashAttentionScore (Ascend, fp16/bf16).
    """

    def __init__(self, spec: ModelSpec, precision: str = "fp32", flash: bool = False):
        super().__init__()
        if precision not in COMPUTE_DTYPES:
            raise ValueError(f"train.precision={precision!r} is not available in the MindSpore model: use one of {sorted(COMPUTE_DTYPES)}")
        compute = COMPUTE_DTYPES[precision]
        if flash and compute is None:
            raise ValueError("FlashAttentionScore computes in float16 or bfloat16: set train.precision to fp16 or bf16")
        self.spec, self.compute, self.flash = spec, compute, flash
        self.embed = Embedding(spec.vocab_size, spec.d_model)
        self.layers = nn.CellList([Block(spec, compute, is_moe_layer(spec, i), flash) for i in range(spec.n_layers)])
        self.moe = spec.num_experts > 0
        self.aux_scale = spec.moe_aux_loss_weight / max(1, sum(is_moe_layer(spec, i) for i in range(spec.n_layers)))
        self.norm = RMSNorm(spec.d_model, spec.norm_eps)
        self.lm_head = None if spec.tie_embeddings else Linear(spec.d_model, spec.vocab_size, compute)
        cos, sin = rope_tables(spec, spec.max_seq_len)
        self.cos, self.sin = Tensor(cos), Tensor(sin)  # (S_max, D) constants, not parameters
        self.causal = spec.causal
        if self.causal:
            self.mask_table = Tensor(np.triu(np.full((spec.max_seq_len, spec.max_seq_len), -1e9, dtype=np.float32), 1))
        else:  # -1e9 on the padding keys, except on the diagonal (each position sees itself): model/spec.py visible_keys
            self.mask_table = Tensor(1.0 - np.eye(spec.max_seq_len, dtype=np.float32))
        if flash:  # FlashAttentionScore's uint8 masks (1 = hidden): the compressed causal triangle, or the off-diagonal
            size = FLASH_CAUSAL_MASK if self.causal else spec.max_seq_len
            self.flash_table = Tensor(np.triu(np.ones((size, size), np.uint8), 1) if self.causal else 1 - np.eye(size, dtype=np.uint8))
        self.head_matmul = ops.MatMul(transpose_b=True)

    def tables(self, ids):
        """RoPE cos/sin and the attention mask for the (B, S) batch `ids`: the additive causal (S, S) constant, or
        (mlm) -1e9 on the padding keys (B, 1, 1, S, S), broadcast over the kv heads and query groups of _attend; with
        flash, FlashAttentionScore's uint8 mask (the (2048, 2048) causal triangle, or (B, 1, S, S) padding keys)."""
        b, s = ids.shape
        if self.flash:
            if self.causal:
                return self.cos[:s], self.sin[:s], self.flash_table
            return self.cos[:s], self.sin[:s], (ids == PAD_ID).astype(ms.uint8).reshape(b, 1, 1, s) * self.flash_table[:s, :s]
        if self.causal:
            return self.cos[:s], self.sin[:s], self.mask_table[:s, :s]
        padding = (ids == PAD_ID).astype(F32).reshape(b, 1, 1, 1, s) * -1e9
        return self.cos[:s], self.sin[:s], padding * self.mask_table[:s, :s]

    def construct(self, ids):
        cos, sin, mask = self.tables(ids)
        x = self.embed(ids)  # (B, S, C)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.head(x)

    def forward_aux(self, ids):
        """(logits, aux_loss_weight * mean over MoE blocks of N * aux): the compiled training forward of a MoE model.

        Called as a method, so the hooks of the root and of the MoE blocks and their ``mlp`` would not
        fire on this path: the hooked (PYNATIVE) debug step uses :meth:`forward_recording_aux`.
        """
        x, aux = self.body(ids)
        return self.head(x), aux

    def body(self, ids):
        """(hidden states before the final norm [B, S, C], the MoE term of forward_aux; 0.0 for a dense model)."""
        cos, sin, mask = self.tables(ids)
        x = self.embed(ids)
        aux = 0.0
        for layer in self.layers:
            if layer.moe:
                x, part = layer.forward_aux(x, cos, sin, mask)
                aux = aux + part
            else:
                x = layer(x, cos, sin, mask)
        return x, aux * self.aux_scale

    def head_weight(self):
        """The output head's [V, C] matrix: the embedding when tied."""
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    def forward_recording_aux(self, ids):
        """What forward_aux returns, computed by calling the model as a Cell so that every hook fires.

        PYNATIVE only (the MoE Cells hand their terms over as attributes, which a graph cannot do).
        """
        moe = [layer.mlp for layer in self.layers if layer.moe]
        for cell in moe:
            cell.record_aux = True
        try:
            logits = self(ids)
            aux = 0.0
            for cell in moe:
                aux = aux + cell.aux
            return logits, aux * self.aux_scale
        finally:
            for cell in moe:
                cell.record_aux, cell.aux = False, None

    def head(self, x):
        """Final norm and output head: (B, S, C) -> logits (B, S, V)."""
        s = x.shape[1]
        x = self.norm(x)
        if self.lm_head is None:
            flat = _matmul(self.head_matmul, x.reshape(-1, x.shape[-1]), self.embed.weight, self.compute)
            return flat.reshape(x.shape[0], s, -1)
        return self.lm_head(x)


def eval_sums(logits, labels):
    """(summed loss, scored tokens, correct top-1 predictions) over labels != IGNORE_INDEX, float32 scalars."""
    nll, valid = token_nll(logits, labels)
    hits = (ops.argmax(logits, -1).reshape(-1) == labels.reshape(-1).astype(ms.int32)).astype(F32) * valid
    return nll.sum(), valid.sum(), hits.sum()


def token_nll(logits, labels):
    """Per-token negative log-likelihood (B*S,) and validity mask; IGNORE_INDEX labels score 0.

    Computed in float32 with max-subtraction; labels are clamped before the gather so ignored
    positions index a valid row and are then zeroed by the mask.
    """
    flat = logits.reshape(-1, logits.shape[-1]).astype(ms.float32)
    target = labels.reshape(-1)
    valid = (target != IGNORE_INDEX).astype(ms.float32)
    peak = ops.stop_gradient(flat.max(axis=-1, keepdims=True))
    lse = ops.log(ops.exp(flat - peak).sum(-1)) + peak.squeeze(-1)
    picked = ops.gather_elements(flat, 1, ops.maximum(target, 0).reshape(-1, 1)).squeeze(-1)
    return (lse - picked) * valid, valid


class ChunkNLL(nn.Cell):
    """The summed token loss of one chunk of positions: its logits (x W^T, as the model's head computes them) and
    token_nll. One instance serves every chunk; with recompute set its logits are recomputed in the backward."""

    def __init__(self, compute):
        super().__init__()
        self.matmul = ops.MatMul(transpose_b=True)
        self.compute = compute

    def construct(self, x, weight, labels):
        nll, _ = token_nll(_matmul(self.matmul, x.reshape(-1, x.shape[-1]), weight, self.compute), labels)
        return nll.sum()


class LossCell(nn.Cell):
    """Model + masked next-token loss: sum over valid tokens times `scale` (1/valid tokens of the global batch).

    With ``loss_chunk`` > 0 (training sequences of ``seq_len`` positions) the final norm's output goes through
    the head and the loss in chunks of that many positions (:func:`mindfoundry.model.spec.chunk_bounds`).
    """

    def __init__(self, model: Transformer, loss_chunk: int = 0, seq_len: int = 0):
        super().__init__(auto_prefix=False)
        self.model = model
        self.moe = model.moe
        self.eager = ms.get_context("mode") == ms.PYNATIVE_MODE  # the debug step's LossCell is built in PYNATIVE
        self.bounds = tuple(chunk_bounds(seq_len, loss_chunk)) if loss_chunk else ()
        self.chunk_nll = ChunkNLL(model.compute)

    def construct(self, ids, labels, scale):
        if self.bounds:
            x, aux = self.model.body(ids)
            x, weight = self.model.norm(x), self.model.head_weight()
            total = 0.0
            for a, b in self.bounds:
                total = total + self.chunk_nll(x[:, a:b], weight, labels[:, a:b])
            return (total + aux) * scale
        if self.moe:  # the load-balancing term joins the token sum (see model/spec.py)
            if self.eager:
                logits, aux = self.model.forward_recording_aux(ids)
            else:
                logits, aux = self.model.forward_aux(ids)
            nll, _ = token_nll(logits, labels)
            return (nll.sum() + aux) * scale
        nll, _ = token_nll(self.model(ids), labels)
        return nll.sum() * scale


class CachedDecode(nn.Cell):
    """One cached decoding step, compiled once per number of new tokens T (the cache length L is fixed):
    (ids (1, T), positions (T,), write (T, L), mask (T, L), key caches, value caches) -> (logits (1, T, V),
    the updated caches). The host builds `write` and `mask` from the positions, so no shape depends on them."""

    def __init__(self, model: Transformer):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, ids, positions, write, mask, k_caches, v_caches):
        m = self.model
        cos, sin = ops.gather(m.cos, positions, 0), ops.gather(m.sin, positions, 0)
        x = m.embed(ids)
        new_k, new_v = (), ()
        for i in range(len(m.layers)):
            x, k, v = m.layers[i].decode(x, cos, sin, mask, write, k_caches[i], v_caches[i])
            new_k, new_v = new_k + (k,), new_v + (v,)
        return m.head(x), new_k, new_v
