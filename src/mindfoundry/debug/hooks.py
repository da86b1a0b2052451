"""Module-hook bodies shared by both engines: what a hook does with the tensors it is handed.

Forward pre-hooks, forward hooks and backward hooks have the same shape in PyTorch and MindSpore
(``pre(module, inputs)``, ``post(module, inputs, output)``, ``backward(module, grad_input,
grad_output)``), so each engine only supplies how to reach numpy and how to make a filled tensor;
the naming, injection and recording logic lives here once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from mindfoundry.debug.probe import Probe


@dataclass(frozen=True)
class TensorOps:
    """The three engine operations a hook needs."""

    is_tensor: Callable[[Any], bool]
    to_numpy: Callable[[Any], tuple]  # tensor -> (array, dtype name)
    filled: Callable[[Any, float], Any]  # tensor, value -> tensor of that shape/dtype filled with value


def make_hooks(probe: Probe, name: str, ops: TensorOps) -> tuple[Callable, Callable, Callable]:
    """(pre, post, backward) hook functions that feed `probe` for module `name`."""

    def first(values) -> Any:
        return values[0] if values and ops.is_tensor(values[0]) else None

    def as_numpy(t) -> tuple:
        return ops.to_numpy(t) if t is not None else (None, None)

    def pre(_module, inputs):
        probe.forward_input(name, *as_numpy(first(inputs)))

    def post(_module, _inputs, output):
        # a module returning several tensors (an image model's root: its summed loss and count) is recorded, and
        # injected into, by its first
        several = isinstance(output, tuple)
        head = output[0] if several else output
        value = probe.injection(name, "forward")
        if value is not None:
            head = ops.filled(head, value)
            output = (head, *output[1:]) if several else head
        probe.forward_output(name, *ops.to_numpy(head))
        return output

    def backward(_module, grad_input, grad_output):
        gi, go = first(grad_input), first(grad_output)
        value = probe.injection(name, "backward")
        if value is not None and gi is not None:
            gi = ops.filled(gi, value)
            grad_input = (gi,) + tuple(grad_input[1:])
        (go_a, go_dtype), (gi_a, gi_dtype) = as_numpy(go), as_numpy(gi)
        probe.backward(name, go_a, gi_a, go_dtype or gi_dtype)
        return grad_input if value is not None else None

    return pre, post, backward
