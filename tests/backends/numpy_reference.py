"""An independent numpy forward pass of the model, used to check each backend's arithmetic.

Written from the math (RMSNorm, rotate-half RoPE, grouped-query causal attention -- or, for the mlm
objective, attention to every key but padding (id 1) except a position's own --, SwiGLU, and
the mixture-of-experts FFN of :mod:`mindfoundry.model.spec`: softmax router, top-k renormalized,
one token at a time through its experts; the Switch/Mixtral load-balancing loss), not from either
backend's code, in float64.
"""

from __future__ import annotations

import numpy as np

from mindfoundry.model.spec import ModelSpec, is_moe_layer, moe_capacity, rope_tables


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def _swiglu(y: np.ndarray, gate_w: np.ndarray, up_w: np.ndarray, down_w: np.ndarray) -> np.ndarray:
    gate = y @ gate_w.T
    return ((gate / (1 + np.exp(-gate))) * (y @ up_w.T)) @ down_w.T


def moe(spec: ModelSpec, w: dict[str, np.ndarray], p: str, y: np.ndarray) -> tuple[np.ndarray, float]:
    """MoE FFN of block prefix `p` on y [B, S, C]: (output, load-balancing loss of this block)."""
    e, k = spec.num_experts, spec.moe_top_k
    tokens = y.reshape(-1, y.shape[-1])
    logits = tokens @ w[p + "mlp.router.weight"].T
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(tokens)
    routed = np.zeros(e)
    tops = [np.argsort(-probs[t], kind="stable")[:k] for t in range(len(tokens))]
    kept = np.ones((len(tokens), k), bool)
    capacity = moe_capacity(spec, y.shape[1])
    if capacity is not None:  # per sequence: every position's first choice in order, then the second choices, ...
        for row in range(y.shape[0]):
            taken = np.zeros(e, int)
            for j in range(k):
                for t in range(row * y.shape[1], (row + 1) * y.shape[1]):
                    kept[t, j] = taken[tops[t][j]] < capacity
                    taken[tops[t][j]] += 1
    for t, x in enumerate(tokens):  # one token at a time: no batching, no dispatch
        top = tops[t]
        gates = probs[t, top] / probs[t, top].sum()
        for j, expert in enumerate(top):
            routed[expert] += 1
            if kept[t, j]:
                out[t] += gates[j] * _swiglu(
                    x, *(w[p + f"mlp.experts.{m}.weight"][expert] for m in ("gate_proj", "up_proj", "down_proj"))
                )
    n = len(tokens)
    aux = e * float(np.sum(routed / n * probs.mean(0)))
    return out.reshape(y.shape), aux


def forward(spec: ModelSpec, w: dict[str, np.ndarray], ids: np.ndarray, with_aux: bool = False):
    """Logits [B, S, V] in float64; with_aux: (logits, load-balancing loss averaged over the MoE blocks)."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    b, s = ids.shape
    hd, h, kv = spec.head_dim, spec.n_heads, spec.n_kv_heads
    cos, sin = (t.astype(np.float64) for t in rope_tables(spec, s))
    if spec.objective == "clm":
        mask = np.triu(np.full((s, s), -np.inf), 1)
    else:  # (B, 1, S, S): a padding key is hidden from every other position
        mask = np.zeros((b, 1, s, s))
        for row, q, key in np.ndindex(b, s, s):
            if ids[row, key] == 1 and q != key:
                mask[row, 0, q, key] = -np.inf
    x = w["embed.weight"][ids]
    auxes: list[float] = []
    for i in range(spec.n_layers):
        p = f"layers.{i}."
        y = _rms(x, w[p + "attn_norm.weight"], spec.norm_eps)
        q = (y @ w[p + "attn.q_proj.weight"].T).reshape(b, s, h, hd).transpose(0, 2, 1, 3)
        k = (y @ w[p + "attn.k_proj.weight"].T).reshape(b, s, kv, hd).transpose(0, 2, 1, 3)
        v = (y @ w[p + "attn.v_proj.weight"].T).reshape(b, s, kv, hd).transpose(0, 2, 1, 3)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        k, v = np.repeat(k, h // kv, axis=1), np.repeat(v, h // kv, axis=1)
        att = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd) + mask
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        out = (att @ v).transpose(0, 2, 1, 3).reshape(b, s, h * hd)
        x = x + out @ w[p + "attn.o_proj.weight"].T
        y = _rms(x, w[p + "mlp_norm.weight"], spec.norm_eps)
        if is_moe_layer(spec, i):
            out, aux = moe(spec, w, p, y)
            x = x + out
            auxes.append(aux)
            continue
        gate = y @ w[p + "mlp.gate_proj.weight"].T
        x = x + ((gate / (1 + np.exp(-gate))) * (y @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    x = _rms(x, w["norm.weight"], spec.norm_eps)
    head = w["embed.weight"] if spec.tie_embeddings else w["lm_head.weight"]
    logits = x @ head.T
    if with_aux:
        return logits, (float(np.mean(auxes)) if auxes else 0.0)
    return logits


def mean_nll(logits: np.ndarray, labels: np.ndarray, ignore_index: int = -100) -> float:
    """Token-mean next-token loss over labels != ignore_index."""
    flat = logits.reshape(-1, logits.shape[-1])
    target = labels.reshape(-1)
    keep = target != ignore_index
    peak = flat.max(-1, keepdims=True)
    lse = np.log(np.exp(flat - peak).sum(-1)) + peak[:, 0]
    nll = lse - flat[np.arange(len(target)), np.where(keep, target, 0)]
    return float(nll[keep].mean())
