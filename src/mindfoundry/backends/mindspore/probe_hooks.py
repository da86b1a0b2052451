"""Cell hooks that feed a :class:`~mindfoundry.debug.probe.Probe` from the MindSpore model.

The mirror of backends/torch/probe_hooks.py. Cell hooks run their Python side effects only in
PYNATIVE mode (under GRAPH_MODE/jit they are compiled away silently), so the backend runs a debug
step in PYNATIVE with these hooks installed; the compiled step stays hook-free. MindSpore's
backward hook passes (grad_input, grad_output) like torch's full backward hook.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from mindspore import Tensor, nn, ops

from mindfoundry.debug.probe import ROOT, Probe


def to_numpy(t: Tensor) -> tuple:
    """(array, dtype name) as the torch mirror returns it (MindSpore's dtype names are 'Float32')."""
    return t.asnumpy(), str(t.dtype).lower()


def _maybe_numpy(t: Tensor | None) -> tuple:
    return to_numpy(t) if t is not None else (None, None)


def hookable_modules(model: nn.Cell) -> dict[str, nn.Cell]:
    """Cells that run a construct (CellList never does), the root named ROOT."""
    return {(name or ROOT): c for name, c in model.cells_and_names() if not isinstance(c, (nn.CellList, nn.SequentialCell))}


def _first(values) -> Tensor | None:
    return values[0] if values and isinstance(values[0], Tensor) else None


def _filled(like: Tensor, value: float) -> Tensor:
    return ops.full_like(like, value)


@contextlib.contextmanager
def installed(model: nn.Cell, loss_cell: nn.Cell, probe: Probe) -> Iterator[None]:
    """Hooks on the probe's cells (and the loss) for the duration of the block; PYNATIVE only."""
    cells = hookable_modules(model)
    handles = []
    loss_calls = [0]

    def on_loss(_c, _inputs, output):
        probe.loss(loss_calls[0], output.asnumpy())
        loss_calls[0] += 1

    def add(name: str, cell: nn.Cell) -> None:
        def pre(_c, inputs):
            probe.forward_input(name, *_maybe_numpy(_first(inputs)))

        def post(_c, _inputs, output):
            value = probe.injection(name, "forward")
            if value is not None:
                output = _filled(output, value)
            probe.forward_output(name, *to_numpy(output))
            return output

        def backward(_c, grad_input, grad_output):
            gi, go = _first(grad_input), _first(grad_output)
            value = probe.injection(name, "backward")
            if value is not None and gi is not None:
                gi = _filled(gi, value)
                grad_input = (gi,) + tuple(grad_input[1:])
            (go_a, go_dtype), (gi_a, gi_dtype) = _maybe_numpy(go), _maybe_numpy(gi)
            probe.backward(name, go_a, gi_a, go_dtype or gi_dtype)
            return grad_input if value is not None else None

        handles.append(cell.register_forward_pre_hook(pre))
        handles.append(cell.register_forward_hook(post))
        if probe.hooks_backward(name):
            handles.append(cell.register_backward_hook(backward))

    for name in probe.modules(cells):
        add(name, cells[name])
    handles.append(loss_cell.register_forward_hook(on_loss))
    try:
        yield
    finally:
        for h in handles:
            h.remove()
