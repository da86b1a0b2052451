"""What a debug step captures, independent of the engine.

An engine's hook installer asks :meth:`Probe.modules` which modules to hook, then hands every
captured tensor over as a numpy array; the probe names it, counts calls (micro-batches) and streams
it to a :class:`DumpWriter`. A probe may also inject a non-finite value into one module's output
(forward) or input gradient (backward), the drill that proves the overflow locator.
"""

from __future__ import annotations

import fnmatch
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol

import numpy as np

from mindfoundry.errors import MindFoundryError

DIRECTIONS = ("forward", "backward", "params", "grads", "optimizer")
ROOT = "model"  # the whole model's module name (its output is the logits)


class TensorSink(Protocol):
    """Where a probe streams tensors: a dump writer of either format (debug/dump.py, debug/msprobe.py)."""

    def record(
        self, name: str, module: str, kind: str, array: np.ndarray, dtype: str | None = None
    ) -> dict[str, Any]: ...

    def close(self, **extra: Any) -> Any: ...


class ProbeError(MindFoundryError, ValueError):
    """A dump selection or fault injection that does not fit the model."""


@dataclass(frozen=True)
class Injection:
    """Replace `module`'s output (forward) or its input gradient (backward) by `value` on its first call."""

    module: str
    direction: str = "forward"
    value: float = math.inf


def select_modules(patterns: Iterable[str], names: list[str]) -> list[str]:
    """The names matching any pattern; none matching is an error (a typo would silently dump nothing)."""
    patterns = list(patterns)
    chosen = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    if not chosen:
        raise ProbeError(f"dump modules {patterns} match no module; names look like {names[:4]} "
                         f"(patterns use * and ?, e.g. 'layers.1.*')")
    return chosen


def check_injection(module: str, names: list[str]) -> None:
    if module not in names:
        raise ProbeError(f"inject module '{module}' is not a module of this model; choose one of e.g. {names[:6]}")


class Probe:
    """Selection (module patterns, directions), call counting and naming for one step's dump."""

    def __init__(self, writer: TensorSink | None, modules: Iterable[str] = ("*",),
                 directions: Iterable[str] = ("forward", "backward"), inject: Injection | None = None,
                 grad_unscale: float = 1.0):
        self.writer = writer
        # fp16 loss scaling multiplies the loss, and so every gradient, by S; dumps record true values
        # (times 1/S), so an fp16 dump compares with an fp32 one
        self.grad_unscale = grad_unscale
        self.patterns = tuple(modules)
        self.directions = frozenset(directions)
        unknown = self.directions - set(DIRECTIONS)
        if unknown:
            raise ProbeError(f"dump directions {sorted(unknown)} unknown: choose from {', '.join(DIRECTIONS)}")
        self.inject = inject
        self._calls: dict[tuple[str, str], int] = defaultdict(int)
        self._injected: set[str] = set()

    def wants(self, direction: str) -> bool:
        return self.writer is not None and direction in self.directions

    def modules(self, available: Iterable[str]) -> list[str]:
        """Modules to hook: those matching a pattern (when dumping) plus the injection target."""
        names = list(available)
        dumping = self.writer is not None and bool({"forward", "backward"} & self.directions)
        chosen = select_modules(self.patterns, names) if dumping else []
        if self.inject:
            check_injection(self.inject.module, names)
            if self.inject.module not in chosen:
                chosen.append(self.inject.module)
        return chosen

    def _record(self, name: str, module: str, kind: str, array: np.ndarray, dtype: str | None) -> None:
        if self.writer is not None:
            self.writer.record(name, module, kind, array, dtype)

    # -- module hooks ------------------------------------------------------------------------
    def forward_input(self, module: str, array: np.ndarray | None, dtype: str | None = None) -> None:
        """Pre-forward: counts the call; records the first positional input."""
        call = self._calls[(module, "forward")]
        self._calls[(module, "forward")] += 1
        if array is not None and self.wants("forward") and self._selected(module):
            self._record(f"{module}.forward.{call}.input.0", module, "forward_input", array, dtype)

    def forward_output(self, module: str, array: np.ndarray, dtype: str | None = None) -> None:
        if self.wants("forward") and self._selected(module):
            call = self._calls[(module, "forward")] - 1
            self._record(f"{module}.forward.{call}.output.0", module, "forward_output", array, dtype)

    def backward(
        self, module: str, grad_output: np.ndarray | None, grad_input: np.ndarray | None, dtype: str | None = None
    ) -> None:
        call = self._calls[(module, "backward")]
        self._calls[(module, "backward")] += 1
        if not (self.wants("backward") and self._selected(module)):
            return
        if grad_output is not None:
            self._record(
                f"{module}.backward.{call}.grad_output.0",
                module,
                "backward_grad_output",
                self._unscaled(grad_output),
                dtype,
            )
        if grad_input is not None:
            self._record(
                f"{module}.backward.{call}.grad_input.0",
                module,
                "backward_grad_input",
                self._unscaled(grad_input),
                dtype,
            )

    def _unscaled(self, array: np.ndarray) -> np.ndarray:
        """Gradients (and the loss) as they would be without the fp16 loss scale (widened: fp16 * 1/S may underflow)."""
        if self.grad_unscale == 1.0:
            return array
        return np.asarray(array, dtype=np.float32) * np.float32(self.grad_unscale)

    def injection(self, module: str, direction: str) -> float | None:
        """The value to write into this module's output/gradient now, once per step."""
        inj = self.inject
        if inj is None or inj.module != module or inj.direction != direction or module in self._injected:
            return None
        self._injected.add(module)
        return inj.value

    def hooks_backward(self, module: str) -> bool:
        """Whether `module` needs a backward hook (backward hooks cost time even when they record nothing)."""
        inj = self.inject
        return self.wants("backward") or (inj is not None and inj.module == module and inj.direction == "backward")

    def _selected(self, module: str) -> bool:
        return any(fnmatch.fnmatchcase(module, p) for p in self.patterns)

    # -- step-level tensors ------------------------------------------------------------------
    def loss(self, call: int, value: np.ndarray) -> None:
        if self.wants("forward"):
            self._record(
                f"loss.forward.{call}.output.0", "loss", "loss", self._unscaled(np.asarray(value, np.float32)), None
            )

    def tensor(self, direction: str, name: str, array: np.ndarray, dtype: str | None = None) -> None:
        """Parameters ('params': param.NAME), gradients ('grads': grad.NAME), moments ('optimizer': exp_avg*.NAME)."""
        if not self.wants(direction):
            return
        param = name.split(".", 1)[1] if direction == "optimizer" else name
        if self._selected_param(param):
            kind = {"params": "param", "grads": "grad"}.get(direction) or name.split(".", 1)[0]
            prefix = {"params": "param.", "grads": "grad."}.get(direction, "")
            self._record(
                prefix + name,
                param.rsplit(".", 1)[0],
                kind,
                self._unscaled(array) if direction == "grads" else array,
                dtype,
            )

    def state(
        self, direction: str, named: Iterable[tuple[str, Any]], convert: Callable[[Any], tuple[np.ndarray, str | None]]
    ) -> None:
        """Stream engine tensors one at a time (converted only when this direction is dumped)."""
        if self.wants(direction):
            for name, value in named:
                self.tensor(direction, name, *convert(value))

    def _selected_param(self, param: str) -> bool:
        """A parameter is selected when its owning module (or the parameter name itself) matches."""
        owner = param.rsplit(".", 1)[0]
        return self._selected(owner) or self._selected(param)
