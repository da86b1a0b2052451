"""Mixture-of-experts blocks under several processes: routing statistics and expert parallelism (EP).

:func:`apply_moe` runs from :func:`.parallelize.parallelize` before tensor parallelism and FSDP:

- **Routing statistics.** The load-balancing loss (model/spec.py) is defined over one micro-batch
  of one data-parallel rank. When its sequences are split over ranks (cp), each
  :class:`~.model.MoE` sums its routed-token counts over those ranks (``token_group``, one
  all-reduce of E+1 numbers per MoE block and micro-batch, no gradient); data-parallel ranks keep
  their own statistics, so dp ranks with grad_accum A train what one process trains with
  grad_accum dp*A.
- **Expert parallelism** (``parallel.ep > 1``). Experts are spread over the ranks of FSDP's shard
  dim: the stacked expert weights ``[E, ...]`` become DTensors sharded along dim 0 on the same
  mesh (and with the same placements) as FSDP's own parameters, so each rank keeps E/ep whole
  experts, never all-gathered (FSDP is told to leave them alone: :func:`sharded_expert_params`),
  and ``named_parameters()``, ``full_value``/``shard_like``, the optimizer and the gradient norm
  treat them like any FSDP parameter. Each rank routes its own tokens (the router is an ordinary,
  FSDP-managed parameter), sends every (token, slot) row to the rank owning its expert with an
  uneven ``all_to_all_single`` (the per-expert counts are exchanged first), runs its experts on
  what it received, and sends the results back the same way; the functional collectives carry
  autograd, so the backward is the reverse exchange. The owner's expert gradients then hold every
  rank's tokens: no further reduction over the shard dim. Under HSDP (dp_replicate > 1) the replicas
  of an expert sum their gradients with an all-reduce in the backward of each micro-batch.
  There is no capacity limit and no token is dropped, so EP computes exactly what one process
  computes (up to the order of floating-point sums).

This version shards experts over the whole shard dim (ep == dp_shard), and runs MoE models without
tensor, pipeline or context parallelism; torchtitan's ep < dp_shard (experts FSDP-sharded again
over the remaining dp_shard/ep ranks) and MoE with tp/pp/cp are refused with the reason. (The
routing counts already cover cp ranks, for when MoE x CP is tried.)
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import _functional_collectives as funcol
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from mindfoundry.backends.torch.distributed import dp_mesh_for_fsdp
from mindfoundry.backends.torch.model import GroupedLinear, MoE
from mindfoundry.config.parallel_config import Layout

#: The mesh dims whose ranks hold different tokens of one (per-rank) micro-batch.
TOKEN_DIMS = ("cp",)


def moe_modules(model: nn.Module) -> list[MoE]:
    return [m for m in model.modules() if isinstance(m, MoE)]


def check_moe_layout(model: nn.Module, layout: Layout) -> None:
    """Refuse MoE layouts this version cannot run, naming the fix (the layout rules, ep dividing the experts
    included, were checked at launch: :mod:`mindfoundry.config.layout_rules`)."""
    moe = moe_modules(model)
    if not moe:
        return
    other = [f"{n}={getattr(layout, n)}" for n in ("tp", "pp", "cp") if getattr(layout, n) > 1]
    if other:
        raise NotImplementedError(
            f"parallel {', '.join(other)} with a mixture-of-experts model: the torch engine runs MoE blocks with data "
            "parallelism (dp_replicate, dp_shard) and expert parallelism only in this version; set these to 1"
        )
    if layout.ep == 1:
        return
    experts = moe[0].num_experts
    if layout.ep != layout.dp_shard:
        raise NotImplementedError(f"parallel.ep={layout.ep} with dp_shard={layout.dp_shard}: this version spreads the "
                                  f"experts over all dp_shard ranks; set ep: {layout.dp_shard} (it must divide "
                                  f"num_experts={experts}) or dp_shard: {layout.ep}")


def token_groups(mesh: DeviceMesh) -> list[dist.ProcessGroup]:
    """One process group per mesh dim (of TOKEN_DIMS, size > 1) whose ranks share a micro-batch's tokens."""
    names = mesh.mesh_dim_names or ()
    return [mesh[d].get_group() for d in TOKEN_DIMS if d in names and mesh[d].size() > 1]


def apply_moe(model: nn.Module, mesh: DeviceMesh, layout: Layout) -> None:
    """Wire the MoE blocks to the mesh (see the module docstring); nothing to do for a dense model."""
    check_moe_layout(model, layout)
    groups = token_groups(mesh)
    for moe in moe_modules(model):
        moe.token_group = groups or None
    if layout.ep > 1:
        apply_ep(model, mesh, layout)


def apply_ep(model: nn.Module, mesh: DeviceMesh, layout: Layout) -> None:
    """Shard every MoE block's experts along dim 0 over FSDP's shard dim and route tokens with all-to-all."""
    ep_mesh = dp_mesh_for_fsdp(mesh, layout)  # 1D dp_shard, or 2D (dp_replicate, dp_shard)
    placements = [Shard(0)] if ep_mesh.ndim == 1 else [Replicate(), Shard(0)]
    ep_group = mesh["dp_shard"].get_group()
    replicas = mesh["dp_replicate"].get_group() if layout.dp_replicate > 1 else None
    for moe in moe_modules(model):
        for linear in (moe.experts.gate_proj, moe.experts.up_proj, moe.experts.down_proj):
            local = linear.weight.detach()
            linear.weight = nn.Parameter(distribute_tensor(local, ep_mesh, placements, src_data_rank=None))
            linear.grad_group = replicas
        moe.dispatch = AllToAllDispatch(moe, ep_group, layout.ep)  # an instance attribute: replaces MoE.dispatch


def sharded_expert_params(module: nn.Module) -> set[nn.Parameter] | None:
    """The expert weights EP keeps sharded in `module` (for fully_shard's ignored_params), or None."""
    params = {m.weight for m in module.modules() if isinstance(m, GroupedLinear) and isinstance(m.weight, DTensor)}
    return params or None


class AllToAllDispatch:
    """MoE.dispatch under expert parallelism: (token, slot) rows to their expert's rank and back."""

    def __init__(self, moe: MoE, group: dist.ProcessGroup, ep: int):
        self.moe, self.group, self.ep = moe, group, ep
        self.local = moe.num_experts // ep  # experts per rank; rank r owns [r*local, (r+1)*local)

    def __call__(self, tokens: torch.Tensor, top_e: torch.Tensor) -> torch.Tensor:
        n, k = top_e.shape
        flat = top_e.reshape(-1)
        order = flat.argsort(stable=True)  # rows grouped by expert, so by destination rank
        counts = torch.bincount(flat, minlength=self.moe.num_experts)  # rows this rank sends to each expert
        received_counts = torch.empty_like(counts)
        dist.all_to_all_single(received_counts, counts, group=self.group)  # [source rank, local expert]
        recv = received_counts.view(self.ep, self.local).tolist()
        send_split = counts.view(self.ep, self.local).sum(1).tolist()
        recv_split = [sum(row) for row in recv]
        rows = funcol.all_to_all_single_autograd(tokens[order // k], recv_split, send_split, self.group)
        # received rows run (source, expert); the experts want (expert, source)
        starts, offset = [], 0
        for row in recv:
            starts.append([])
            for c in row:
                starts[-1].append(offset)
                offset += c
        by_expert = [
            torch.arange(starts[s][e], starts[s][e] + recv[s][e]) for e in range(self.local) for s in range(self.ep)
        ]
        perm = (
            torch.cat(by_expert).to(rows.device) if by_expert else torch.zeros(0, dtype=torch.long, device=rows.device)
        )
        out = self.moe.experts(rows[perm], [sum(recv[s][e] for s in range(self.ep)) for e in range(self.local)])
        out = out[perm.argsort()]  # back to (source, expert) order
        back = funcol.all_to_all_single_autograd(out, send_split, recv_split, self.group)  # rows in the order sent
        return back[order.argsort()].view(n, k, -1)
