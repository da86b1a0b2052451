"""A naive MindSpore GPT training loop, written the way tutorials write it (benchmark baseline only).

Modelled on the common "MindSpore decoder-only pretraining" tutorial
(/work/shared/seeds/002_949d33664f4ab243.txt), with its mistakes fixed: the tutorial passes a
bool mask to ``nn.MultiheadAttention`` the wrong way; here attention is standard multi-head
attention written out as plain matmuls with a dense [S, S] causal mask applied by masked fill.

Learned position embeddings (``nn.Embedding``), pre-LayerNorm blocks, GELU MLP with 4*d_model hidden
(``nn.Dense`` with bias), untied ``nn.Dense`` lm head, ``nn.CrossEntropyLoss`` over flattened
logits, ``nn.AdamWeightDecay`` wrapped by ``nn.TrainOneStepCell``; fp32, GRAPH_MODE.

This module imports MindSpore; it is bench code, not part of the framework-free package.
"""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops


class MLP(nn.Cell):
    def __init__(self, d_model, ffn_dim):
        super().__init__()
        self.up_proj = nn.Dense(d_model, ffn_dim)
        self.act = nn.GELU()
        self.down_proj = nn.Dense(ffn_dim, d_model)

    def construct(self, x):
        return self.down_proj(self.act(self.up_proj(x)))


class SelfAttention(nn.Cell):
    """Standard multi-head causal self-attention (one head group per query head, no GQA)."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.q_proj = nn.Dense(d_model, d_model)
        self.k_proj = nn.Dense(d_model, d_model)
        self.v_proj = nn.Dense(d_model, d_model)
        self.out_proj = nn.Dense(d_model, d_model)
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.softmax = nn.Softmax(axis=-1)

    def construct(self, x, mask):
        b, s, d = x.shape
        q = self.q_proj(x).reshape(b, s, self.n_heads, self.head_dim).transpose(0, 2, 1, 3)
        k = self.k_proj(x).reshape(b, s, self.n_heads, self.head_dim).transpose(0, 2, 1, 3)
        v = self.v_proj(x).reshape(b, s, self.n_heads, self.head_dim).transpose(0, 2, 1, 3)
        scores = ops.matmul(q, k.transpose(0, 1, 3, 2)) * self.scale  # (B, H, S, S)
        scores = ops.masked_fill(scores, mask, Tensor(-1e9, ms.float32))  # mask True = future position
        probs = self.softmax(scores)
        out = ops.matmul(probs, v).transpose(0, 2, 1, 3).reshape(b, s, d)
        return self.out_proj(out)


class DecoderLayer(nn.Cell):
    def __init__(self, d_model, n_heads, ffn_dim):
        super().__init__()
        self.norm1 = nn.LayerNorm((d_model,))
        self.attn = SelfAttention(d_model, n_heads)
        self.norm2 = nn.LayerNorm((d_model,))
        self.mlp = MLP(d_model, ffn_dim)

    def construct(self, x, mask):
        x = x + self.attn(self.norm1(x), mask)
        x = x + self.mlp(self.norm2(x))
        return x


class DecoderOnlyModel(nn.Cell):
    def __init__(self, vocab_size, d_model, n_layers, n_heads, seq_len, ffn_dim):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(seq_len, d_model)
        self.decoder_layers = nn.CellList([DecoderLayer(d_model, n_heads, ffn_dim) for _ in range(n_layers)])
        self.norm_final = nn.LayerNorm((d_model,))
        self.lm_head = nn.Dense(d_model, vocab_size)
        # Dense causal mask, built once on the host: True above the diagonal (positions to hide).
        self.mask = Tensor(np.triu(np.ones((seq_len, seq_len), dtype=np.bool_), k=1))
        self.positions = Tensor(np.arange(seq_len, dtype=np.int32))

    def construct(self, input_ids):
        hidden = self.embedding(input_ids) + self.position_embedding(self.positions)
        for layer in self.decoder_layers:
            hidden = layer(hidden, self.mask)
        return self.lm_head(self.norm_final(hidden))


class PretrainNetWithLoss(nn.Cell):
    def __init__(self, backbone, vocab_size):
        super().__init__()
        self.backbone = backbone
        self.vocab_size = vocab_size
        self.loss_fn = nn.CrossEntropyLoss()

    def construct(self, input_ids, labels):
        logits = self.backbone(input_ids)
        return self.loss_fn(logits.reshape((-1, self.vocab_size)), labels.reshape((-1,)))


def build_train_net(vocab_size, d_model, n_layers, n_heads, seq_len, lr=3e-4, weight_decay=0.01):
    """The tutorial's training cell: AdamWeightDecay inside TrainOneStepCell (GRAPH_MODE must be set)."""
    model = DecoderOnlyModel(vocab_size, d_model, n_layers, n_heads, seq_len, 4 * d_model)
    net_loss = PretrainNetWithLoss(model, vocab_size)
    optimizer = nn.AdamWeightDecay(net_loss.trainable_params(), learning_rate=lr, weight_decay=weight_decay)
    train_net = nn.TrainOneStepCell(net_loss, optimizer)
    train_net.set_train(True)
    return train_net


def naive_flops_per_token(vocab_size, d_model, n_layers, seq_len):
    """6*N_matmul + 12*L*d*S over the naive model's own matmul weights (biases, embeddings excluded).

    Per layer: q, k, v, out projections (4*d^2) and the 4*d MLP (2*d*4d = 8*d^2); plus the untied head.
    """
    n_matmul = n_layers * (4 * d_model * d_model + 2 * d_model * 4 * d_model) + d_model * vocab_size
    return 6 * n_matmul + 12 * n_layers * d_model * seq_len
