"""Processes, the device mesh and full <-> sharded tensors for multi-process torch training.

A run launched by ``torchrun --nproc_per_node=N`` gets its rank and rendezvous from the
environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). :func:`init_process_group`
joins it with the collective library of the device (gloo on CPU, nccl on CUDA, hccl on Ascend
through torch_npu) and :func:`build_mesh` lays the ranks out as one :class:`DeviceMesh` whose named
dims follow :class:`mindfoundry.config.parallel_config.Layout`, outermost first:
``pp, dp_replicate, dp_shard, cp, tp`` (pp and cp only when > 1; the three others always, size 1 allowed, so
slicing never needs a special case), plus a flattened 1D ``dp`` = ``dp_replicate x dp_shard`` mesh over which the
batch is split (with cp > 1, FSDP shards over a flattened ``dp_shard_cp`` = ``dp_shard x cp``, as in torchtitan).

Weights cross the Backend interface as full arrays; :func:`full_value` and :func:`shard_like`
convert between those and the DTensors that FSDP2 and tensor parallelism leave in the model.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, distribute_tensor

from mindfoundry.config.parallel_config import Layout

_COMM_BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}


def mesh_dims(layout: Layout) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """(names, sizes) of the mesh, outermost first."""
    dims = [("pp", layout.pp)] if layout.pp > 1 else []
    dims += [("dp_replicate", layout.dp_replicate), ("dp_shard", layout.dp_shard)]
    dims += [("cp", layout.cp)] if layout.cp > 1 else []
    dims += [("tp", layout.tp)]
    return tuple(n for n, _ in dims), tuple(s for _, s in dims)


def env_world_size() -> int:
    """WORLD_SIZE as torchrun sets it (1 outside a launcher)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def wants_processes(layout: Layout) -> bool:
    """True when this run is (or must be) one of several processes."""
    return layout.world_size > 1 or env_world_size() > 1


def init_process_group(device: torch.device) -> None:
    """Join torchrun's process group once; pins CUDA/NPU ranks to their LOCAL_RANK device."""
    if device.type not in _COMM_BACKENDS:
        raise RuntimeError(f"no collective library known for device '{device.type}' (known: {sorted(_COMM_BACKENDS)})")
    if "RANK" not in os.environ or "MASTER_ADDR" not in os.environ:
        raise RuntimeError(
            "this parallel layout needs several processes: launch with "
            "`torchrun --nproc_per_node=N -m mindfoundry.cli ...` (N = the product of the parallel sizes)"
        )
    if device.type != "cpu":
        getattr(torch, device.type).set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group(backend=_COMM_BACKENDS[device.type])


def build_mesh(layout: Layout, device_type: str) -> tuple[DeviceMesh, DeviceMesh]:
    """The world mesh (dims from :func:`mesh_dims`) and its flattened ``dp`` = dp_replicate x dp_shard."""
    world = dist.get_world_size()
    if layout.world_size != world:
        names, sizes = mesh_dims(layout)
        shape = " x ".join(f"{n}={s}" for n, s in zip(names, sizes))
        raise ValueError(
            f"the parallel layout ({shape}) needs {layout.world_size} processes, but {world} were launched: "
            f"launch with --nproc_per_node={layout.world_size} or change the parallel sizes "
            "(dp_shard: -1 takes the remaining ranks)"
        )
    names, sizes = mesh_dims(layout)
    mesh = init_device_mesh(device_type, sizes, mesh_dim_names=names)
    return mesh, mesh["dp_replicate", "dp_shard"]._flatten("dp")


def dp_mesh_for_fsdp(mesh: DeviceMesh, layout: Layout) -> DeviceMesh:
    """1D ``dp_shard`` for FSDP; 2D ``(dp_replicate, dp_shard)`` (HSDP; pure replication when dp_shard=1).

    With context parallelism the shard dim is ``dp_shard_cp`` (dp_shard x cp flattened): the cp
    ranks' partial gradients are summed in FSDP's reduce-scatter.
    """
    if layout.cp == 1:
        return mesh["dp_replicate", "dp_shard"] if layout.dp_replicate > 1 else mesh["dp_shard"]
    shard = mesh["dp_shard", "cp"]._flatten("dp_shard_cp")  # created once, then the same mesh
    return DeviceMesh._concatenate([mesh["dp_replicate"], shard]) if layout.dp_replicate > 1 else shard


def full_value(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor on every rank (a collective for a DTensor: every rank must call it); plain tensors pass."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def shard_like(like: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """`full` (the same on every rank) laid out as `like`: this rank's slice as a DTensor, or `full` itself.

    No communication: every rank cuts its own part (``src_data_rank=None``).
    """
    if not isinstance(like, DTensor):
        return full
    return distribute_tensor(full.to(like.device), like.device_mesh, like.placements, src_data_rank=None)


def all_reduce_sum(t: torch.Tensor, mesh: DeviceMesh | None) -> torch.Tensor:
    """Sum of `t` over the ranks of a 1D mesh, in place (nothing to do without one or on one rank)."""
    if mesh is not None and mesh.size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=mesh.get_group())
    return t
