"""Cell hooks that feed a :class:`~mindfoundry.debug.probe.Probe` from the MindSpore model.

The mirror of backends/torch/probe_hooks.py (hook bodies shared: :mod:`mindfoundry.debug.hooks`).
Cell hooks run their Python side effects only in PYNATIVE mode (under GRAPH_MODE/jit they are
compiled away silently), so the backend runs a debug step in PYNATIVE with these hooks installed;
the compiled step stays hook-free. MindSpore's backward hook passes (grad_input, grad_output) like
torch's full backward hook.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from mindspore import Tensor, nn, ops

from mindfoundry.debug.hooks import TensorOps, make_hooks
from mindfoundry.debug.probe import ROOT, Probe


def to_numpy(t: Tensor) -> tuple:
    """(array, dtype name) as the torch mirror returns it (MindSpore's dtype names are 'Float32')."""
    return t.asnumpy(), str(t.dtype).lower()


OPS = TensorOps(is_tensor=lambda v: isinstance(v, Tensor), to_numpy=to_numpy, filled=ops.full_like)


def hookable_modules(model: nn.Cell) -> dict[str, nn.Cell]:
    """Cells that run a construct (CellList never does), the root named ROOT."""
    return {
        (name or ROOT): c for name, c in model.cells_and_names() if not isinstance(c, (nn.CellList, nn.SequentialCell))
    }


@contextlib.contextmanager
def installed(model: nn.Cell, loss_cell: nn.Cell, probe: Probe) -> Iterator[None]:
    """Hooks on the probe's cells (and the loss) for the duration of the block; PYNATIVE only."""
    cells = hookable_modules(model)
    handles = []
    loss_calls = [0]

    def on_loss(_c, _inputs, output):
        probe.loss(loss_calls[0], output.asnumpy())
        loss_calls[0] += 1

    for name in probe.modules(cells):
        pre, post, backward = make_hooks(probe, name, OPS)
        handles.append(cells[name].register_forward_pre_hook(pre))
        handles.append(cells[name].register_forward_hook(post))
        if probe.hooks_backward(name):
            handles.append(cells[name].register_backward_hook(backward))
    handles.append(loss_cell.register_forward_hook(on_loss))
    try:
        yield
    finally:
        for h in handles:
            h.remove()
