"""The MindSpore train step under SEMI_AUTO_PARALLEL: tensor, pipeline, context and expert parallel and the
parallel optimizer, from the same ``parallel`` section the torch engine runs (Ascend; GPU where MindSpore allows).

Written against MindSpore 2.10's documented API and **not run on any device here**: this machine is CPU-only and
MindSpore refuses SEMI_AUTO_PARALLEL on CPU, so the engine refuses these layouts on CPU before reaching this
module (:func:`.distributed.refusal`). What the tests cover on CPU: the plan for every layout in configs/, that
the model's primitives and Cells take it, that MindSpore accepts the context, that the whole step (pipeline
wrapper, pipeline gradient reducer, optimizer) is built from it, and the checkpoint form below, merged against
MindSpore's own ``transform_checkpoints`` (docs/parallelism.md has the table of what runs where).

The step (:class:`.train_step.TrainStep`) is the single-device one: the compiler inserts the collectives the
strategies imply (gradient all-reduce over the data-parallel ranks, the tensor-parallel reductions, the parallel
optimizer's all-gathers), so nothing here reduces by hand. ``dataset_strategy: full_batch``: every rank is fed the
whole global batch and the strategies slice it, so the data loader runs as one feed (dp_rank 0 of 1) on every rank, in
micro-batches of ``micro_batch_size * dp`` rows (the run's global batch, as on the torch engine and in the run's
identity).

- pipeline (``pp > 1``): the loss Cell is wrapped in ``mindspore.parallel.nn.Pipeline(loss, micro_size)``, which cuts
  its inputs along the first axis into ``train.grad_accum`` micro-batches and sums their losses; the step then takes
  the global batch as one "micro-batch" of ``grad_accum * micro_batch_size * dp`` rows, and the gradients pass through
  ``PipelineGradReducer`` before the update (MindSpore's documented pipeline training pattern);
- strategy file: ``strategy_ckpt_config`` makes the compiler write each rank's tensor layouts to
  ``RUN/strategy/rank_N.json`` (all parameters, the AdamW moments included);
- checkpoints (``checkpoint.format: sharded``, required for these layouts): each rank writes the slices it holds to
  ``model/rank_N.safetensors`` and ``optimizer/rank_N.safetensors``, rank 0 the strategy (merged over the pipeline
  stages with ``mindspore.merge_pipeline_strategys``) as ``strategy.json`` beside them. That folder merges into the full
  format without MindSpore (:mod:`mindfoundry.checkpoint.rank_slices`), so the run continues on one device or on the
  torch engine;
- resume (and the initial weights): full arrays, set on the full-shape Parameters before the step first compiles; the
  compiler then keeps each rank's slice (MindSpore's documented way to start a parallel network from a complete
  checkpoint), so a checkpoint written under any layout, or in one process, continues under this one.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import Parameter, nn, ops

from mindfoundry.backends.mindspore.strategies import StrategyPlan, apply_strategies, configure_context, plan_strategies
from mindfoundry.config.parallel_config import Layout
from mindfoundry.config.schema import RunConfig
from mindfoundry.model.spec import ModelSpec
from mindfoundry.parallel.tensor_layout import STRATEGY_FILE, rank_file_name


def strategy_dir(cfg: RunConfig) -> Path:
    """Where the compiler writes each rank's layouts (RUN/strategy/rank_N.json)."""
    return Path(cfg.run_dir) / "strategy"


def enter(cfg: RunConfig, spec: ModelSpec, layout: Layout, rank: int) -> StrategyPlan:
    """Semi-auto parallel mode for the launch's `layout` (after ``communication.init()``, before any Cell)."""
    plan = plan_strategies(cfg, spec, layout)
    configure_context(plan)
    folder = strategy_dir(cfg)
    folder.mkdir(parents=True, exist_ok=True)
    ms.set_auto_parallel_context(strategy_ckpt_config={"save_file": str(folder / f"rank_{rank}.json"),
                                                       "only_trainable_params": False})
    return plan


class _PipelineLoss(nn.Cell):
    """The loss Cell with its scale as a per-row input: the pipeline wrapper slices every input along axis 0."""

    def __init__(self, loss_cell: nn.Cell):
        super().__init__(auto_prefix=False)
        self.loss_cell = loss_cell

    def construct(self, ids, labels, scale_rows):
        return self.loss_cell(ids, labels, scale_rows[0])


class PipelineLoss(nn.Cell):
    """``Pipeline(loss, micro_size)`` over the global batch, called like the loss Cell: (ids, labels, scale)."""

    def __init__(self, loss_cell: nn.Cell, micro_batches: int):
        super().__init__(auto_prefix=False)
        self.pipeline = ms.parallel.nn.Pipeline(_PipelineLoss(loss_cell), micro_batches)

    def construct(self, ids, labels, scale):
        rows = ops.broadcast_to(scale.reshape((1,)), (ids.shape[0],))
        return self.pipeline(ids, labels, rows)


def wrap_loss(plan: StrategyPlan, model: nn.Cell, loss_cell: nn.Cell) -> tuple[nn.Cell, int]:
    """Shard the model by the plan; (the loss Cell the step differentiates, micro-batches the step loops over)."""
    apply_strategies(plan, model)
    if plan.layout.pp > 1:
        return PipelineLoss(loss_cell, plan.micro_batches), 1
    return loss_cell, plan.micro_batches


def grad_reducer(plan: StrategyPlan, params: list[Parameter]) -> nn.Cell | None:
    """The pipeline's gradient reducer (accumulates the micro-batches' gradients per stage), else None."""
    if plan.layout.pp > 1:
        return ms.parallel.nn.PipelineGradReducer(ms.ParameterTuple(params))
    return None


def step_batch(plan: StrategyPlan, array: np.ndarray) -> np.ndarray:
    """(grad_accum, micro_batch, S) as the step takes it: one block of every row under a pipeline, else unchanged."""
    if plan.layout.pp > 1:
        return array.reshape((1, array.shape[0] * array.shape[1]) + array.shape[2:])
    return array


def save_rank_slices(folders: tuple[Path, Path], weights: dict[str, Parameter], moments: dict[str, Parameter],
                     rank: int, strategies: Path, pipeline_stages: int) -> None:
    """This rank's slices (the parameters' local data) into the two shard folders; rank 0 adds the strategy file,
    merged over the pipeline stages from the compiler's per-rank files in `strategies`."""
    from safetensors.numpy import save_file

    for folder, params in zip(folders, (weights, moments)):
        folder.mkdir(parents=True, exist_ok=True)
        save_file({n: p.asnumpy() for n, p in params.items()}, str(folder / rank_file_name(rank)))
    if rank == 0:
        merged = folders[0] / STRATEGY_FILE
        if pipeline_stages > 1:
            ms.merge_pipeline_strategys(str(strategies), str(merged))
        else:
            shutil.copyfile(strategies / "rank_0.json", merged)
        shutil.copyfile(merged, folders[1] / STRATEGY_FILE)
