"""Context parallelism for the torch engine: each sequence split over the ``cp`` ranks.

**Chunking (load-balanced causal).** A sequence of S tokens is cut into ``2*cp`` chunks of
S/(2cp); cp rank i holds chunks i and 2cp-1-i, so every rank has one early and one late chunk and
the causal attention work is the same on every rank. Token ids and labels are cut the same way
(:meth:`ContextParallel.split`); the layout rules require ``seq_len % (2*cp) == 0``.

**Attention.** Each rank computes q, k, v for its own tokens, with RoPE at their **global**
positions (``Transformer.positions``). K and V (with the K kv heads, before the grouped-query
expansion) are all-gathered over the cp group by :class:`_GatherSeq`, a small autograd Function
over the synchronous c10d collectives whose backward is a reduce-scatter: the gradient of every
rank's keys and values flows back to the rank that computed them (gloo has no reduce-scatter, so
there the backward all-reduces and keeps this rank's slice). Not the library's versions:
``torch.distributed.nn.functional.all_gather`` gives wrong gradients on gloo when the incoming
gradient is non-contiguous, which CPU SDPA's backward produces, and the asynchronous functional
collectives (``all_gather_single``) corrupted the heap on gloo about once in ten 2-process test
launches ("malloc(): unaligned tcache chunk detected", SIGSEGV). The gathered keys are in rank order
(rank 0's two chunks, then rank 1's, ...); the causal mask compares global positions, ``q_pos >= k_pos``, so the order
does not matter.

**Loss and gradients.** Each rank scores only its own tokens: the summed NLL of its local labels
times 1/(valid tokens of the global batch). (Computing the full loss on every rank from gathered
tensors would make the gradients cp times too large: the gather's backward sums over ranks.) The
step loss is the sum over the cp ranks (and dp ranks). Parameter gradients are partial per cp
rank; FSDP2 runs over the flattened ``dp_shard x cp`` ranks (torchtitan's ``dp_shard_cp``) and sums
them in its reduce-scatter, so the parameters and AdamW moments are sharded over the cp ranks too.

**Evaluation.** ``eval_batch`` runs context-parallel as training does (rows split over dp, each
sequence over cp, the NLL summed over both) when the sequence length is divisible by 2*cp, else on
the whole sequence. ``logits`` and ``module_outputs`` (generation, debugging) compute whole
sequences on every rank without context parallelism: any length works and the outputs are the full
arrays; this costs the full attention memory per rank.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh

from mindfoundry.backends.torch.model import Transformer


def chunk_positions(seq_len: int, cp: int, rank: int) -> torch.Tensor:
    """Global positions held by cp rank `rank`: chunks `rank` and `2*cp-1-rank` of `2*cp`."""
    if seq_len % (2 * cp):
        raise ValueError(f"parallel.cp={cp} needs a sequence length divisible by 2*cp = {2 * cp}, got {seq_len}")
    n = seq_len // (2 * cp)
    late = 2 * cp - 1 - rank
    return torch.cat([torch.arange(rank * n, (rank + 1) * n), torch.arange(late * n, (late + 1) * n)])


class _GatherSeq(torch.autograd.Function):
    """All-gather along dim 0 over `group`; backward: each rank's slice of the gradient summed over the ranks."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        out = x.new_empty((dist.get_world_size(group) * x.shape[0], *x.shape[1:]))
        dist.all_gather_into_tensor(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        group = ctx.group
        n = dist.get_world_size(group)
        if dist.get_backend(group) == "gloo":  # no reduce-scatter on gloo: sum everything, keep this rank's part
            total = grad.clone(memory_format=torch.contiguous_format)
            dist.all_reduce(total, group=group)
            return total.chunk(n)[dist.get_rank(group)].contiguous(), None
        out = grad.new_empty((grad.shape[0] // n, *grad.shape[1:]))
        dist.reduce_scatter_tensor(out, grad.contiguous(), group=group)
        return out, None


def _gather_seq(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """(B, K, S_local, D) on each rank -> (B, K, cp*S_local, D), ranks in order; autograd: reduce-scatter back."""
    seq_first = x.permute(2, 0, 1, 3)  # the gather concatenates along dim 0
    return _GatherSeq.apply(seq_first, group).permute(1, 2, 0, 3)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, expand: Callable[[torch.Tensor], torch.Tensor], *,
            mask: torch.Tensor, group: object) -> torch.Tensor:
    """Local queries against the whole sequence's keys/values, causal by global position."""
    k_all, v_all = _gather_seq(k, group), _gather_seq(v, group)
    return F.scaled_dot_product_attention(q, expand(k_all), expand(v_all), attn_mask=mask)


class ContextParallel:
    """Splits sequences over the ``cp`` mesh dim and switches a model's attention to the gathered form."""

    def __init__(self, model: Transformer, cp_mesh: DeviceMesh):
        self.model, self.mesh = model, cp_mesh
        self.cp, self.rank = cp_mesh.size(), cp_mesh.get_local_rank()
        self.group = cp_mesh.get_group()

    def positions(self, seq_len: int, device: torch.device) -> torch.Tensor:
        return chunk_positions(seq_len, self.cp, self.rank).to(device)

    def fits(self, seq_len: int) -> bool:
        return seq_len % (2 * self.cp) == 0

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's tokens of [..., S] ids or labels: [..., S/cp], early chunk then late chunk."""
        return x.index_select(-1, self.positions(x.shape[-1], x.device))

    @contextlib.contextmanager
    def active(self, seq_len: int, device: torch.device) -> Iterator[None]:
        """Within: the model takes this rank's [B, S/cp] tokens of length-`seq_len` sequences."""
        mine = self.positions(seq_len, device)
        keys = torch.cat([chunk_positions(seq_len, self.cp, r) for r in range(self.cp)]).to(device)
        core = _Core(mask=mine[:, None] >= keys[None, :], group=self.group)
        attns = [block.attn for block in self.model.layers]
        self.model.positions = mine
        for attn in attns:
            attn.core = core
        try:
            yield
        finally:
            self.model.positions = None
            for attn in attns:
                attn.core = None


class _Core:
    """The context-parallel attention core (a plain callable attribute of each Attention module)."""

    def __init__(self, *, mask: torch.Tensor, group: object):
        self.mask, self.group = mask, group

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 expand: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        return _attend(q, k, v, expand, mask=self.mask, group=self.group)
