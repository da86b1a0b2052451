"""The output head and the token loss over chunks of positions, with their gradients computed chunk by chunk.

``memory.loss_chunk`` exists so that the (B, S, V) logits never exist at once. Recomputing each
chunk in the backward (``torch.utils.checkpoint``) would still let autograd accumulate the head
weight's gradient through a second (V, C) tensor per chunk; instead, as fused linear-cross-entropy
kernels do, the forward computes each chunk's logits, loss and the gradients of the hidden states
and of the head weight (softmax - one-hot, summed in place into one buffer) and frees the chunk;
the backward only scales the two stored gradients by the incoming one. The arithmetic is
:func:`.model.token_nll`'s: float32 log-sum-exp, labels equal to IGNORE_INDEX score 0.

Under tensor parallelism the weight is a vocab-sharded DTensor; there :func:`chunked_nll` falls back
to recomputing each chunk with ``torch.utils.checkpoint`` (DTensor ops, the logits gathered per chunk).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

from mindfoundry.data.dataset.packing import IGNORE_INDEX
from mindfoundry.model.spec import chunk_bounds


class _FusedChunkedLoss(torch.autograd.Function):
    """(x [B, S, C], weight [V, C], labels [B, S], chunk) -> (summed NLL, valid tokens)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int):
        b, s, c = x.shape
        grad_x = torch.empty(x.shape, dtype=torch.float32, device=x.device)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        total = torch.zeros((), dtype=torch.float32, device=x.device)
        count = torch.zeros((), dtype=torch.long, device=x.device)
        for start, end in chunk_bounds(s, chunk):
            rows = x[:, start:end].reshape(-1, c)
            logits = torch.nn.functional.linear(rows, weight).float()  # the head's matmul (autocast applies as in the model)
            target = labels[:, start:end].reshape(-1)
            valid = target != IGNORE_INDEX
            safe = torch.where(valid, target, 0)
            lse = torch.logsumexp(logits, -1)
            total += torch.where(valid, lse - logits.gather(1, safe[:, None]).squeeze(1), 0.0).sum()
            count += valid.sum()
            probs = torch.exp(logits.sub_(lse[:, None]))  # d loss / d logits = softmax - one-hot, 0 on ignored rows
            probs[torch.arange(len(safe), device=x.device), safe] -= 1.0
            probs.mul_(valid[:, None])
            with torch.autocast(x.device.type, enabled=False):
                w = weight.float()
                grad_x[:, start:end] = (probs @ w).view(b, end - start, c)
                grad_w.addmm_(probs.t(), rows.float())
        ctx.save_for_backward(grad_x, grad_w)
        ctx.dtypes = (x.dtype, weight.dtype)
        ctx.mark_non_differentiable(count)
        return total, count

    @staticmethod
    def backward(ctx, grad_total: torch.Tensor, _grad_count: torch.Tensor):
        grad_x, grad_w = ctx.saved_tensors
        x_dtype, w_dtype = ctx.dtypes
        return grad_x.mul_(grad_total).to(x_dtype), grad_w.mul_(grad_total).to(w_dtype), None, None


def chunked_nll(x: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int,
                head_nll: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed token NLL and valid-token count of logits x W^T without more than one chunk of logits at a time.

    ``head_nll(x_chunk, labels_chunk)`` is the model's own head + token_nll, used (recomputed per chunk) when the
    weight is a DTensor (tensor parallelism)."""
    if not isinstance(weight, DTensor):
        return _FusedChunkedLoss.apply(x, weight, labels, chunk)
    parts = [checkpoint(head_nll, x[:, a:b], labels[:, a:b], use_reentrant=False) for a, b in chunk_bounds(x.shape[1], chunk)]
    return torch.stack([p[0] for p in parts]).sum(), torch.stack([p[1] for p in parts]).sum()
