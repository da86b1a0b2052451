"""Semi-auto parallel strategies for the MindSpore engine (Ascend/GPU), from the run config's `parallel` section.

MindSpore's SEMI_AUTO_PARALLEL mode compiles one graph for all devices from per-primitive ``shard()``
strategies, Cell ``pipeline_stage`` attributes and the auto-parallel context. This module derives all
three from the same layout the torch engine runs (:class:`mindfoundry.config.parallel_config.Layout`):

- :func:`plan_strategies` (pure, no MindSpore import): the :class:`StrategyPlan` of a launch's layout (checked
  against the layout rules once, by :func:`mindfoundry.parallel.layout.launch_layout`);
- :func:`apply_strategies`: ``shard()`` on the model's primitives and ``pipeline_stage`` /
  ``pipeline_segment`` on its Cells;
- :func:`configure_context`: ``ms.set_auto_parallel_context(**plan.context)``.

A strategy has one tuple per primitive input and one number per input dimension: how many ways that
dimension is split. The devices of a pipeline stage form the grid ``dp x cp x tp`` (dp outermost, tp
ranks neighbours, as in the torch engine's mesh), dp = dp_replicate * dp_shard. The Linear layers
multiply 2-D ``(B*S, in)`` by the ``[out, in]`` weight (``MatMul(transpose_b=True)``), so the rows are
split ``dp*cp`` ways (batch by dp, sequence by cp):

=================================  ==========================================  ============================
primitive                          in_strategy                                 what it is
=================================  ==========================================  ============================
q/k/v_proj, gate/up_proj .matmul   ``((dp*cp, 1), (tp, 1))``                   column-parallel (heads / ffn)
o_proj, down_proj .matmul          ``((dp*cp, tp), (1, tp))``                  row-parallel: partial sums
                                   out ``((dp*cp*tp, 1),)`` with SP and tp>1   reduce-scattered over rows
head_matmul / lm_head.matmul       ``((dp*cp, 1), (tp, 1))``                   vocab-parallel output head
=================================  ==========================================  ============================

Not applied, because model.py computes them with functional ops (``ops.gather``, ``ops.matmul``,
``ops.softmax``, the RMSNorm arithmetic, the loss), which have no ``shard()``: the vocab-parallel
embedding gather ``((tp, 1), (dp, cp))``, attention ``q @ k^T`` and ``probs @ v`` on ``(B, H, S, D)``
``((dp, tp, cp, 1), (dp, tp, 1, 1))`` (the query's sequence split by cp, K and V whole: gathered),
softmax ``((dp, tp, cp, 1),)``, the norms on ``(B, S, C)`` ``((dp, cp*tp, 1),)`` with sequence
parallelism (else ``((dp, cp, 1),)``), and the vocab-parallel loss on ``(B*S, V)`` ``((dp*cp, tp),)``.
They are listed in :attr:`StrategyPlan.pending`; MindSpore gives those ops its default strategy and
inserts the redistributions. Making them primitives in model.py is what applies them.

Other parts of the plan:

- pipeline: the layers cut into ``pp * pp_virtual_stages`` contiguous chunks; chunk c runs on stage
  ``c % pp`` (segment ``c // pp`` with virtual stages), the embedding on stage 0, the final norm and
  the head on the last; ``train.grad_accum`` is the pipeline's micro-batch count (the ``micro_size``
  of ``mindspore.parallel.Pipeline``); GPipe and Interleaved1F1B need ``pipeline_interleave``
  (MindSpore allows a non-interleaved pipeline only with its 1f1b scheduler).
- parallel optimizer: ``dp_shard > 1`` shards weights, gradients and optimizer state over the
  dp_shard ranks (``optimizer_level: level3``, ``optimizer_weight_shard_size: dp_shard``; FSDP);
  ``optimizer_shard`` alone shards the optimizer state over all dp ranks (``level1``, ZeRO-1).
  MindSpore has one shard-group size, so with both, the optimizer state is sharded over dp_shard
  only. MindSpore shards the state of ``nn.Optimizer`` subclasses, which the engine's AdamW is.
- context parallelism: the sequence is split contiguously (rank c holds chunk c). The
  load-balanced causal layout of the layout rules (chunks i and 2*cp-1-i) is not expressible as a
  shard() strategy: the causal work per cp rank is unbalanced.
- experts (``model.moe.num_experts > 0``; only in the MoE blocks): the stacked expert weights
  ``[E, out, in]`` are split over ``ep`` ranks along E, and the ``(E, N, in)`` token copies along E by
  ep and along the tokens by the remaining ``dp*cp/ep`` data ranks; the ffn dimension by tp as in
  the dense MLP: gate/up ``((ep, dp*cp/ep, 1), (ep, tp, 1))``, down ``((ep, dp*cp/ep, tp), (ep, 1, tp))``
  (:attr:`StrategyPlan.experts`); the router is replicated ``((dp*cp, 1), (1, 1))``. With
  ``model.moe.capacity_factor`` the model routes tokens into per-expert buffers of (E, B*capacity)
  rows (model.py :meth:`MoE.routed`): the buffers are built split by tokens and consumed split by
  experts, the redistribution the compiler implements as an AlltoAll. Without a capacity limit every
  expert runs on every token, so this splits the expert weights and work, not a token dispatch.
  ``ep > 1`` on a dense model is refused.
- inputs: ``dataset_strategy: full_batch`` -- every rank feeds the whole global batch and the
  strategies slice it.

None of this runs on CPU (SEMI_AUTO_PARALLEL fails there with 'Invalid backend: CPU'); the tests
check the construction, that the model's primitives and Cells take the strategies, and that
MindSpore 2.10 accepts the context. The engine applies it on Ascend/GPU through :mod:`.semi_auto`
(refused on CPU: :func:`mindfoundry.backends.mindspore.distributed.refusal`); :func:`parameter_layouts`
gives the tensor layout each parameter's checkpoint slices follow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mindfoundry.config.parallel_config import Layout
from mindfoundry.config.schema import RunConfig
from mindfoundry.model.spec import ModelSpec, is_moe_layer, parameter_shapes
from mindfoundry.parallel.tensor_layout import TensorLayout, TensorLayoutError

Strategy = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class StrategyPlan:
    """Everything semi-auto parallel needs for one layout of one model."""

    layout: Layout
    device_num: int
    context: dict[str, Any]  # keyword arguments of ms.set_auto_parallel_context
    shards: dict[str, tuple[Strategy, Strategy | None]]  # 'cell.path.primitive' -> (in_strategy, out_strategy)
    stages: dict[str, int]  # Cell path -> pipeline_stage
    segments: dict[str, int]  # Cell path -> pipeline_segment (virtual chunk), only with pp_virtual_stages > 1
    micro_batches: int  # the pipeline's micro-batches (train.grad_accum)
    pending: dict[str, Strategy] = field(default_factory=dict)  # wanted for functional ops that take no shard()
    experts: dict[str, Strategy] = field(
        default_factory=dict
    )  # the expert primitives' in_strategy (also in shards); MoE only

    def strategy(self, path: str) -> Strategy:
        """The in_strategy of one primitive, e.g. plan.strategy('layers.0.attn.q_proj.matmul')."""
        return self.shards[path][0]


def plan_strategies(cfg: RunConfig, spec: ModelSpec, lay: Layout) -> StrategyPlan:
    """The semi-auto plan of the launch's layout `lay` (on ``lay.world_size`` devices) for `spec`."""
    device_num = lay.world_size
    dp, tp, cp, pp, v, ep = lay.dp, lay.tp, lay.cp, lay.pp, lay.pp_virtual_stages, lay.ep
    rows = dp * cp
    column: Strategy = ((rows, 1), (tp, 1))
    row: Strategy = ((rows, tp), (1, tp))
    row_out: Strategy | None = ((rows * tp, 1),) if lay.sequence_parallel and tp > 1 else None

    shards: dict[str, tuple[Strategy, Strategy | None]] = {}
    experts: dict[str, Strategy] = {}
    for i in range(spec.n_layers):
        for name in ("q_proj", "k_proj", "v_proj"):
            shards[f"layers.{i}.attn.{name}.matmul"] = (column, None)
        shards[f"layers.{i}.attn.o_proj.matmul"] = (row, row_out)
        if is_moe_layer(spec, i):
            shards[f"layers.{i}.mlp.router.matmul"] = (((rows, 1), (1, 1)), None)
            tokens = rows // ep  # ep divides dp_shard*cp, hence dp*cp
            experts[f"layers.{i}.mlp.experts.gate_proj.bmm"] = ((ep, tokens, 1), (ep, tp, 1))
            experts[f"layers.{i}.mlp.experts.up_proj.bmm"] = ((ep, tokens, 1), (ep, tp, 1))
            experts[f"layers.{i}.mlp.experts.down_proj.bmm"] = ((ep, tokens, tp), (ep, 1, tp))
            continue
        for name in ("gate_proj", "up_proj"):
            shards[f"layers.{i}.mlp.{name}.matmul"] = (column, None)
        shards[f"layers.{i}.mlp.down_proj.matmul"] = (row, row_out)
    shards.update({path: (strategy, None) for path, strategy in experts.items()})
    shards["head_matmul" if spec.tie_embeddings else "lm_head.matmul"] = (column, None)

    norm_split = cp * tp if lay.sequence_parallel and tp > 1 else cp
    pending: dict[str, Strategy] = {
        "embed (gather)": ((tp, 1), (dp, cp)),
        "attention scores q @ k^T": ((dp, tp, cp, 1), (dp, tp, 1, 1)),
        "attention softmax": ((dp, tp, cp, 1),),
        "attention probs @ v": ((dp, tp, cp, 1), (dp, tp, 1, 1)),
        "RMSNorm (attn_norm, mlp_norm, norm)": ((dp, norm_split, 1),),
        "loss (log-sum-exp over the vocabulary)": ((rows, tp),),
    }
    if experts:
        pending["MoE routing (router softmax, top-k, gather of the picked expert outputs)"] = ((rows, 1),)

    stages: dict[str, int] = {}
    segments: dict[str, int] = {}
    if pp > 1:
        chunk = spec.n_layers // (pp * v)
        for i in range(spec.n_layers):
            c = i // chunk
            stages[f"layers.{i}"] = c % pp
            if v > 1:
                segments[f"layers.{i}"] = c // pp
        stages["embed"] = 0
        stages["norm"] = pp - 1
        if not spec.tie_embeddings:
            stages["lm_head"] = pp - 1

    context: dict[str, Any] = {
        "parallel_mode": "semi_auto_parallel",
        "device_num": device_num,
        "gradients_mean": False,  # the loss is already scaled by 1/(valid tokens of the global batch)
        "dataset_strategy": "full_batch",
        "pipeline_stages": pp,
        "enable_parallel_optimizer": lay.shards_optimizer,
    }
    if pp > 1:
        context["pipeline_config"] = {"pipeline_interleave": v > 1 or lay.pp_schedule == "GPipe",
                                      "pipeline_scheduler": "gpipe" if lay.pp_schedule == "GPipe" else "1f1b"}
    if lay.shards_optimizer:
        context["parallel_optimizer_config"] = (
            {"optimizer_level": "level3", "optimizer_weight_shard_size": lay.dp_shard} if lay.dp_shard > 1
            else {"optimizer_level": "level1", "optimizer_weight_shard_size": -1})
    return StrategyPlan(layout=lay, device_num=device_num, context=context, shards=shards, stages=stages,
                        segments=segments, micro_batches=cfg.train.grad_accum, pending=pending, experts=experts)


def parameter_layouts(plan: StrategyPlan, spec: ModelSpec) -> dict[str, TensorLayout]:
    """The tensor layout each parameter gets under `plan`: what its rank slices of a checkpoint hold.

    The grid of a stage is ``(dp*cp, tp)`` (``(ep, dp*cp/ep, tp)`` for the stacked expert weights); a weight is split
    the way its matmul's ``shard()`` splits it (tp on the output rows of column-parallel layers and the vocab-parallel
    head, on the input columns of row-parallel ones, ep on the experts) and is whole elsewhere (norms, the router, an
    untied embedding, whose gather takes no strategy). With the parallel optimizer its replicas split the slice's first
    dimension over ``optimizer_weight_shard_size`` ranks (all replicas for -1), where that divides evenly (MindSpore
    leaves the others whole). The stage is the pipeline stage of the Cell the parameter belongs to.
    """
    lay = plan.layout
    rows = lay.dp * lay.cp
    maps: dict[str, tuple[int, ...]] = {}
    for path, (strategy, _) in plan.shards.items():
        weight = "embed.weight" if path == "head_matmul" else path.rpartition(".")[0] + ".weight"
        w = strategy[1]
        if (
            len(w) == 3
        ):  # stacked experts [E, out, in] on the (ep, dp*cp/ep, tp) grid: ep is grid index 2 (from the right)
            maps[weight] = (2 if w[0] > 1 else -1,) + tuple(0 if k > 1 else -1 for k in w[1:])
        else:  # [out, in] on the (dp*cp, tp) grid: tp is grid index 0
            maps[weight] = tuple(0 if k > 1 else -1 for k in w)
    opt = (
        plan.context["parallel_optimizer_config"]["optimizer_weight_shard_size"]
        if plan.context["enable_parallel_optimizer"]
        else 0
    )
    out = {}
    for name, shape in parameter_shapes(spec).items():
        tensor_map = maps.get(name, (-1,) * len(shape))
        grid = (lay.ep, rows // lay.ep, lay.tp) if len(tensor_map) == 3 else (rows, lay.tp)
        stage = max((s for cell, s in plan.stages.items() if name.startswith(cell + ".")), default=0)
        layout = TensorLayout(grid, tensor_map, opt, stage)
        try:
            pieces = layout.opt_pieces
        except TensorLayoutError:  # the replicas do not divide into groups of that size
            pieces = 1
        if pieces == 1 or (shape[0] // layout.splits()[0]) % pieces:
            layout = TensorLayout(grid, tensor_map, 0, stage)
        out[name] = layout
    return out


def apply_strategies(plan: StrategyPlan, model) -> list[str]:
    """Set the plan's ``shard()`` strategies and pipeline stages on a :class:`~.model.Transformer`; returns the paths
    set.

    Raises KeyError naming a path the model does not have (a renamed Cell or primitive).
    """
    cells = dict(model.cells_and_names())
    done = []
    for path, (in_strategy, out_strategy) in plan.shards.items():
        cell_path, _, attr = path.rpartition(".")
        cell = cells.get(cell_path)
        if cell is None or not hasattr(cell, attr):
            raise KeyError(f"the model has no primitive '{path}' to shard")
        primitive = getattr(cell, attr)
        if out_strategy is None:
            primitive.shard(in_strategy)
        else:
            primitive.shard(in_strategy, out_strategy)
        done.append(path)
    for attr, assignment in (("pipeline_stage", plan.stages), ("pipeline_segment", plan.segments)):
        for path, value in assignment.items():
            if path not in cells:
                raise KeyError(f"the model has no Cell '{path}' to place on a pipeline stage")
            setattr(cells[path], attr, value)
            done.append(f"{path}.{attr}")
    return done


def configure_context(plan: StrategyPlan) -> None:
    """Put MindSpore in semi-auto parallel mode for the plan (before the network is built or compiled)."""
    import mindspore as ms

    ms.set_auto_parallel_context(**plan.context)
