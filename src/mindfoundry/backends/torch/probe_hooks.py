"""Module hooks that feed a :class:`~mindfoundry.debug.probe.Probe` from the torch model.

Forward pre-hooks record each module's first positional input (the hidden states; RoPE tables are
constants), forward hooks its output, full backward hooks the gradients at its output and input.
Hooks fire in execution order, so the dump index is the order the numbers were produced.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Iterator

import torch
from torch import nn

from mindfoundry.debug.probe import ROOT, Probe


def to_numpy(t: torch.Tensor) -> tuple:
    """(array, dtype name); bf16 has no numpy type, so it is upcast and its dtype named."""
    t = t.detach()
    dtype = str(t.dtype).removeprefix("torch.")
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.cpu().numpy(), dtype


def _maybe_numpy(t: torch.Tensor | None) -> tuple:
    return to_numpy(t) if t is not None else (None, None)


def hookable_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Modules that run a forward (containers like ModuleList never do), the root named ROOT."""
    return {(name or ROOT): m for name, m in model.named_modules() if not isinstance(m, (nn.ModuleList, nn.ModuleDict))}


def _first(values) -> torch.Tensor | None:
    return values[0] if values and isinstance(values[0], torch.Tensor) else None


@contextlib.contextmanager
def installed(model: nn.Module, probe: Probe) -> Iterator[None]:
    """Hooks on the probe's modules for the duration of the block (removed even on error)."""
    modules = hookable_modules(model)
    handles = []

    def add(name: str, module: nn.Module) -> None:
        def pre(_m, inputs):
            x = _first(inputs)
            probe.forward_input(name, *_maybe_numpy(x))

        def post(_m, _inputs, output):
            value = probe.injection(name, "forward")
            if value is not None:
                output = torch.full_like(output, value)
            probe.forward_output(name, *to_numpy(output))
            return output

        def backward(_m, grad_input, grad_output):
            gi, go = _first(grad_input), _first(grad_output)
            value = probe.injection(name, "backward")
            if value is not None and gi is not None:
                gi = torch.full_like(gi, value)
                grad_input = (gi,) + tuple(grad_input[1:])
            (go_a, go_dtype), (gi_a, gi_dtype) = _maybe_numpy(go), _maybe_numpy(gi)
            probe.backward(name, go_a, gi_a, go_dtype or gi_dtype)
            return grad_input if value is not None else None

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))
        if probe.hooks_backward(name):
            handles.append(module.register_full_backward_hook(backward))

    for name in probe.modules(modules):
        add(name, modules[name])
    try:
        with warnings.catch_warnings():  # the root and embedding take token ids, which never require grad: expected
            warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed with respect to module outputs")
            yield
    finally:
        for h in handles:
            h.remove()
