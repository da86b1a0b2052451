"""Dynamic loss scaling for fp16 mixed precision, framework-free (torch.amp.GradScaler's rule).

float16 flushes gradients below ~6e-8 to zero; multiplying the loss by a large scale S lifts them
into range, and the summed gradients are multiplied by 1/S before they are measured, clipped and
applied. When the scaled gradients overflow (Inf/NaN), the step is dropped and S is halved; after
`growth_interval` clean steps in a row S is doubled. Both engines get S through
:class:`mindfoundry.backends.base.StepScalars` (``loss_scale`` carries S / valid tokens,
``grad_unscale`` = 1/S), so the scaler itself never touches a tensor. Its state is part of the
checkpoint, so a resumed run uses exactly the scales of the uninterrupted one.
"""

from __future__ import annotations

import math
from typing import Any


class DynamicLossScaler:
    """The loss scale and its update rule: back off on overflow, grow after `growth_interval` clean steps.

    Same semantics as ``torch.amp.GradScaler`` (growth tracker reset on every overflow, growth only
    to a finite scale), plus a floor `min_scale` below which the scale is never backed off.
    A disabled scaler (fp32/bf16 training) keeps ``scale == 1.0`` and ignores updates.
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 1000, min_scale: float = 1.0, enabled: bool = True):
        if not (growth_factor > 1.0 and 0.0 < backoff_factor < 1.0):
            raise ValueError(
                f"growth_factor must be > 1 and backoff_factor in (0, 1), got {growth_factor}, {backoff_factor}"
            )
        if growth_interval < 1 or not (0.0 < min_scale <= init_scale < math.inf):
            raise ValueError(f"need growth_interval >= 1 and 0 < min_scale <= init_scale < inf, "
                             f"got {growth_interval}, {min_scale}, {init_scale}")
        self.enabled = enabled
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval, self.min_scale = int(growth_interval), float(min_scale)
        self._scale = float(init_scale) if enabled else 1.0
        self.growth_tracker = 0  # clean steps since the last change of scale
        self.overflows = 0  # overflowing steps so far (monitoring only)

    @property
    def scale(self) -> float:
        return self._scale

    @property
    def at_floor(self) -> bool:
        """True when an overflow can no longer be answered by backing off (the scale is at min_scale)."""
        return self._scale <= self.min_scale

    def update(self, found_nonfinite: bool) -> float:
        """Account for one finished step; returns the scale for the next one."""
        if not self.enabled:
            return self._scale
        if found_nonfinite:
            self.overflows += 1
            self._scale = max(self._scale * self.backoff_factor, self.min_scale)
            self.growth_tracker = 0
            return self._scale
        self.growth_tracker += 1
        if self.growth_tracker >= self.growth_interval:
            grown = self._scale * self.growth_factor
            if math.isfinite(grown):
                self._scale = grown
            self.growth_tracker = 0
        return self._scale

    def state_dict(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "scale": self._scale, "growth_tracker": self.growth_tracker,
                "overflows": self.overflows, "growth_factor": self.growth_factor, "backoff_factor": self.backoff_factor,
                "growth_interval": self.growth_interval, "min_scale": self.min_scale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore scale and counters. The rule's constants stay those of this run's config
        (a resumed run may change `loss_scale_growth_interval`); a disabled scaler ignores the state, and a
        state without a scale or written disabled (an fp32 checkpoint) leaves the configured initial scale."""
        if not self.enabled or "scale" not in state or not state.get("enabled", True):
            return
        self._scale = float(state["scale"])
        self.growth_tracker = int(state.get("growth_tracker", 0))
        self.overflows = int(state.get("overflows", 0))
