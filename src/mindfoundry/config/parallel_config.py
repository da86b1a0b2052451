"""The `parallel` section: the degrees of the process grid (the rules that relate them to the model are
:mod:`mindfoundry.config.layout_rules`'s)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Literal, Protocol

from pydantic import Field, field_validator

from mindfoundry.config.section import Section

#: Keys that were renamed or split, with what to write instead (load.py shows these for an unknown key).
RENAMED_KEYS: dict[str, str] = {
    "parallel.dp": "parallel.dp was split into dp_replicate (replicas) and dp_shard (FSDP shards): set one of them "
                   "(e.g. dp_shard: 8 for 8 sharded data-parallel ranks, or dp_replicate: 8 for plain DDP)",
}


Schedule = Literal["1F1B", "GPipe", "Interleaved1F1B"]
#: The grid dimensions (in the order messages and describe() name them); their product is the world size.
DEGREES = ("dp_replicate", "dp_shard", "cp", "tp", "pp")


class BatchShape(Protocol):
    """What the batch arithmetic and the layout rules need of train: a TrainConfig, or a :class:`Batch`."""

    seq_len: int
    micro_batch_size: int
    grad_accum: int


@dataclass(frozen=True)
class Batch:
    """A batch shape without a whole TrainConfig (used by the planner)."""

    seq_len: int
    micro_batch_size: int = 1
    grad_accum: int = 1


@dataclass(frozen=True)
class Layout:
    """One resolved parallel layout (the parallel section with dp_shard known): the one home of the grid's
    arithmetic -- the world size, the data-parallel degree and the global batch."""

    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    sequence_parallel: bool = True
    pp_schedule: Schedule = "1F1B"
    pp_virtual_stages: int = 1
    optimizer_shard: bool = False

    @property
    def dp(self) -> int:
        """Ways the batch is split: dp_replicate * dp_shard."""
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        """Processes of the grid: dp * cp * tp * pp."""
        return self.dp * self.cp * self.tp * self.pp

    def global_batch(self, train: BatchShape) -> int:
        """Sequences per optimizer step: micro_batch_size * grad_accum * dp (the trainer cuts it into the engine's
        feeds)."""
        return train.micro_batch_size * train.grad_accum * self.dp

    def grad_accum_for(self, global_batch: int, micro_batch_size: int) -> int | None:
        """The grad_accum whose :meth:`global_batch` is ``global_batch`` at this micro-batch size; None when no whole
        number of micro-batches per rank gives it (the planner's question, the inverse of :meth:`global_batch`)."""
        steps, rest = divmod(global_batch, self.dp * micro_batch_size)
        return steps if steps >= 1 and not rest else None

    @property
    def optimizer_shards(self) -> int:
        """Ranks one copy of the optimizer state is spread over."""
        return self.dp if self.optimizer_shard else self.dp_shard

    @property
    def shards_optimizer(self) -> bool:
        """Whether optimizer state is sharded at all (explicitly, or by FSDP): MindSpore's parallel optimizer."""
        return self.optimizer_shard or self.dp_shard > 1

    def config(self) -> dict:
        """The parallel section of a config for this layout."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        return out | {"world_size": self.world_size}

    def describe(self) -> str:
        """Compact text, e.g. 'dp_shard=4, tp=2' (degrees above 1, then the options that matter)."""
        parts = [f"{name}={getattr(self, name)}" for name in (*DEGREES, "ep") if getattr(self, name) != 1]
        if self.pp > 1 and self.pp_schedule != "1F1B":
            parts.append(f"pp_schedule={self.pp_schedule}")
        if self.pp_virtual_stages != 1:
            parts.append(f"pp_virtual_stages={self.pp_virtual_stages}")
        if self.tp > 1 and not self.sequence_parallel:
            parts.append("sequence_parallel=false")
        if self.optimizer_shard and self.dp_replicate > 1:
            parts.append("optimizer_shard=true")
        return ", ".join(parts) or "single process"


class ParallelConfig(Section):
    """Multi-dimensional parallel layout (see docs/parallelism.md).

    The processes form a grid dp_replicate x dp_shard x cp x tp x pp whose product is the world size;
    ep is carved out of dp_shard x cp (torchtitan-style). The rules that relate these numbers to the
    model, the sequence and the batch are in :mod:`mindfoundry.config.layout_rules`.
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

    def layout(self, world_size: int | None = None) -> Layout:
        """The resolved layout: dp_shard=-1 takes what the other degrees leave of ``world_size`` (the launcher's
        process count) or else parallel.world_size; ValueError when neither is known or it does not divide."""
        fixed = Layout(**{f.name: getattr(self, f.name) for f in fields(Layout)} | {"dp_shard": 1})
        if self.dp_shard != -1:
            return replace(fixed, dp_shard=self.dp_shard)
        world = world_size if world_size is not None else self.world_size
        if world is None:
            raise ValueError("parallel.dp_shard=-1 takes what is left of the world size, which is not known yet: "
                             "set parallel.world_size or resolve the layout at launch")
        if world % fixed.world_size:
            raise ValueError(f"parallel.dp_shard=-1: {world} processes are not divisible by "
                             f"dp_replicate*cp*tp*pp = {fixed.world_size}")
        return replace(fixed, dp_shard=world // fixed.world_size)


def split_settings(parallel) -> list[str]:
    """The settings of a ParallelConfig or Layout that split the model or its training state over ranks (everything but
    whole data-parallel replicas), as 'key=value'. The MindSpore engine runs these only in its semi-auto parallel mode
    (Ascend/GPU), where each rank holds slices; this is the one home of that distinction."""
    out = [f"dp_shard={parallel.dp_shard} (sharded parameters and optimizer state)"] if parallel.dp_shard != 1 else []
    out += [f"{name}={getattr(parallel, name)}" for name in ("tp", "pp", "cp", "ep") if getattr(parallel, name) > 1]
    if parallel.optimizer_shard:
        out.append("optimizer_shard=true")
    return out
