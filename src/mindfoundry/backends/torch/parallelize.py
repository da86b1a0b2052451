"""Tensor parallelism and FSDP2 applied to a built :class:`~mindfoundry.backends.torch.model.Transformer`.

As in torchtitan, parallelism is a separate step after the model is built, in a fixed order:
tensor parallel first (on the ``tp`` mesh dim), then FSDP2 ``fully_shard`` per block and on the
root (on the data-parallel dims). Both replace parameters in place under the same names, so
``named_parameters()`` still gives ``layers.0.attn.q_proj.weight`` etc. with the global shapes;
checkpoints and dumps are unaffected.

Tensor parallel plan (Megatron style), per block::

    attn_norm, mlp_norm   SequenceParallel (sequence_parallel) or replicated
    q/k/v, gate/up        ColwiseParallel   (heads / FFN hidden split; each rank runs n_heads/tp
                                             query and n_kv_heads/tp kv heads, so GQA groups stay whole)
    o, down               RowwiseParallel   (all-reduce, or reduce-scatter over the sequence with SP)

The embedding is **vocab-parallel** (RowwiseParallel on ``nn.Embedding``) and the output head
(tied to it, or ``lm_head``) is column-parallel over the vocabulary: the vocab x d_model matrix
is the largest in small and mid-sized models, and with tied weights one sharding (rows = vocab)
serves both uses. The logits are gathered back to the full vocabulary at the end of the forward,
because the shared loss code (``token_nll``) takes full logits; a vocab-parallel loss
(``loss_parallel``) would avoid that gather and is the next step for large vocabularies.

Every parameter ends up a DTensor on one mesh (norm weights replicated over ``tp``), so
``clip_grad_norm_`` and the per-parameter norms work over the whole model unchanged.

Gradients are **summed** over data-parallel ranks: each rank's loss is already scaled by
1/(valid tokens of the global batch), so the sum of the ranks' gradients is the gradient of the
global loss. FSDP2 averages by default; ``set_gradient_divide_factor(1.0)`` turns that into a sum,
and ``set_force_sum_reduction_for_comms(True)`` keeps the collectives plain SUMs (the factor is then
applied as a division by 1.0, exact) instead of NCCL's PREMUL_SUM, which gloo and hccl lack.

With context parallelism (cp > 1) FSDP runs over dp_shard x cp (``dp_shard_cp``), which also sums
the cp ranks' partial gradients (:mod:`.context_parallel`); pipeline parallelism builds its stages
first and applies :func:`apply_fsdp` to each stage (:mod:`.pipeline_parallel`). pp and cp combine with
dp_replicate/dp_shard, not (yet) with tp or with each other (:func:`refuse_unsupported` says so).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from mindfoundry.backends.torch.caption import Captioner
from mindfoundry.backends.torch.distributed import Layout, dp_mesh_for_fsdp, full_value
from mindfoundry.backends.torch.expert_parallel import apply_moe, check_moe_layout, sharded_expert_params
from mindfoundry.backends.torch.model import Transformer
from mindfoundry.backends.torch.vision import MAE


def refuse_unsupported(model: Transformer, layout: Layout) -> None:
    """Refuse the layouts this engine cannot run (combinations not implemented yet, MoE limits), naming the fix.

    Whether a layout divides the model and the sequence is the layout rules' question
    (:mod:`mindfoundry.config.layout_rules`), answered when the config was loaded and at launch."""
    check_moe_layout(model, layout)  # MoE runs with dp and ep only in this version (expert_parallel.py)
    mixed = [
        f"{a}={getattr(layout, a)} with {b}={getattr(layout, b)}"
        for a, b in (("pp", "tp"), ("pp", "cp"), ("cp", "tp"))
        if getattr(layout, a) > 1 and getattr(layout, b) > 1
    ]
    if layout.pp > 1 and model.loss_chunk:
        raise NotImplementedError(
            f"memory.loss_chunk={model.loss_chunk} with parallel.pp={layout.pp}: the pipeline's last "
            "stage computes the loss over the whole logits in this version; set memory.loss_chunk: 0 "
            "(or recompute the blocks: memory.recompute)"
        )
    if mixed:
        raise NotImplementedError(
            f"parallel {'; '.join(mixed)}: the torch engine combines pp and cp with data parallelism "
            "(dp_replicate, dp_shard) only in this version; set one of them to 1"
        )


def parallelize(model: Transformer | MAE, mesh: DeviceMesh, layout: Layout) -> Transformer | MAE:
    """Apply TP then FSDP2 in place, as `layout` asks; returns `model` (same parameter names)."""
    refuse_unsupported(model, layout)
    names = [n for n, _ in model.named_parameters()]
    apply_moe(
        model, mesh, layout
    )  # MoE blocks: routing counts over the token ranks; ep > 1: experts sharded, kept from FSDP
    if layout.tp > 1:
        apply_tp(model, mesh["tp"], layout.sequence_parallel)
    if layout.dp * layout.cp > 1:  # with cp: FSDP over dp_shard x cp sums the cp ranks' partial gradients
        apply_fsdp(model, dp_mesh_for_fsdp(mesh, layout))
    after = [n for n, _ in model.named_parameters()]
    if after != names:
        raise RuntimeError(f"parallelize renamed parameters: {sorted(set(names) ^ set(after))[:5]}")
    return model


class _Replicated(ParallelStyle):
    """Parameters replicated over the mesh; plain (already replicated) inputs seen as Replicate DTensors.

    The TP norms without sequence parallelism: each rank normalises the same full activations,
    and the weight joins the other parameters as a DTensor on the tp mesh.
    """

    def __init__(self, *, use_local_output: bool = True):
        self.use_local_output = use_local_output

    @staticmethod
    def _inputs(_module: nn.Module, inputs: tuple, mesh: DeviceMesh) -> tuple:
        return tuple(DTensor.from_local(x, mesh, [Replicate()], run_check=False)
                     if isinstance(x, torch.Tensor) and not isinstance(x, DTensor) else x for x in inputs)

    def _outputs(self, _module: nn.Module, out: torch.Tensor, _mesh: DeviceMesh) -> torch.Tensor:
        return out.to_local() if self.use_local_output else out

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(module, device_mesh, None, self._inputs, self._outputs)


def _to_replicate(_module: nn.Module, _inputs: tuple, out: DTensor) -> DTensor:
    """Final norm under SP: gather the sequence so the column-parallel head sees whole rows."""
    return out.redistribute(placements=[Replicate()])


def _full_logits(_module: nn.Module, _inputs: tuple, logits: torch.Tensor) -> torch.Tensor:
    """Vocab-sharded logits (DTensor) -> full logits (plain tensor, autograd through the gather)."""
    return full_value(logits)


def apply_tp(model: Transformer, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Megatron-style tensor parallel on `tp_mesh` (see the module docstring for the plan)."""
    tp = tp_mesh.size()
    seq = Shard(1) if sequence_parallel else Replicate()  # layout of the residual stream between blocks

    def norm(use_local_output: bool) -> ParallelStyle:
        if sequence_parallel:
            return SequenceParallel(use_local_output=use_local_output)
        return _Replicated(use_local_output=use_local_output)

    def gather_input(module: nn.Module, n_args: int) -> None:
        """With SP the attention/MLP input (a sequence-sharded DTensor) is gathered to whole sequences."""
        if sequence_parallel:
            extra = (None,) * (n_args - 1)  # cos, sin (and the mlm visibility mask or None) stay as they are
            parallelize_module(module, tp_mesh, PrepareModuleInput(
                input_layouts=(Shard(1), *extra), desired_input_layouts=(Replicate(), *extra), use_local_output=True))

    parallelize_module(model, tp_mesh, {
        "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
        "norm": norm(use_local_output=False),  # a DTensor, so the head matmul runs on DTensors
    })
    if sequence_parallel:
        model.norm.register_forward_hook(_to_replicate)
    if model.lm_head is not None:  # the forward uses lm_head.weight directly: shard the weight by vocab rows
        model.lm_head.weight = nn.Parameter(distribute_tensor(model.lm_head.weight.detach(), tp_mesh, [Shard(0)]))
    model.register_forward_hook(_full_logits)

    for block in model.layers:
        gather_input(block.attn, 4)
        gather_input(block.mlp, 1)
        parallelize_module(block.attn, tp_mesh, {
            "q_proj": ColwiseParallel(), "k_proj": ColwiseParallel(), "v_proj": ColwiseParallel(),
            "o_proj": RowwiseParallel(output_layouts=seq),
        })
        parallelize_module(block.mlp, tp_mesh, {
            "gate_proj": ColwiseParallel(), "up_proj": ColwiseParallel(),
            "down_proj": RowwiseParallel(output_layouts=seq),
        })
        parallelize_module(block, tp_mesh, {"attn_norm": norm(True), "mlp_norm": norm(True)})
        block.attn.n_heads //= tp  # the heads this rank computes
        block.attn.n_kv_heads //= tp


def apply_fsdp(model: nn.Module, dp_mesh: DeviceMesh) -> None:
    """FSDP2 per block, then the root (embedding, final norm, head); gradients summed over dp ranks.

    `model` is a Transformer, a pipeline stage (whose blocks sit in a ModuleDict by global index) or a ViT's MAE.
    """
    if isinstance(model, (MAE, Captioner)):
        blocks = model.blocks()
    else:
        blocks = model.layers.values() if isinstance(model.layers, nn.ModuleDict) else model.layers
    for block in blocks:
        fully_shard(block, mesh=dp_mesh, ignored_params=sharded_expert_params(block))  # EP experts stay sharded
    fully_shard(model, mesh=dp_mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # plain SUM collectives: gloo and hccl have no PREMUL_SUM
