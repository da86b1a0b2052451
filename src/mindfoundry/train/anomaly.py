"""Anomaly policy: running statistics of loss and grad norm, spike limits, and the verdict per step.

The limits are computed on the host before a step and enforced inside the compiled step, so a
spiking or non-finite update is dropped before it touches the weights. The monitor's state is
part of the checkpoint, so a resumed run applies exactly the same limits.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from mindfoundry.config.schema import AnomalyConfig


class AnomalyStop(RuntimeError):
    """Too many anomalous steps in a row: stop with a diagnosis instead of looping."""


@dataclass(frozen=True)
class Verdict:
    kind: str  # "ok" | "nonfinite" | "spike"
    reason: str = ""

    @property
    def anomalous(self) -> bool:
        return self.kind != "ok"


class AnomalyMonitor:
    def __init__(self, cfg: AnomalyConfig):
        self.cfg = cfg
        self.losses: deque[float] = deque(maxlen=cfg.window)
        self.norms: deque[float] = deque(maxlen=cfg.window)
        self.consecutive = 0
        self.counts = {"nonfinite": 0, "spike": 0}

    def _ready(self) -> bool:
        return len(self.losses) == self.cfg.window

    def _loss_limit(self) -> float:
        return sum(self.losses) / len(self.losses) + self.cfg.loss_spike

    def _grad_limit(self) -> float:
        return self.cfg.grad_spike * sum(self.norms) / len(self.norms)

    def limits(self) -> tuple[float, float]:
        """(loss_limit, grad_limit) for the next step: infinite under `warn` or while the window fills."""
        if self.cfg.policy == "warn" or not self._ready():
            return math.inf, math.inf
        return self._loss_limit(), self._grad_limit()

    def observe(self, loss: float, grad_norm: float, applied: bool) -> Verdict:
        """Classify a finished step and update the statistics with healthy steps only."""
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            verdict = Verdict("nonfinite", f"loss={loss} grad_norm={grad_norm}")
        elif self._ready() and (loss > self._loss_limit() or grad_norm > self._grad_limit()):
            verdict = Verdict("spike", f"loss={loss:.4f} (limit {self._loss_limit():.4f}), "
                                       f"grad_norm={grad_norm:.4f} (limit {self._grad_limit():.4f})")
        else:
            verdict = Verdict("ok")
        if verdict.anomalous:
            self.counts[verdict.kind] += 1
            self.consecutive += 1
        else:
            self.consecutive = 0
        if applied and not verdict.anomalous:
            self.losses.append(loss)
            self.norms.append(grad_norm)
        return verdict

    def check_consecutive(self, step: int, verdict: Verdict, lr: float) -> None:
        if self.consecutive >= self.cfg.max_consecutive:
            raise AnomalyStop(
                f"stopped at step {step} after {self.consecutive} anomalous steps in a row (last: {verdict.kind}, "
                f"{verdict.reason}). Likely causes: learning rate too high (lr at this step {lr:.3g}: lower optim.lr "
                "or lengthen optim.warmup_steps), a bad data window (inspect the samples around this position with "
                "`mindfoundry data inspect`), or numerical overflow (use fp32). Resume from the last checkpoint with "
                "--resume auto after the fix."
            )

    def state_dict(self) -> dict[str, Any]:
        return {
            "losses": list(self.losses),
            "norms": list(self.norms),
            "consecutive": self.consecutive,
            "counts": dict(self.counts),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.losses = deque(state.get("losses", []), maxlen=self.cfg.window)
        self.norms = deque(state.get("norms", []), maxlen=self.cfg.window)
        self.consecutive = int(state.get("consecutive", 0))
        self.counts = dict(state.get("counts", self.counts))
