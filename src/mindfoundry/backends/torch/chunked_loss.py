"""The output head and the token loss over chunks of positions, one chunk's logits at a time, backward included.

``memory.loss_chunk`` exists so that the (B, S, V) logits never exist at once. Recomputing each
chunk with ``torch.utils.checkpoint`` would let autograd accumulate the head weight's gradient
through a second (V, C) tensor per chunk, and computing the gradients already in the forward (as
some fused linear-cross-entropy kernels do) would hold that (V, C) gradient through the whole
forward; so, like both halves of those designs: the forward computes each chunk's logits and keeps
only its log-sum-exp (B*S floats); the backward recomputes each chunk's logits, turns them into
softmax - one-hot and adds their products into one hidden-state gradient and one head-weight
gradient buffer in place. The arithmetic is :func:`.model.token_nll`'s: float32 log-sum-exp,
labels equal to IGNORE_INDEX score 0; the logits matmul runs under the forward's autocast state.

Under tensor parallelism the weight is a vocab-sharded DTensor; there :func:`chunked_nll` falls back
to recomputing each chunk with ``torch.utils.checkpoint`` (DTensor ops, the logits gathered per chunk).
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

from mindfoundry.data.dataset.packing import IGNORE_INDEX
from mindfoundry.model.spec import chunk_bounds


class _ChunkedLoss(torch.autograd.Function):
    """(x [B, S, C], weight [V, C], labels [B, S], chunk) -> (summed NLL, valid tokens)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int):
        b, s, c = x.shape
        lse = torch.empty((b, s), dtype=torch.float32, device=x.device)
        total = torch.zeros((), dtype=torch.float32, device=x.device)
        for start, end in chunk_bounds(s, chunk):
            logits = F.linear(x[:, start:end], weight).float()  # (B, c, V), as the model's head computes them
            target = labels[:, start:end]
            valid = target != IGNORE_INDEX
            lse[:, start:end] = torch.logsumexp(logits, -1)
            picked = logits.gather(-1, torch.where(valid, target, 0)[..., None]).squeeze(-1)
            total += torch.where(valid, lse[:, start:end] - picked, 0.0).sum()
        ctx.save_for_backward(x, weight, labels, lse)
        ctx.chunk = chunk
        device = x.device.type
        ctx.autocast = (device, torch.get_autocast_dtype(device)) if torch.is_autocast_enabled(device) else None
        count = (labels != IGNORE_INDEX).sum()
        ctx.mark_non_differentiable(count)
        return total, count

    @staticmethod
    def backward(ctx, grad_total: torch.Tensor, _grad_count: torch.Tensor):
        x, weight, labels, lse = ctx.saved_tensors
        b, s, c = x.shape
        grad_x = torch.empty(x.shape, dtype=torch.float32, device=x.device)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        w = weight.float()
        same_autocast = torch.autocast(*ctx.autocast) if ctx.autocast else contextlib.nullcontext()
        for start, end in chunk_bounds(s, ctx.chunk):
            with same_autocast:
                logits = F.linear(x[:, start:end], weight).float()
            target = labels[:, start:end]
            valid = target != IGNORE_INDEX
            probs = torch.exp(
                logits.sub_(lse[:, start:end, None])
            )  # d loss / d logits = softmax - one-hot, 0 if ignored
            probs.scatter_add_(-1, torch.where(valid, target, 0)[..., None], torch.full_like(probs[..., :1], -1.0))
            probs.mul_((valid * grad_total)[..., None])
            grad_x[:, start:end] = probs @ w
            grad_w.addmm_(probs.reshape(-1, probs.shape[-1]).t(), x[:, start:end].reshape(-1, c).float())
        return grad_x.to(x.dtype), grad_w.to(weight.dtype), None, None


def chunked_nll(x: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int,
                head_nll: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed token NLL and valid-token count of logits x W^T without more than one chunk of logits at a time.

    ``head_nll(x_chunk, labels_chunk)`` is the model's own head + token_nll, used (recomputed per chunk) when the
    weight is a DTensor (tensor parallelism)."""
    if not isinstance(weight, DTensor):
        return _ChunkedLoss.apply(x, weight, labels, chunk)
    parts = [
        checkpoint(head_nll, x[:, a:b], labels[:, a:b], use_reentrant=False) for a, b in chunk_bounds(x.shape[1], chunk)
    ]
    return torch.stack([p[0] for p in parts]).sum(), torch.stack([p[1] for p in parts]).sum()
