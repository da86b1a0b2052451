"""Overflow location: the first tensor of a step, in execution order, that holds NaN or Inf.

Execution order is the dump's `seq`: parameters before the step, then each micro-batch's forward
(innermost modules finish first) and backward, then gradients and moments. The first non-finite
module output is where the numbers went wrong; its input statistics say whether the module was fed
clean values (then the module itself overflowed) or not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mindfoundry.debug.dump import Dump

_FORWARD_KINDS = {"forward_output", "forward_input", "loss"}


def nonfinite(record: dict[str, Any]) -> int:
    return int(record.get("nan", 0)) + int(record.get("inf", 0))


@dataclass(frozen=True)
class Overflow:
    """The first non-finite tensor and, for a module, the statistics of what it was given."""

    record: dict[str, Any]
    given: dict[str, Any] | None  # forward: the module's input; backward: the gradient at its output

    @property
    def module(self) -> str:
        return self.record["module"]

    @property
    def direction(self) -> str:
        kind = self.record["kind"]
        return "forward" if kind in _FORWARD_KINDS else "backward" if kind.startswith("backward") else kind

    def to_dict(self) -> dict[str, Any]:
        return {"module": self.module, "direction": self.direction, "tensor": self.record["name"],
                "record": self.record, "given": self.given, "message": self.message()}

    def message(self) -> str:
        r = self.record
        what = f"{r['name']} ({_counts(r)} of {r['count']})"
        if r["kind"] == "param":
            return f"{what}: the weights were already non-finite before this step (restore an earlier checkpoint)"
        if r["kind"] == "forward_input":
            return (f"{what}: the input of {self.module} is non-finite, produced outside the dumped modules "
                    "(widen debug.dump.modules)")
        if r["kind"] == "loss":
            return (f"{what}: every module output was finite; the loss itself is not "
                    "(labels, loss scale, or an injected fault)")
        if self.given is None:
            return f"{what}: first non-finite tensor of the step"
        side = "input" if self.direction == "forward" else "gradient at its output"
        state = "finite" if nonfinite(self.given) == 0 else f"already non-finite ({_counts(self.given)})"
        return (
            f"{what}: first non-finite tensor of the step; its {side} was {state} "
            f"(min {_g(self.given.get('min'))}, max {_g(self.given.get('max'))}, norm {_g(self.given.get('norm'))})"
        )


def _counts(record: dict[str, Any]) -> str:
    """'2 NaN, 0 Inf'; a record read from msprobe only knows that there are some (its statistics do not count them)."""
    if record.get("nonfinite_counted", True):
        return f"{record['nan']} NaN, {record['inf']} Inf"
    return "NaN" if record["nan"] else "Inf"


def _g(value: Any) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def locate_overflow(dump: Dump) -> Overflow | None:
    """The first non-finite tensor of the dump in execution order, or None when all are finite."""
    by_name = dump.by_name()
    for record in dump.records:
        if not nonfinite(record):
            continue
        name, kind = record["name"], record["kind"]
        given = None
        if kind == "forward_output":
            given = by_name.get(name.replace(".output.0", ".input.0"))
        elif kind == "backward_grad_input":
            given = by_name.get(name.replace(".grad_input.0", ".grad_output.0"))
        return Overflow(record, given)
    return None
