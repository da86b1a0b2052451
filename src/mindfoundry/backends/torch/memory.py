"""The `memory` section applied to the torch engine: recompute flags, the chunked loss, activation offload.

Like torchtitan's activation checkpointing this is a step of its own after the model is built
(``apply_memory``, before tensor parallelism and FSDP wrap the blocks); unlike a checkpoint
wrapper it sets flags the modules read (:mod:`.model`), so parameter and module names, and with
them checkpoints and dumps, stay those of the plain model. Recompute runs inside each block's
forward, so FSDP2 gathers the block's weights for the recomputation as it does for the backward,
and tensor-parallel collectives are simply repeated.
"""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, Iterator

import torch

from mindfoundry.backends.base import BackendUnavailable
from mindfoundry.backends.torch.model import MoE, Transformer
from mindfoundry.backends.torch.vision import MAE
from mindfoundry.config.memory_config import MemoryConfig


def apply_memory(model: Transformer | MAE, memory: MemoryConfig) -> None:
    """Set the recompute flags of the chosen blocks and the loss chunk (in place; names unchanged). A ViT's blocks
    (encoder, then decoder) recompute whole (config checks refuse the rest for the image objectives)."""
    if isinstance(model, MAE):
        blocks = model.blocks()
        for i in memory.recomputed_layers(len(blocks)):
            blocks[i].recompute_all = True
        return
    for i in memory.recomputed_layers(len(model.layers)):
        block = model.layers[i]
        if memory.recompute == "full":
            block.recompute_all = True
        else:
            block.attn.recompute_core = True
            (block.mlp.experts if isinstance(block.mlp, MoE) else block.mlp).recompute_act = True
    model.loss_chunk = memory.loss_chunk


_FLAGS = ("recompute_all", "recompute_core", "recompute_act")


@contextlib.contextmanager
def suspended(model: torch.nn.Module) -> Iterator[None]:
    """Recompute off for a debug step: module hooks fire once per module call, and a recomputed forward would
    call them again in the backward (the step's numbers are the same either way)."""
    saved = [(m, f, getattr(m, f)) for m in model.modules() for f in _FLAGS if getattr(m, f, False)]
    for m, f, _ in saved:
        setattr(m, f, False)
    try:
        yield
    finally:
        for m, f, value in saved:
            setattr(m, f, value)


def saved_tensors(memory: MemoryConfig, device: torch.device) -> Callable[[], ContextManager]:
    """The context the training forward runs in: with offload_activations, every tensor autograd saves moves
    to (pinned) host memory and back for the backward (torch's save_on_cpu); else nothing."""
    if not memory.offload_activations:
        return contextlib.nullcontext
    if device.type == "cpu":
        raise BackendUnavailable(
            "memory.offload_activations needs an accelerator: on device cpu the activations already are "
            "in host memory; use memory.recompute: full (or selective) to save memory on CPU"
        )
    return lambda: torch.autograd.graph.save_on_cpu(pin_memory=True)
