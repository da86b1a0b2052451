"""Pipeline parallelism for the torch engine, on ``torch.distributed.pipelining``.

**Stages.** The blocks are cut into ``pp * pp_virtual_stages`` equal contiguous chunks (the layout
rules guarantee that this divides ``n_layers``); stage 0 also holds the embedding, the last stage
the final norm, the output head and the loss. Stage ``i`` runs on pipeline rank ``i % pp`` (the
"loop" placement that Interleaved1F1B expects: rank 0 holds stages 0, pp, 2pp, ...). A
:class:`StageModule` keeps the full model's attribute paths (``embed``, ``layers.<i>``, ``norm``,
``lm_head``; the blocks sit in a ``ModuleDict`` keyed by their global index), so a stage holding
blocks 2..3 still names its parameters ``layers.2.*`` and ``layers.3.*``: checkpoints, the optimizer
state names and dumps are unchanged.

**Tied embeddings** (``model.tie_embeddings``): the first stage uses the matrix as the embedding,
the last as the output head, and with pp > 1 they are different processes. Each holds its own copy
under the one name ``embed.weight`` (the same values: both load the same full array). After every
backward pass the two copies' gradients are **summed** over a two-rank group (first and last
pipeline rank of the same data/context coordinate), so both copies receive the gradient of the
shared weight, both AdamW updates are identical and the copies stay one parameter in value. The
gradient norm counts the matrix once (the first stage owns it); ``weights()`` reports it once.

**Schedules.** 1F1B and GPipe run one stage per rank, Interleaved1F1B ``pp_virtual_stages``. The
micro-batches are the step's ``train.grad_accum`` micro-batches (the ``[grad_accum, micro, seq]``
batch flattened to ``[grad_accum*micro, seq]`` and cut back into the same ``grad_accum`` pieces by
the schedule). The loss function is the single-process one: ``token_nll`` summed over the
micro-batch's valid tokens, times ``loss_scale`` = 1/(valid tokens of the global batch), with
``scale_grads=False`` so the schedule sums micro-batch gradients instead of averaging them: the
gradients are those of the global token-mean loss, as in one process.

**Data parallelism** inside each stage: FSDP2 ``fully_shard`` per block and on the stage module, on
the same data-parallel mesh as without pipelining (``dp_shard``, or ``(dp_replicate, dp_shard)``),
gradients summed. The pipelining runtime defers the gradient reduce-scatter to the last
micro-batch.

**Global numbers.** The loss lives on the last stage and is summed over the pipeline ranks (then
over dp by the backend); the gradient norm adds each rank's squared norms of the parameters it
owns over the pipeline ranks; weights and moments are gathered to full arrays on every rank (one
all-reduce of a flat buffer over the pipeline group, each name filled in by its owner).
Evaluation, logits and module outputs run a forward-only pass stage by stage with send/recv of the
hidden states, then share the result over the pipeline group.
"""

from __future__ import annotations

import math
from typing import Callable, ContextManager, Iterable, Mapping

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from torch.distributed.tensor import DTensor

from mindfoundry.backends.base import StepScalars
from mindfoundry.backends.torch.distributed import Layout, all_reduce_sum, dp_mesh_for_fsdp, full_value, shard_like
from mindfoundry.backends.torch.model import Transformer, eval_sums, token_nll
from mindfoundry.model.spec import module_boundaries, parameter_shapes

SCHEDULES = {"1F1B": Schedule1F1B, "GPipe": ScheduleGPipe, "Interleaved1F1B": ScheduleInterleaved1F1B}


def stage_layers(n_layers: int, n_stages: int, index: int) -> range:
    """The global block indices of stage `index` of `n_stages` equal contiguous chunks."""
    if n_layers % n_stages:
        raise ValueError(
            f"model.n_layers={n_layers} is not divisible into parallel.pp * pp_virtual_stages = {n_stages} equal stages"
        )
    per = n_layers // n_stages
    return range(index * per, (index + 1) * per)


class StageModule(nn.Module):
    """One pipeline stage of a :class:`Transformer`, under the full model's parameter names.

    Input: token ids (first stage) or the hidden states [B, S, C]; output: hidden states, or the
    logits [B, S, V] (last stage). The modules are the full model's own (not copies).
    """

    def __init__(self, model: Transformer, index: int, n_stages: int, autocast: Callable[[], ContextManager]):
        super().__init__()
        self.index, self.is_first, self.is_last = index, index == 0, index == n_stages - 1
        self.tied_head = self.is_last and model.lm_head is None
        if self.is_first or self.tied_head:
            self.embed = model.embed  # the embedding, and/or (last stage, tied) the output head's matrix
        self.layers = nn.ModuleDict({str(i): model.layers[i] for i in stage_layers(len(model.layers), n_stages, index)})
        if self.is_last:
            self.norm = model.norm
            if model.lm_head is not None:
                self.lm_head = model.lm_head
        self.register_buffer("cos", model.cos, persistent=False)
        self.register_buffer("sin", model.sin, persistent=False)
        self.autocast = autocast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.autocast():
            if self.is_first:
                x = self.embed(x)
            s = x.shape[1]
            cos, sin = self.cos[:s], self.sin[:s]
            for block in self.layers.values():
                x = block(x, cos, sin)
            if self.is_last:
                x = self.norm(x)
                x = F.linear(x, self.embed.weight if self.tied_head else self.lm_head.weight)
        return x


class RankModules(nn.Module):
    """This rank's parts of the model under the full model's paths (what ``named_parameters``,
    ``train()``/``eval()`` and module hooks see); it has no forward of its own."""

    def __init__(self, stages: Iterable[StageModule]):
        super().__init__()
        stages = list(stages)
        ends = {name: getattr(s, name) for s in stages for name in ("embed", "norm", "lm_head") if hasattr(s, name)}
        if "embed" in ends:  # registered in the full model's order: embed, layers, norm, lm_head
            self.embed = ends["embed"]
        self.layers = nn.ModuleDict({k: m for s in sorted(stages, key=lambda s: s.index) for k, m in s.layers.items()})
        for name in ("norm", "lm_head"):
            if name in ends:
                setattr(self, name, ends[name])


def _tie_group(mesh: DeviceMesh, pp: int) -> dist.ProcessGroup:
    """The two-rank group (first, last pipeline rank) of this rank's data/context/tensor coordinate.

    Every rank creates every such group (group creation is collective over the world) and keeps its own.
    """
    ranks = mesh.mesh.reshape(pp, -1)
    pairs = [[int(ranks[0, c]), int(ranks[pp - 1, c])] for c in range(ranks.shape[1])]
    mine, _ = dist.new_subgroups_by_enumeration(pairs, group_desc="tied_embedding")
    return mine


class Pipeline:
    """This rank's stages of a pipeline-parallel :class:`Transformer`, its schedule and the global views."""

    def __init__(self, model: Transformer, mesh: DeviceMesh, layout: Layout, device: torch.device,
                 autocast: Callable[[], ContextManager], n_microbatches: int):
        self.spec, self.device, self.layout = model.spec, device, layout
        pp, v = layout.pp, layout.pp_virtual_stages
        if layout.pp_schedule not in SCHEDULES:
            raise ValueError(f"parallel.pp_schedule={layout.pp_schedule!r}: use one of {sorted(SCHEDULES)}")
        if (v > 1) != (layout.pp_schedule == "Interleaved1F1B"):
            raise ValueError(
                f"parallel.pp_virtual_stages={v} with pp_schedule {layout.pp_schedule}: Interleaved1F1B runs "
                "pp_virtual_stages >= 2 chunks per rank, 1F1B and GPipe one"
            )
        self.pp_mesh = mesh["pp"]
        self.pp_group = self.pp_mesh.get_group()
        self.pp_rank = self.pp_mesh.get_local_rank()
        self.pp_ranks = dist.get_process_group_ranks(self.pp_group)  # global rank of each pipeline rank
        self.n_stages = pp * v
        self.stages = [StageModule(model, self.pp_rank + k * pp, self.n_stages, autocast) for k in range(v)]
        if layout.dp > 1:  # FSDP2 per block and per stage, gradients summed (as parallelize.apply_fsdp)
            from mindfoundry.backends.torch.parallelize import apply_fsdp

            for stage in self.stages:
                apply_fsdp(stage, dp_mesh_for_fsdp(mesh, layout))
        self.module = RankModules(self.stages)
        self.has_first = any(s.is_first for s in self.stages)
        self.has_last = any(s.is_last for s in self.stages)
        self.tied = model.lm_head is None
        self.tie_group = _tie_group(mesh, pp) if self.tied else None

        self.shapes = parameter_shapes(self.spec)
        local = dict(self.module.named_parameters())
        self.params = {n: local[n] for n in self.shapes if n in local}  # canonical order
        # the parameters this rank reports and counts: all but the last stage's copy of a tied embedding
        self.owned = {n: p for n, p in self.params.items() if not (n == "embed.weight" and not self.has_first)}

        self.loss_scale = 1.0  # set per step: 1/(valid tokens of the global batch)
        pipe = [PipelineStage(s, s.index, self.n_stages, device, group=self.pp_group) for s in self.stages]
        target = pipe if layout.pp_schedule == "Interleaved1F1B" else pipe[0]
        # scale_grads=False: micro-batch gradients are summed (the loss is already a share of the global token mean)
        self.schedule = SCHEDULES[layout.pp_schedule](target, n_microbatches, loss_fn=self._loss, scale_grads=False)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The single-process micro-batch loss: summed token NLL times 1/(valid tokens of the global batch)."""
        nll, _ = token_nll(logits, labels)
        return nll * self.loss_scale

    # -- training ------------------------------------------------------------------------------
    def run_schedule(self, ids: torch.Tensor, labels: torch.Tensor, loss_scale: float) -> torch.Tensor:
        """Forward + backward of the [grad_accum, micro, seq] batch; gradients summed in `.grad`.

        Returns the step's loss summed over the micro-batches and the pipeline ranks (every rank
        gets it); tied-embedding gradients are summed between the first and last stage.
        """
        self.loss_scale = loss_scale
        a, b, s = ids.shape
        args = (ids.reshape(a * b, s),) if self.has_first else ()
        target = labels.reshape(a * b, s) if self.has_last else None
        losses: list[torch.Tensor] = []
        self.schedule.step(*args, target=target, losses=losses if self.has_last else None, return_outputs=False)
        total = torch.zeros((), device=self.device)
        for loss in losses:
            total += loss.detach()
        all_reduce_sum(total, self.pp_mesh)
        if self.tied:
            grad = self.params["embed.weight"].grad
            dist.all_reduce(grad._local_tensor if isinstance(grad, DTensor) else grad, group=self.tie_group)
        return total

    def grad_squares(self) -> torch.Tensor:
        """Per-parameter squared gradient norms in parameter_shapes order, over the whole model (every rank)."""
        names = list(self.shapes)
        out = torch.zeros(len(names), dtype=torch.float32, device=self.device)
        local = full_value(torch.stack([torch.linalg.vector_norm(p.grad) for p in self.owned.values()]) ** 2)
        out[[names.index(n) for n in self.owned]] = local.float()
        return all_reduce_sum(out, self.pp_mesh)

    # -- full <-> local state ------------------------------------------------------------------
    def gather(self, local: Mapping[str, torch.Tensor], shapes: Mapping[str, tuple[int, ...]],
               owner: Callable[[str], bool]) -> dict[str, np.ndarray]:
        """Full float32 arrays of `shapes` (every rank): each name filled in by the rank where `owner(name)`."""
        sizes = {n: math.prod(s) for n, s in shapes.items()}
        flat = torch.zeros(sum(sizes.values()), dtype=torch.float32, device=self.device)
        offset = 0
        for name, size in sizes.items():
            if owner(name):
                flat[offset:offset + size] = full_value(local[name].detach()).float().reshape(-1)
            offset += size
        all_reduce_sum(flat, self.pp_mesh)
        out, offset = {}, 0
        host = flat.cpu().numpy()
        for name, size in sizes.items():
            out[name] = host[offset:offset + size].reshape(shapes[name]).copy()
            offset += size
        return out

    def weights(self) -> dict[str, np.ndarray]:
        return self.gather(self.params, self.shapes, lambda n: n in self.owned)

    def moments(self, optimizer: torch.optim.Optimizer) -> Iterable[tuple[str, torch.Tensor]]:
        for name, p in self.params.items():
            st = optimizer.state.get(p, {})
            for key in ("exp_avg", "exp_avg_sq"):
                yield f"{key}.{name}", st[key] if key in st else torch.zeros_like(p)

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, np.ndarray]:
        shapes = {f"{k}.{n}": s for n, s in self.shapes.items() for k in ("exp_avg", "exp_avg_sq")}
        return self.gather(dict(self.moments(optimizer)), shapes, lambda key: key.split(".", 1)[1] in self.owned)

    def load(self, p: torch.Tensor, full: np.ndarray) -> torch.Tensor:
        return shard_like(p, torch.from_numpy(np.ascontiguousarray(full, dtype=np.float32)).to(self.device))

    # -- forward-only passes -------------------------------------------------------------------
    @torch.no_grad()
    def forward(self, ids: torch.Tensor) -> torch.Tensor | None:
        """Stage by stage over the pipeline ranks: the logits on the rank holding the last stage, None elsewhere."""
        b, s = ids.shape
        x: torch.Tensor | None = None
        by_index = {st.index: st for st in self.stages}
        pp = self.layout.pp
        for index in range(self.n_stages):
            if index % pp != self.pp_rank:
                continue
            if index > 0:  # the hidden states from the previous stage (sent as float32)
                x = torch.empty(b, s, self.spec.d_model, dtype=torch.float32, device=self.device)
                dist.recv(x, src=self.pp_ranks[(index - 1) % pp], group=self.pp_group)
            x = by_index[index](ids if index == 0 else x)
            if index < self.n_stages - 1:
                dist.send(x.float().contiguous(), dst=self.pp_ranks[(index + 1) % pp], group=self.pp_group)
        return x if self.has_last else None

    def share(self, value: torch.Tensor | None, shape: tuple[int, ...]) -> torch.Tensor:
        """A float32 tensor that one pipeline rank has (None elsewhere) on every pipeline rank."""
        out = (
            torch.zeros(shape, dtype=torch.float32, device=self.device) if value is None else value.float().contiguous()
        )
        return all_reduce_sum(out, self.pp_mesh)

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        b, s = ids.shape
        return self.share(self.forward(ids), (b, s, self.spec.vocab_size))

    def eval_sums(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """[summed NLL, scored tokens, correct top-1] (float64) of a batch, on every pipeline rank."""
        logits = self.forward(ids)
        out = torch.zeros(3, dtype=torch.float64, device=self.device) if logits is None else eval_sums(logits, labels)
        return all_reduce_sum(out, self.pp_mesh)

    def module_outputs(self, ids: torch.Tensor) -> dict[str, np.ndarray]:
        """Outputs of the module boundaries (embed, blocks, final norm) on every rank."""
        names = module_boundaries(self.spec)
        modules = {n: m for stage in self.stages for n, m in stage.named_modules() if n in names}
        if self.tied and not self.has_first:
            modules.pop("embed", None)  # the last stage's copy serves as the head: it is not called
        b, s = ids.shape
        buf = torch.zeros(len(names), b, s, self.spec.d_model, dtype=torch.float32, device=self.device)

        def keep(index: int) -> Callable:
            return lambda _m, _i, out: buf[index].copy_(full_value(out).float())

        handles = [m.register_forward_hook(keep(names.index(n))) for n, m in modules.items()]
        try:
            self.forward(ids)
        finally:
            for h in handles:
                h.remove()
        all_reduce_sum(buf, self.pp_mesh)
        host = buf.cpu().numpy()
        return {n: host[i].copy() for i, n in enumerate(names)}


class PipelineTrainStep:
    """The pipeline's :class:`~mindfoundry.backends.torch.train_step.TrainStep`: the same accumulate/update
    interface and arithmetic (unscale, global-norm clipping, AdamW, drop rules), with the norm over all
    pipeline ranks."""

    step_model = None  # the schedule runs the stages; there is no whole model to call

    def __init__(self, pipeline: Pipeline, optimizer: torch.optim.AdamW, clip_norm: float | None,
                 saved_tensors: Callable[[], ContextManager]):
        self.pipeline, self.optimizer, self.clip_norm = pipeline, optimizer, clip_norm
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.saved_tensors = (
            saved_tensors  # activation offload around the schedule's forwards (memory.offload_activations)
        )

    def accumulate(self, ids: torch.Tensor, labels: torch.Tensor, scalars: StepScalars, _model: object = None,
                   probe: object = None) -> torch.Tensor:
        if probe is not None:
            raise NotImplementedError("debug dumps (probe steps) run in a single process")
        self.optimizer.zero_grad(set_to_none=True)
        with self.saved_tensors():
            return self.pipeline.run_schedule(ids, labels, scalars.loss_scale)

    def update(self, total: torch.Tensor, scalars: StepScalars) -> tuple[float, float, bool, torch.Tensor]:
        for group in self.optimizer.param_groups:
            group["lr"] = scalars.lr
        grads = [p.grad for p in self.params]
        if scalars.grad_unscale != 1.0:
            total = total * scalars.grad_unscale
            torch._foreach_mul_(grads, scalars.grad_unscale)
        grad_sq = self.pipeline.grad_squares()  # before clipping
        norm = float(grad_sq.double().sum().sqrt())
        limit = float("inf") if self.clip_norm is None else self.clip_norm
        if math.isfinite(norm):  # clip_grad_norm_'s rule: scale by min(1, limit / (norm + 1e-6))
            torch._foreach_mul_(grads, min(1.0, limit / (norm + 1e-6)))
        loss = float(total)
        apply = (
            math.isfinite(loss) and math.isfinite(norm) and loss <= scalars.loss_limit and norm <= scalars.grad_limit
        )
        if apply:
            self.optimizer.step()
        return loss, norm, apply, grad_sq
