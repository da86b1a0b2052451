"""The `parallel` section: the degrees of the process grid (the rules that relate them to the model are
:mod:`mindfoundry.parallel.layout`'s)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from mindfoundry.config.section import Section

#: Keys that were renamed or split, with what to write instead (load.py shows these for an unknown key).
RENAMED_KEYS: dict[str, str] = {
    "parallel.dp": "parallel.dp was split into dp_replicate (replicas) and dp_shard (FSDP shards): set one of them "
                   "(e.g. dp_shard: 8 for 8 sharded data-parallel ranks, or dp_replicate: 8 for plain DDP)",
}


class ParallelConfig(Section):
    """Multi-dimensional parallel layout (see docs/parallelism.md).

    The processes form a grid dp_replicate x dp_shard x cp x tp x pp whose product is the world size;
    ep is carved out of dp_shard x cp (torchtitan-style). The rules that relate these numbers to the
    model, the sequence and the batch are in :mod:`mindfoundry.parallel.layout`.
    """

    dp_replicate: int = Field(
        1,
        ge=1,
        description="Data-parallel replicas: whole copies of the (tp/pp-split) model whose gradients "
        "are all-reduced each step (DDP; MindSpore DATA_PARALLEL).",
    )
    dp_shard: int = Field(
        1,
        ge=-1,
        description="FSDP degree: parameters, gradients and optimizer state sharded over this many "
        "data-parallel ranks (ZeRO-3); -1 = whatever is left of the world size.",
    )
    tp: int = Field(
        1,
        ge=1,
        description="Tensor parallel: attention heads and the MLP split column/row-wise (Megatron) over this "
        "many ranks; must divide n_heads, n_kv_heads, ffn_dim and vocab_size.",
    )
    sequence_parallel: bool = Field(
        True,
        description="With tp > 1: norms and the residual stream are split along the sequence "
        "(activations / tp); train.seq_len must be divisible by cp*tp.",
    )
    pp: int = Field(
        1,
        ge=1,
        description="Pipeline stages: the layers are cut into pp * pp_virtual_stages contiguous chunks. "
        "The pipeline's micro-batches are train.grad_accum micro-batches of "
        "train.micro_batch_size sequences (1F1B/Interleaved1F1B need grad_accum >= pp).",
    )
    pp_schedule: Literal["1F1B", "GPipe", "Interleaved1F1B"] = Field(
        "1F1B",
        description="Pipeline schedule: 1F1B (holds at most pp micro-batches of activations), GPipe (all micro-batches "
        "forward, then all backward), Interleaved1F1B (pp_virtual_stages chunks per rank, smaller bubble).",
    )
    pp_virtual_stages: int = Field(
        1, ge=1, description="Pipeline chunks per rank; > 1 only with pp_schedule Interleaved1F1B."
    )
    cp: int = Field(
        1,
        ge=1,
        description="Context parallel: each sequence split over this many ranks (attention all-gathers K/V); "
        "train.seq_len must be divisible by 2*cp (load-balanced causal chunks).",
    )
    ep: int = Field(1, ge=1, description="Expert parallel for a mixture-of-experts FFN: experts spread over ep of the "
                                         "dp_shard*cp ranks; ep must divide dp_shard*cp and the number of experts.")
    optimizer_shard: bool = Field(
        False,
        description="Shard optimizer state over all data-parallel ranks (ZeRO-1 / MindSpore "
        "parallel optimizer); implied over the dp_shard ranks when dp_shard > 1.",
    )
    grad_fusion_groups: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="Gradients all-reduced in this many fused groups of consecutive parameters (MindFormers' "
        "gradient_aggregation_group): more groups start communicating earlier in the backward, fewer send larger "
        "messages. "
        "MindSpore data parallel (all_reduce_fusion_config); torch's FSDP2 groups per block and refuses it. null = the "
        "engine's default.",
    )
    world_size: int | None = Field(
        None,
        ge=1,
        description="Expected number of processes; null = the product "
        "dp_replicate*dp_shard*cp*tp*pp. Checked against the launcher's "
        "WORLD_SIZE at start.",
    )

    @field_validator("dp_shard")
    @classmethod
    def _shard_degree(cls, v: int) -> int:
        if v == 0:
            raise ValueError("must be >= 1, or -1 for whatever is left of the world size")
        return v

    @property
    def non_dp_product(self) -> int:
        """dp_replicate*cp*tp*pp: the degrees that are always given (dp_shard may be -1)."""
        return self.dp_replicate * self.cp * self.tp * self.pp

    def resolved_dp_shard(self, world_size: int | None = None) -> int:
        """dp_shard with -1 resolved from ``world_size`` (or parallel.world_size); raises ValueError if unknown."""
        if self.dp_shard != -1:
            return self.dp_shard
        world = world_size if world_size is not None else self.world_size
        if world is None:
            raise ValueError("parallel.dp_shard=-1 takes what is left of the world size, which is not known yet: "
                             "set parallel.world_size or resolve the layout at launch")
        if world % self.non_dp_product:
            raise ValueError(f"parallel.dp_shard=-1: {world} processes are not divisible by "
                             f"dp_replicate*cp*tp*pp = {self.non_dp_product}")
        return world // self.non_dp_product

    @property
    def degree_product(self) -> int:
        """dp_replicate*dp_shard*cp*tp*pp, dp_shard=-1 resolved from world_size: the number of processes."""
        return self.non_dp_product * self.resolved_dp_shard()

    def data_parallel(self, world_size: int | None = None) -> int:
        """dp_replicate*dp_shard, dp_shard=-1 resolved from ``world_size`` (or parallel.world_size): how many ways the
        batch is split (global batch = micro_batch_size*grad_accum*dp)."""
        return self.dp_replicate * self.resolved_dp_shard(world_size)

    @property
    def dp(self) -> int:
        """:meth:`data_parallel` of the configured world size."""
        return self.data_parallel()

    @property
    def shards_optimizer(self) -> bool:
        """Whether optimizer state is sharded at all (explicitly, or by FSDP)."""
        return self.optimizer_shard or self.resolved_dp_shard() > 1


def split_settings(parallel) -> list[str]:
    """The settings of a ParallelConfig or Layout that split the model or its training state over ranks (everything but
    whole data-parallel replicas), as 'key=value'. The MindSpore engine runs these only in its semi-auto parallel mode
    (Ascend/GPU), where each rank holds slices; this is the one home of that distinction."""
    out = [f"dp_shard={parallel.dp_shard} (sharded parameters and optimizer state)"] if parallel.dp_shard != 1 else []
    out += [f"{name}={getattr(parallel, name)}" for name in ("tp", "pp", "cp", "ep") if getattr(parallel, name) > 1]
    if parallel.optimizer_shard:
        out.append("optimizer_shard=true")
    return out
