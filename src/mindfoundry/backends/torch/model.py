"""The decoder-only model as torch Modules — the mirror of backends/mindspore/model.py.

Module paths give exactly the parameter names of :mod:`mindfoundry.model.spec`, with the same
``[out, in]`` layouts, so one safetensors file loads into either engine. RoPE tables are
non-persistent buffers (not part of the state dict), as in the MindSpore model where they are
constants. Attention runs through ``scaled_dot_product_attention`` (flash / memory-efficient
kernels where the device has them).

Shapes in comments: B batch, S sequence, H query heads, K kv heads, D head dim, C d_model, V vocab.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mindfoundry.data.packing import IGNORE_INDEX
from mindfoundry.model.spec import ModelSpec, rope_tables


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
    """Causal self-attention with RoPE and grouped-query heads."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = spec.n_heads, spec.n_kv_heads, spec.head_dim
        self.q_proj = nn.Linear(spec.d_model, spec.n_heads * spec.head_dim, bias=False)
        self.k_proj = nn.Linear(spec.d_model, spec.n_kv_heads * spec.head_dim, bias=False)
        self.v_proj = nn.Linear(spec.d_model, spec.n_kv_heads * spec.head_dim, bias=False)
        self.o_proj = nn.Linear(spec.n_heads * spec.head_dim, spec.d_model, bias=False)

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

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self._heads(self.q_proj(x), self.n_heads)  # (B, H, S, D)
        k = self._heads(self.k_proj(x), self.n_kv_heads)  # (B, K, S, D)
        v = self._heads(self.v_proj(x), self.n_kv_heads)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        out = F.scaled_dot_product_attention(q, self._expand_kv(k), self._expand_kv(v), is_causal=True)  # (B, H, S, D)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, self.n_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.gate_proj = nn.Linear(spec.d_model, spec.ffn_dim, bias=False)
        self.up_proj = nn.Linear(spec.d_model, spec.ffn_dim, bias=False)
        self.down_proj = nn.Linear(spec.ffn_dim, spec.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """Pre-norm residual block."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.attn_norm = RMSNorm(spec.d_model, spec.norm_eps)
        self.attn = Attention(spec)
        self.mlp_norm = RMSNorm(spec.d_model, spec.norm_eps)
        self.mlp = MLP(spec)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    """Token ids (B, S) -> logits (B, S, V)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab_size, spec.d_model)
        self.layers = nn.ModuleList([Block(spec) for _ in range(spec.n_layers)])
        self.norm = RMSNorm(spec.d_model, spec.norm_eps)
        self.lm_head = None if spec.tie_embeddings else nn.Linear(spec.d_model, spec.vocab_size, bias=False)
        cos, sin = rope_tables(spec, spec.max_seq_len)
        self.register_buffer("cos", torch.from_numpy(cos), persistent=False)  # (S_max, D)
        self.register_buffer("sin", torch.from_numpy(sin), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        s = ids.shape[1]
        cos, sin = self.cos[:s], self.sin[:s]
        x = self.embed(ids)  # (B, S, C)
        for layer in self.layers:
            x = layer(x, cos, sin)
        x = self.norm(x)
        head = self.embed.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(x, head)


def token_nll(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token loss in float32 over labels != IGNORE_INDEX, and the number of such tokens."""
    flat = logits.reshape(-1, logits.shape[-1]).float()
    target = labels.reshape(-1)
    nll = F.cross_entropy(flat, target, ignore_index=IGNORE_INDEX, reduction="sum")
    return nll, (target != IGNORE_INDEX).sum()
