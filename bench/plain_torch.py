"""A plain PyTorch training loop in nanoGPT's style on our model's shapes (benchmark peer only).

Written independently of ``mindfoundry.backends.torch``: one file, ``nn.Module`` classes as nanoGPT
writes them, the same architecture and sizes as a MindFoundry ``ModelSpec`` (RMSNorm, RoPE,
grouped-query attention through ``scaled_dot_product_attention(enable_gqa=True)``, SwiGLU, tied
embeddings), ``F.cross_entropy``, ``clip_grad_norm_`` and ``torch.optim.AdamW`` with its defaults
(the foreach implementation), fp32, eager. What a practitioner would write by hand, so the engine's
step has a fair peer: the same FLOPs per token, nothing the engine does that a plain loop does not
(no loss scaling, no non-finite skip, no per-layer norms).

This module imports torch; it is bench code, not part of the package.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


class Block(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int, ffn: int, eps: float):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.ln1, self.ln2 = RMSNorm(d, eps), RMSNorm(d, eps)
        self.qkv = nn.Linear(d, (heads + 2 * kv_heads) * self.hd, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.gate_up = nn.Linear(d, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, d, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(
            [self.heads * self.hd, self.kv_heads * self.hd, self.kv_heads * self.hd], -1
        )
        q = rope(q.view(b, s, self.heads, self.hd).transpose(1, 2), cos, sin)
        k = rope(k.view(b, s, self.kv_heads, self.hd).transpose(1, 2), cos, sin)
        v = v.view(b, s, self.kv_heads, self.hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, s, -1))
        gate, up = self.gate_up(self.ln2(x)).chunk(2, -1)
        return x + self.down(F.silu(gate) * up)


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, kv_heads: int, ffn: int, seq: int,
                 eps: float = 1e-5, theta: float = 10000.0):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads, kv_heads, ffn, eps) for _ in range(layers))
        self.ln_f = RMSNorm(d, eps)
        hd = d // heads
        freqs = 1.0 / theta ** (torch.arange(0, hd, 2).float() / hd)
        angles = torch.outer(torch.arange(seq).float(), freqs).repeat(1, 2)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx, targets):
        x = self.wte(idx)
        for block in self.blocks:
            x = block(x, self.cos, self.sin)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def build(vocab: int, d: int, layers: int, heads: int, kv_heads: int, ffn: int, seq: int, lr: float = 3e-4,
          weight_decay: float = 0.1, clip: float = 1.0):
    """(model, one-step function ids, targets -> loss float) of the plain loop."""
    torch.manual_seed(0)
    model = GPT(vocab, d, layers, heads, kv_heads, ffn, seq)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
    )

    def step(ids: torch.Tensor, targets: torch.Tensor) -> float:
        loss = model(ids, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return model, step


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

