"""The `memory` section applied to the MindSpore engine, before the train step is compiled.

- full: ``Cell.recompute()`` on each chosen block (everything inside recomputed, the block's output kept);
- selective: primitive-level ``recompute()`` on the SwiGLU's SiLU, so its output is recomputed from the kept
  projection outputs, as Megatron's selective recompute does; the other half of Megatron's selective
  recompute, the attention core's (B, H, S, S) scores and probabilities, needs no mark: the core's own
  backward always recomputes them (:mod:`.attention`);
- loss_chunk: the loss cell's :class:`~.model.ChunkNLL` recomputed, so one chunk's logits exist at a time.

What this saves depends on the device: MindSpore's recompute pass acts in GRAPH_MODE on Ascend; on
CPU the compiled graph keeps its memory pool either way (measured in bench/memory.py, docs/memory.md).
Activation offload (``Cell.offload``) needs lazy-inline blocks on Ascend and is refused by the config
checks. Cell.recompute can be set once per Cell: call this once per model.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from mindspore import nn

from mindfoundry.backends.mindspore.model import LossCell, Transformer
from mindfoundry.backends.mindspore.moe import MoE
from mindfoundry.backends.mindspore.vision import MAE
from mindfoundry.config.memory_config import MemoryConfig


def apply_memory(model: Transformer | MAE, loss_cell: nn.Cell, memory: MemoryConfig) -> None:
    """Mark the chosen blocks (or their SiLU) and the loss chunks for recompute (in place). A ViT's blocks (encoder,
    then decoder) recompute whole (config checks refuse the rest for the image objectives)."""
    if isinstance(model, MAE):
        blocks = model.blocks()
        for i in memory.recomputed_layers(len(blocks)):
            blocks[i].recompute()
        return
    for i in memory.recomputed_layers(len(model.layers)):
        block = model.layers[i]
        if memory.recompute == "full":
            block.recompute()
            continue
        (block.mlp.experts if isinstance(block.mlp, MoE) else block.mlp).silu.recompute()
    if isinstance(loss_cell, LossCell) and loss_cell.bounds:
        loss_cell.chunk_nll.recompute()


@contextlib.contextmanager
def suspended(model: Transformer) -> Iterator[None]:
    """Full recompute off for a PYNATIVE debug step. In PYNATIVE, Cell.recompute runs the block through a wrapper
    child Cell (``_recompute_cell``), which module hooks would see as extra cells and whose recomputation would
    fire the block's hooks twice; the graph's recompute marks are untouched (the step's numbers are the same)."""
    wrapped = [cell for _, cell in model.cells_and_names() if "_recompute_cell" in getattr(cell, "_cells", {})]
    saved = [(cell, cell._cells.pop("_recompute_cell")) for cell in wrapped]
    for cell, _ in saved:
        object.__setattr__(cell, "_recompute_cell", None)
    try:
        yield
    finally:
        for cell, wrapper in saved:
            object.__delattr__(cell, "_recompute_cell")
            nn.Cell.__setattr__(cell, "_recompute_cell", wrapper)
