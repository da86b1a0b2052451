"""Module hooks that feed a :class:`~mindfoundry.debug.probe.Probe` from the torch model.

Forward pre-hooks record each module's first positional input (the hidden states; RoPE tables are
constants), forward hooks its output, full backward hooks the gradients at its output and input
(hook bodies shared with MindSpore: :mod:`mindfoundry.debug.hooks`). Hooks fire in execution
order, so the dump index is the order the numbers were produced.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Iterator

import torch
from torch import nn

from mindfoundry.debug.hooks import TensorOps, make_hooks
from mindfoundry.debug.probe import ROOT, Probe


def to_numpy(t: torch.Tensor) -> tuple:
    """(array, dtype name); bf16 has no numpy type, so it is upcast and its dtype named."""
    t = t.detach()
    dtype = str(t.dtype).removeprefix("torch.")
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.cpu().numpy(), dtype


OPS = TensorOps(is_tensor=lambda v: isinstance(v, torch.Tensor), to_numpy=to_numpy, filled=torch.full_like)


def hookable_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Modules that run a forward (containers like ModuleList never do), the root named ROOT."""
    return {(name or ROOT): m for name, m in model.named_modules() if not isinstance(m, (nn.ModuleList, nn.ModuleDict))}


@contextlib.contextmanager
def installed(model: nn.Module, probe: Probe) -> Iterator[None]:
    """Hooks on the probe's modules for the duration of the block (removed even on error)."""
    modules = hookable_modules(model)
    handles = []
    for name in probe.modules(modules):
        pre, post, backward = make_hooks(probe, name, OPS)
        handles.append(modules[name].register_forward_pre_hook(pre))
        handles.append(modules[name].register_forward_hook(post))
        if probe.hooks_backward(name):
            handles.append(modules[name].register_full_backward_hook(backward))
    try:
        with warnings.catch_warnings():  # the root and embedding take token ids, which never require grad: expected
            warnings.filterwarnings(
                "ignore",
                message="Full backward hook is firing when gradients are computed with respect to module outputs",
            )
            yield
    finally:
        for h in handles:
            h.remove()
