"""The decoder-only model as torch Modules — the mirror of backends/mindspore/model.py.

Module paths give exactly the parameter names of :mod:`mindfoundry.model.spec`, with the same
``[out, in]`` layouts, so one safetensors file loads into either engine. RoPE tables are
non-persistent buffers (not part of the state dict), as in the MindSpore model where they are
constants. Attention runs through ``scaled_dot_product_attention`` (flash / memory-efficient
kernels where the device has them).

Mixture-of-experts blocks (:class:`MoE`, the arithmetic of :mod:`mindfoundry.model.spec`) send
each token to its top_k experts: the (token, slot) pairs are sorted by expert and every expert runs
one matmul chain over its rows. Dispatch goes through :meth:`MoE.dispatch`, which expert
parallelism (:mod:`.expert_parallel`) replaces by an all-to-all exchange. The load-balancing term
of the last training forward is read with :func:`aux_loss_sum`.

Memory options (:mod:`.memory` sets them; the arithmetic never changes): a block with
``recompute == "full"`` keeps only its input and runs its forward again in the backward; with
``"selective"`` its attention core and SwiGLU activation run under ``torch.utils.checkpoint`` (their
inputs and outputs kept, what is inside recomputed); ``loss_chunk`` > 0 makes a forward given labels
compute the head and the loss over chunks of that many positions (:mod:`.chunked_loss`), so one
chunk's logits exist at a time.

Shapes in comments: B batch, S sequence, H query heads, K kv heads, D head dim, C d_model, V vocab,
N tokens (B*S), E experts, k top_k.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

from mindfoundry.backends.torch.chunked_loss import chunked_nll
from mindfoundry.backends.torch.distributed import full_value
from mindfoundry.data.dataset.packing import IGNORE_INDEX
from mindfoundry.model.spec import PAD_ID, ModelSpec, is_moe_layer, moe_capacity, rope_tables


def recomputable(fn: Callable[..., torch.Tensor], recompute: bool, *args: torch.Tensor | None) -> torch.Tensor:
    """fn(*args), recomputed in the backward instead of keeping its intermediates when `recompute` and training."""
    if recompute and torch.is_grad_enabled():
        return checkpoint(fn, *args, use_reentrant=False)
    return fn(*args)


def _swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), -1)


class Attention(nn.Module):
    """Self-attention with RoPE and grouped-query heads: causal, or (``visible`` given: mlm) over the visible keys."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = spec.n_heads, spec.n_kv_heads, spec.head_dim
        self.q_proj = nn.Linear(spec.d_model, spec.n_heads * spec.head_dim, bias=False)
        self.k_proj = nn.Linear(spec.d_model, spec.n_kv_heads * spec.head_dim, bias=False)
        self.v_proj = nn.Linear(spec.d_model, spec.n_kv_heads * spec.head_dim, bias=False)
        self.o_proj = nn.Linear(spec.n_heads * spec.head_dim, spec.d_model, bias=False)
        # None: causal SDPA over the local sequence. Context parallelism swaps in its own
        # core(q, k, v, expand_kv) -> (B, H, S, D) (k, v with the K kv heads; see context_parallel.py).
        self.core = None
        self.recompute_core = False  # selective recompute (memory.recompute: selective)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        b, s, _ = x.shape
        return x.view(b, s, n, self.head_dim).transpose(1, 2)  # (B, n, S, D)

    def _expand_kv(self, x: torch.Tensor) -> torch.Tensor:
        """(B, K, S, D) -> (B, H, S, D): each kv head serves H/K consecutive query heads."""
        if self.n_kv_heads == self.n_heads:
            return x
        b, k, s, d = x.shape
        rep = self.n_heads // self.n_kv_heads
        return x[:, :, None].expand(b, k, rep, s, d).reshape(b, k * rep, s, d)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, visible: torch.Tensor | None = None
    ) -> torch.Tensor:
        b, s, _ = x.shape
        q = self._heads(self.q_proj(x), self.n_heads)  # (B, H, S, D)
        k = self._heads(self.k_proj(x), self.n_kv_heads)  # (B, K, S, D)
        v = self._heads(self.v_proj(x), self.n_kv_heads)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        out = recomputable(self._core, self.recompute_core, q, k, v, visible)  # (B, H, S, D)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, self.n_heads * self.head_dim))

    def _core(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor | None = None
    ) -> torch.Tensor:
        gqa = (
            self.n_kv_heads != self.n_heads
        )  # SDPA reads each kv head for its H/K query heads itself: no expanded copies
        if visible is not None:  # (B, 1, S, S) bool, mlm
            return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, enable_gqa=gqa)
        if self.core is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        return self.core(q, k, v, self._expand_kv)

    def decode(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor],
               positions: torch.Tensor) -> torch.Tensor:
        """x: (1, T, C) tokens at `positions` (T,); their keys/values are written into `cache` ((1, K, L, D) each,
        in place) and each query attends the cached positions up to its own (the rest is masked)."""
        b, s, _ = x.shape
        q = self._heads(self.q_proj(x), self.n_heads)  # (1, H, T, D)
        k = self._heads(self.k_proj(x), self.n_kv_heads)  # (1, K, T, D)
        v = self._heads(self.v_proj(x), self.n_kv_heads)
        q = q * cos + _rotate_half(q) * sin
        cache[0][:, :, positions] = k * cos + _rotate_half(k) * sin
        cache[1][:, :, positions] = v
        visible = positions[:, None] >= torch.arange(cache[0].shape[2], device=x.device)[None]  # (T, L)
        out = F.scaled_dot_product_attention(q, self._expand_kv(cache[0]), self._expand_kv(cache[1]), attn_mask=visible)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, self.n_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.gate_proj = nn.Linear(spec.d_model, spec.ffn_dim, bias=False)
        self.up_proj = nn.Linear(spec.d_model, spec.ffn_dim, bias=False)
        self.down_proj = nn.Linear(spec.ffn_dim, spec.d_model, bias=False)
        self.recompute_act = False  # selective recompute: silu(gate) * up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(recomputable(_swiglu, self.recompute_act, self.gate_proj(x), self.up_proj(x)))


class _SumGradient(torch.autograd.Function):
    """Identity forward; the backward sums the gradient over a process group (expert replicas under HSDP)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        torch.distributed.all_reduce(grad, group=ctx.group)
        return grad, None


class GroupedLinear(nn.Module):
    """E stacked [out, in] matrices; rows of the input grouped by expert, ``counts[e]`` rows for expert e.

    Under expert parallelism the weight is a DTensor sharded along dim 0 and this rank runs its
    local experts (``counts`` then has one entry per local expert); ``grad_group`` (expert
    replicas, HSDP) sums their gradients.
    """

    def __init__(self, num_experts: int, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_experts, out_features, in_features))  # filled by load_weights
        self.grad_group = None

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        w = self.weight
        if isinstance(w, DTensor):
            w = w.to_local()
            if self.grad_group is not None:
                w = _SumGradient.apply(w, self.grad_group)
        return torch.cat([F.linear(rows, w[e]) for e, rows in enumerate(x.split(counts))])


class Experts(nn.Module):
    """E SwiGLU experts on expert-grouped rows: down_e(silu(gate_e(x)) * up_e(x))."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        e, c, f = spec.num_experts, spec.d_model, spec.ffn_dim
        self.gate_proj = GroupedLinear(e, c, f)
        self.up_proj = GroupedLinear(e, c, f)
        self.down_proj = GroupedLinear(e, f, c)
        self.recompute_act = False  # selective recompute: silu(gate) * up

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        return self.down_proj(
            recomputable(_swiglu, self.recompute_act, self.gate_proj(x, counts), self.up_proj(x, counts)), counts
        )


def kept_pairs(top_e: torch.Tensor, num_experts: int, capacity: int) -> torch.Tensor:
    """bool (B, S, k): whether each (position, slot) pair fits its expert's per-sequence capacity (model/spec.py:
    first choices of every position first, then second choices, ...)."""
    b, s, k = top_e.shape
    slots = top_e.transpose(1, 2).reshape(b, k * s)  # priority order
    hot = F.one_hot(slots, num_experts)
    place = ((hot.cumsum(1) - hot) * hot).sum(-1)  # earlier pairs routed to the same expert
    return (place < capacity).view(b, k, s).transpose(1, 2)


class MoE(nn.Module):
    """Top-k softmax router + SwiGLU experts (see model/spec.py for the definition, capacity included).

    With a capacity limit every pair still goes through its expert and the dropped ones are zeroed: the same function
    as the MindSpore engine's routed buffers (this engine's dispatch already runs each expert on its routed rows only).

    ``token_group`` (set by :mod:`.expert_parallel` when the sequences of one micro-batch are split
    over ranks, i.e. context parallelism) lists the process groups the routing counts are summed
    over, so the load-balancing term is that of the whole micro-batch. After a training forward,
    ``aux`` holds this rank's part of ``N * aux`` (N: token positions of the micro-batch).
    """

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.num_experts, self.top_k = spec.num_experts, spec.moe_top_k
        self.spec = spec
        self.router = nn.Linear(spec.d_model, spec.num_experts, bias=False)
        self.experts = Experts(spec)
        self.token_group = None
        self.aux: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, c = x.shape
        tokens = x.reshape(-1, c)  # (N, C)
        with torch.autocast(x.device.type, enabled=False):  # routing decisions in float32
            logits = self.router(tokens.to(torch.promote_types(tokens.dtype, torch.float32)))  # (N, E)
        probs = logits.softmax(-1)
        top_p, top_e = probs.topk(self.top_k, -1)  # (N, k), largest first
        gates = top_p / top_p.sum(-1, keepdim=True)
        self.aux = self._balance(probs, top_e) if self.training and torch.is_grad_enabled() else None
        y = self.dispatch(tokens, top_e)  # (N, k, C): each token's j-th expert output
        capacity = moe_capacity(self.spec, s)
        if (
            capacity is not None
        ):  # the pairs past an expert's capacity: their term left out (and no gradient through it)
            y = y * kept_pairs(top_e.view(b, s, -1), self.num_experts, capacity).reshape(b * s, -1, 1).to(y.dtype)
        out = (gates.unsqueeze(-1) * y).sum(1)
        return out.to(x.dtype).reshape(b, s, c)

    def dispatch(self, tokens: torch.Tensor, top_e: torch.Tensor) -> torch.Tensor:
        """Every (token, slot) through its expert, in one process: rows sorted by expert (stable)."""
        n, k = top_e.shape
        flat = top_e.reshape(-1)
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        out = self.experts(tokens[order // k], counts)  # (N*k, C), grouped by expert
        return out[order.argsort()].view(n, k, -1)

    def _balance(self, probs: torch.Tensor, top_e: torch.Tensor) -> torch.Tensor:
        """This rank's part of N * aux = E * sum_e f_e * (sum over its tokens of p_e); f over the whole micro-batch."""
        e = self.num_experts
        stats = torch.cat([torch.bincount(top_e.reshape(-1), minlength=e).to(probs.dtype),
                           probs.new_full((1,), float(probs.shape[0]))]).detach()  # routed counts, tokens
        if self.token_group is not None:  # several ranks hold this micro-batch's tokens: count over all of them
            from torch.distributed import _functional_collectives as funcol

            stats = stats.double()  # exact counts beyond 2**24
            for group in self.token_group:
                stats = funcol.all_reduce(stats, "sum", group)
        f = (stats[:e] / stats[e]).to(probs.dtype)
        return e * (f * probs.sum(0)).sum()


class Block(nn.Module):
    """Pre-norm residual block."""

    def __init__(self, spec: ModelSpec, moe: bool = False):
        super().__init__()
        self.attn_norm = RMSNorm(spec.d_model, spec.norm_eps)
        self.attn = Attention(spec)
        self.mlp_norm = RMSNorm(spec.d_model, spec.norm_eps)
        self.mlp = MoE(spec) if moe else MLP(spec)
        self.recompute_all = False  # full recompute: only the block's input is kept

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, visible: torch.Tensor | None = None
    ) -> torch.Tensor:
        return recomputable(self._forward, self.recompute_all, x, cos, sin, visible)

    def _forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, visible: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, visible)
        return x + self.mlp(self.mlp_norm(x))

    def decode(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor],
               positions: torch.Tensor) -> torch.Tensor:
        x = x + self.attn.decode(self.attn_norm(x), cos, sin, cache, positions)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    """Token ids (B, S) -> logits (B, S, V); causal (clm) or bidirectional over the non-padding keys (mlm)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab_size, spec.d_model)
        self.layers = nn.ModuleList([Block(spec, is_moe_layer(spec, i)) for i in range(spec.n_layers)])
        self.norm = RMSNorm(spec.d_model, spec.norm_eps)
        self.lm_head = None if spec.tie_embeddings else nn.Linear(spec.d_model, spec.vocab_size, bias=False)
        cos, sin = rope_tables(spec, spec.max_seq_len)
        self.register_buffer("cos", torch.from_numpy(cos), persistent=False)  # (S_max, D)
        self.register_buffer("sin", torch.from_numpy(sin), persistent=False)
        # Global positions (S,) of the local tokens when context parallelism holds a slice of each
        # sequence (RoPE by position in the whole sequence); None = positions 0..S-1.
        self.positions: torch.Tensor | None = None
        self.loss_chunk = 0  # memory.loss_chunk: positions per chunk of the head and loss when labels are given

    def forward(
        self, ids: torch.Tensor, labels: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits (B, S, V); given labels, the summed token loss and its token count (token_nll) without
        materialising more than one chunk of logits (``loss_chunk``), inside the forward so that the
        FSDP root and TP hooks see the head's use of the weights."""
        x = self.hidden(self.embed(ids), None if self.spec.causal else self.visible_keys(ids), ids.shape[1])
        if labels is None:
            return self._head(x)
        if not self.loss_chunk:
            return self._head_nll(x, labels)
        return chunked_nll(x, self.head_weight(), labels, self.loss_chunk, self._head_nll)

    def hidden(self, x: torch.Tensor, visible: torch.Tensor | None = None, length: int | None = None) -> torch.Tensor:
        """The blocks and the final norm over embedded inputs x (B, S, C): causal, or over the ``visible`` keys.
        ``length``: the sequence's S when x holds a slice of it (sequence parallelism shards the embedding's
        output); None = x's."""
        s = x.shape[1] if length is None else length
        if self.positions is None:
            cos, sin = self.cos[:s], self.sin[:s]
        else:
            cos, sin = self.cos[self.positions], self.sin[self.positions]
        for layer in self.layers:
            x = layer(x, cos, sin, visible)
        return self.norm(x)

    @staticmethod
    def visible_keys(ids: torch.Tensor) -> torch.Tensor:
        """(B, 1, S, S) bool: the non-padding keys and each position itself (model/spec.py's visible_keys, mlm)."""
        s = ids.shape[1]
        return ((ids != PAD_ID)[:, None, None, :] | torch.eye(s, dtype=torch.bool, device=ids.device))

    def _head_nll(self, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return token_nll(full_value(self._head(x)), labels)

    def head_weight(self) -> torch.Tensor:
        """The output head's [V, C] matrix: the embedding when tied."""
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.head_weight())

    def new_cache(self, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """An empty key/value cache of `length` positions for one sequence: (keys, values) per layer, (1, K, L, D) each.
        """
        shape = (1, self.spec.n_kv_heads, length, self.spec.head_dim)
        w = self.embed.weight
        return [(w.new_zeros(shape), w.new_zeros(shape)) for _ in self.layers]

    def decode(
        self, ids: torch.Tensor, positions: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        """Logits (1, T, V) of tokens ids (1, T) at `positions` (T,), attending what `cache` holds before them."""
        cos, sin = self.cos[positions], self.sin[positions]
        x = self.embed(ids)
        for layer, layer_cache in zip(self.layers, cache):
            x = layer.decode(x, cos, sin, layer_cache, positions)
        return self._head(self.norm(x))


def aux_loss_sum(model: nn.Module) -> torch.Tensor | None:
    """aux_loss_weight * (this rank's part of N * aux) of the last training forward; None for a dense model.

    aux is the mean of the MoE blocks' load-balancing losses; the train step adds this to the
    summed token loss before the 1/(valid tokens) scaling (see model/spec.py).
    """
    parts = [m.aux for m in model.modules() if isinstance(m, MoE)]
    if not parts or any(p is None for p in parts):
        return None
    return model.spec.moe_aux_loss_weight * torch.stack(parts).mean()


def eval_sums(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """[summed loss, scored tokens, correct top-1 predictions] (float64) over labels != IGNORE_INDEX."""
    nll, count = token_nll(logits, labels)
    correct = ((logits.argmax(-1) == labels) & (labels != IGNORE_INDEX)).sum()
    return torch.stack([nll.double(), count.double(), correct.double()])


def token_nll(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token loss in float32 over labels != IGNORE_INDEX, and the number of such tokens."""
    flat = logits.reshape(-1, logits.shape[-1]).float()
    target = labels.reshape(-1)
    nll = F.cross_entropy(flat, target, ignore_index=IGNORE_INDEX, reduction="sum")
    return nll, (target != IGNORE_INDEX).sum()
