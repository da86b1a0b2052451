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

Mixture-of-experts blocks are :mod:`.moe`'s (routed with a capacity limit, else every expert on every
token).

The dense attention core (:mod:`.attention`) and RMSNorm (:mod:`.norm`) differentiate through backwards of their
own, and every binary op on unequal shapes broadcasts first (:func:`.layers.expand`): MindSpore's CPU kernels
are slow or hold memory otherwise (docs/benchmarks.md).

Memory options (:mod:`.memory` applies them; the arithmetic never changes): the SwiGLU activation runs through
a primitive instance of its own, which selective recompute marks (the attention core always recomputes its
probabilities in its backward); full recompute is ``Cell.recompute()`` on the chosen blocks; with
``loss_chunk`` the :class:`LossCell` computes the head and the loss in chunks of positions
(:class:`ChunkNLL`, recomputed in the backward).
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops
from mindspore.ops import auto_generate as prims

from mindfoundry.backends.mindspore.attention import AttentionCore
from mindfoundry.backends.mindspore.layers import F16, F32, Linear, cast_matmul, expand, zeros_weight
from mindfoundry.backends.mindspore.moe import MoE
from mindfoundry.backends.mindspore.norm import RMSNorm
from mindfoundry.data.dataset.packing import IGNORE_INDEX
from mindfoundry.model.spec import PAD_ID, ModelSpec, chunk_bounds, is_moe_layer, rope_tables

#: train.precision -> the matmuls' compute dtype (None: float32 throughout)
COMPUTE_DTYPES = {"fp32": None, "fp16": F16, "bf16": ms.bfloat16}
#: Side of FlashAttentionScore's compressed causal mask (sparse_mode 2), whatever the sequence length.
FLASH_CAUSAL_MASK = 2048


class Embedding(nn.Cell):
    """Token lookup; the table doubles as the output head when embeddings are tied."""

    def __init__(self, vocab_size: int, dim: int):
        super().__init__()
        self.weight = zeros_weight(vocab_size, dim)

    def construct(self, ids):
        return ops.gather(self.weight, ids, 0)


def _rotate_half(x):
    mid = x.shape[-1] // 2
    return ops.cat((-x[..., mid:], x[..., :mid]), -1)


def rope(x, cos, sin):
    """x (B, n, S, D) rotated by the (S, D) tables."""
    return x * expand(cos, x.shape) + _rotate_half(x) * expand(sin, x.shape)


class Attention(nn.Cell):
    """Self-attention with RoPE and grouped-query heads under an additive mask: causal (clm) or padding (mlm); with
    ``flash``, FlashAttentionScore under the equivalent uint8 mask (see the module docstring)."""

    def __init__(self, spec: ModelSpec, compute=None, flash: bool = False):
        super().__init__()
        self.flash = flash
        self.sparse_mode = (
            2 if spec.causal else 0
        )  # left-up causal on the compressed mask, or the full (B, 1, S, S) mask
        self.n_heads, self.n_kv_heads, self.head_dim = spec.n_heads, spec.n_kv_heads, spec.head_dim
        self.q_proj = Linear(spec.d_model, spec.n_heads * spec.head_dim, compute)
        self.k_proj = Linear(spec.d_model, spec.n_kv_heads * spec.head_dim, compute)
        self.v_proj = Linear(spec.d_model, spec.n_kv_heads * spec.head_dim, compute)
        self.o_proj = Linear(spec.n_heads * spec.head_dim, spec.d_model, compute)
        self.scale = 1.0 / float(np.sqrt(spec.head_dim))
        self.compute = compute
        # Held outside the Cell tree, so that module paths (hooks, dumps) stay the torch model's: it has no parameters.
        object.__setattr__(self, "core", AttentionCore(spec.n_heads // spec.n_kv_heads, compute))

    def _heads(self, x, n):
        b, s, _ = x.shape
        return x.reshape(b, s, n, self.head_dim).transpose(0, 2, 1, 3)  # (B, n, S, D)

    def construct(self, x, cos, sin, mask):
        b, s, _ = x.shape
        q = self._heads(self.q_proj(x), self.n_heads)  # (B, H, S, D)
        k = self._heads(self.k_proj(x), self.n_kv_heads)  # (B, K, S, D)
        v = self._heads(self.v_proj(x), self.n_kv_heads)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        if self.flash:
            out = ops.flash_attention_score(
                q.astype(self.compute),
                k.astype(self.compute),
                v.astype(self.compute),
                self.n_heads,
                attn_mask=mask,
                scalar_value=self.scale,
                input_layout="BNSD",
                sparse_mode=self.sparse_mode,
            ).astype(F32)  # (B, H, S, D)
            return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, s, self.n_heads * self.head_dim))
        return self._attend(q, k, v, mask)

    def _attend(self, q, k, v, mask):
        """softmax(q k^T / sqrt(D) + mask) v over the (B, K, L, D) keys/values, then the output projection.

        Grouped-query heads without copies of the keys/values: query head h = k*G + g uses kv head k, so
        (B, H, S, D) reshapes for free to (B, K, G*S, D) and multiplies the K kv heads directly; scores
        are viewed as (B, K, G, S, L) for the (S, L) mask and the softmax (:class:`.attention.AttentionCore`).
        """
        b, _, s, _ = q.shape
        kv = k.shape[1]
        # 1/sqrt(D) on the queries, not on the D/L times larger scores (exact when D is a power of 4); under fp16 it
        # also keeps q.k far from float16's 65504. Softmax statistics stay float32.
        q = q.reshape(b, kv, (self.n_heads // kv) * s, self.head_dim) * self.scale
        out = self.core(q, k, v, mask)  # (B, K, G*S, D): .attention's core, whose backward recomputes the probabilities
        out = (
            out.reshape(b, self.n_heads, s, self.head_dim)
            .transpose(0, 2, 1, 3)
            .reshape(b, s, self.n_heads * self.head_dim)
        )
        return self.o_proj(out)

    def decode(self, x, cos, sin, mask, write, k_cache, v_cache):
        """x: (1, T, C) new tokens; `write` (T, L) one-hot puts their keys/values into the (1, K, L, D) caches
        (functionally: the updated caches are returned), and `mask` (T, L) hides the positions after each token."""
        q = self._heads(self.q_proj(x), self.n_heads)  # (1, H, T, D)
        k = self._heads(self.k_proj(x), self.n_kv_heads)  # (1, K, T, D)
        v = self._heads(self.v_proj(x), self.n_kv_heads)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
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
            raise ValueError(
                f"train.precision={precision!r} is not available in the MindSpore model: use one of "
                f"{sorted(COMPUTE_DTYPES)}"
            )
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
        # -1e9 on the padding keys, except on the diagonal (each position sees itself): model/spec.py visible_keys
        else:
            self.mask_table = Tensor(1.0 - np.eye(spec.max_seq_len, dtype=np.float32))
        if flash:  # FlashAttentionScore's uint8 masks (1 = hidden): the compressed causal triangle, or the off-diagonal
            size = FLASH_CAUSAL_MASK if self.causal else spec.max_seq_len
            self.flash_table = Tensor(
                np.triu(np.ones((size, size), np.uint8), 1) if self.causal else 1 - np.eye(size, dtype=np.uint8)
            )
        self.head_matmul = ops.MatMul(transpose_b=True)

    def tables(self, ids):
        """RoPE cos/sin and the attention mask for the (B, S) batch `ids`: the additive causal (S, S) constant, or
        (mlm) -1e9 on the padding keys, broadcast to the (B, K, G, S, S) scores of _attend; with
        flash, FlashAttentionScore's uint8 mask (the (2048, 2048) causal triangle, or (B, 1, S, S) padding keys)."""
        b, s = ids.shape
        if self.causal:
            return self.causal_tables(b, s)
        if self.flash:
            return (
                self.cos[:s],
                self.sin[:s],
                (ids == PAD_ID).astype(ms.uint8).reshape(b, 1, 1, s) * self.flash_table[:s, :s],
            )
        mask = (ids == PAD_ID).astype(F32).reshape(b, 1, 1, 1, s) * -1e9 * self.mask_table[:s, :s]
        return self.cos[:s], self.sin[:s], self._scores_shaped(mask, b, s)

    def causal_tables(self, b, s):
        """:meth:`tables` of a causal model for any (B, S) input: they depend on its shape alone."""
        if self.flash:
            return self.cos[:s], self.sin[:s], self.flash_table
        return self.cos[:s], self.sin[:s], self._scores_shaped(self.mask_table[:s, :s], b, s)

    def _scores_shaped(self, mask, b, s):
        """A mask broadcast once to the (B, K, G, S, S) scores, not in each layer's forward and recomputation
        (layers.expand)."""
        kv = self.spec.n_kv_heads
        return expand(mask, (b, kv, self.spec.n_heads // kv, s, s))

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
            flat = cast_matmul(self.head_matmul, x.reshape(-1, x.shape[-1]), self.embed.weight, self.compute)
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
    lse = ops.log(ops.exp(flat - expand(peak, flat.shape)).sum(-1)) + peak.squeeze(-1)
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
        nll, _ = token_nll(cast_matmul(self.matmul, x.reshape(-1, x.shape[-1]), weight, self.compute), labels)
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
