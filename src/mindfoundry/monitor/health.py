"""Health rules: the handful of curve shapes that experienced people look for in a training run.

Each rule watches the step records as they stream in and fires at most ONCE per run, with a message
that names the likely cause, so a long run yields a short list of findings instead of a log flood.
The same monitor reads a finished run's metrics.jsonl offline (:func:`evaluate`), so the report shows
exactly what the live run would have recorded.

Defaults come from practice and from the demo's real curves: grad norm settling well below 0.5
after warmup usually means the LR is too small for the model; persistently above 5 means updates
are dominated by clipping; a loss that swings more than 0.2 nats around its trend is oscillating;
a jump of 1 nat over the running mean is a spike; tokens/s 30% below its running median is a stall.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np

from mindfoundry.config.schema import HealthConfig
from mindfoundry.monitor.records import is_step_record, step_records

RULES = ("nonfinite", "loss_spike", "loss_oscillation", "grad_norm_low", "grad_norm_high", "throughput_drop")


@dataclass(frozen=True)
class HealthEvent:
    """One finding: which rule, at which step, the measured value and a message with the likely cause."""

    step: int
    rule: str
    message: str
    value: float

    def to_dict(self) -> dict[str, Any]:
        """The metrics.jsonl record: an event like "anomaly", so readers find both the same way."""
        value = self.value if math.isfinite(self.value) else None
        return {"step": self.step, "event": "health", "rule": self.rule, "message": self.message, "value": value}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _show(value: Any) -> str:
    """A value for a message; metrics.jsonl stores NaN/Inf as null."""
    return f"{value:.4g}" if isinstance(value, (int, float)) else "NaN/Inf"


def _trend_swing(losses: list[float], smooth: int) -> float:
    """Std of the loss around a quadratic fit (the slow decay), after a `smooth`-step moving average."""
    y = np.asarray(losses, dtype=np.float64)
    x = np.arange(len(y), dtype=np.float64)
    residual = y - np.polyval(np.polyfit(x, y, 2), x)
    return float(np.convolve(residual, np.ones(smooth) / smooth, mode="valid").std())


class HealthMonitor:
    """Streaming rules over step records. `observe` returns the findings a record triggers (each
    rule once per run); `state_dict` goes into the checkpoint so a resumed run neither forgets its
    windows nor repeats a finding."""

    def __init__(self, cfg: HealthConfig, warmup_steps: int = 0):
        self.cfg = cfg
        self.warmup_steps = warmup_steps
        self.fired: set[str] = set()
        self.losses: deque[float] = deque(maxlen=cfg.spike_window)
        self.settled_losses: deque[float] = deque(maxlen=cfg.oscillation_window)  # after warmup
        self.grad_norms: deque[float] = deque(maxlen=cfg.grad_window)  # after warmup
        self.speeds: deque[float] = deque(maxlen=cfg.throughput_window + cfg.throughput_recent)
        self.data_shares: deque[float] = deque(maxlen=cfg.throughput_recent)

    def observe(self, record: Mapping[str, Any]) -> list[HealthEvent]:
        """Feed one metrics record; only step records count (other kinds return no findings)."""
        if not self.cfg.enabled or not is_step_record(record):
            return []
        step = int(record["step"])
        loss, grad = record.get("loss"), record.get("grad_norm")
        if not (_finite(loss) and _finite(grad)):
            return self._fire([self._nonfinite(step, f"loss={_show(loss)} grad_norm={_show(grad)}")])
        found = [self._spike(step, loss)]
        self.losses.append(loss)
        if step > self.warmup_steps:
            self.settled_losses.append(loss)
            self.grad_norms.append(grad)
            found += [self._oscillation(step), *self._grad_norm(step)]
        found.append(self._throughput(step, record))
        return self._fire(found)

    def _fire(self, found: Iterable[HealthEvent | None]) -> list[HealthEvent]:
        new = [e for e in found if e is not None and e.rule not in self.fired]
        self.fired.update(e.rule for e in new)
        return new

    def _armed(self, rule: str, threshold: Any) -> bool:
        return threshold is not None and rule not in self.fired

    # -- rules ---------------------------------------------------------------------------------
    def _nonfinite(self, step: int, detail: str) -> HealthEvent | None:
        if not self.cfg.nonfinite:
            return None
        return HealthEvent(
            step,
            "nonfinite",
            f"non-finite loss or grad norm at step {step} ({detail}): the update was dropped; "
            "likely LR too high, a bad data window or an overflow in reduced precision",
            math.nan,
        )

    def _spike(self, step: int, loss: float) -> HealthEvent | None:
        cfg = self.cfg
        if not self._armed("loss_spike", cfg.loss_spike) or len(self.losses) < cfg.spike_window:
            return None
        mean, std = statistics.fmean(self.losses), statistics.pstdev(self.losses)
        limit = max(cfg.loss_spike, cfg.spike_sigmas * std)
        jump = loss - mean
        if jump <= limit:
            return None
        return HealthEvent(
            step,
            "loss_spike",
            f"loss spike at step {step}: {loss:.3f} is {jump:.2f} nats above the running mean "
            f"{mean:.3f} of the last {cfg.spike_window} steps (limit {limit:.2f}): a bad data window, or LR too high?",
            jump,
        )

    def _oscillation(self, step: int) -> HealthEvent | None:
        cfg = self.cfg
        if (
            not self._armed("loss_oscillation", cfg.loss_oscillation)
            or len(self.settled_losses) < cfg.oscillation_window
        ):
            return None
        swing = _trend_swing(list(self.settled_losses), cfg.oscillation_smooth)
        if swing <= cfg.loss_oscillation:
            return None
        return HealthEvent(
            step,
            "loss_oscillation",
            f"loss oscillates: std {swing:.3f} nats around its trend over steps "
            f"{step - cfg.oscillation_window + 1}-{step} (limit {cfg.loss_oscillation}): LR too high or batch too "
            "small? (lower optim.lr, or raise train.grad_accum)",
            swing,
        )

    def _grad_norm(self, step: int) -> list[HealthEvent | None]:
        cfg = self.cfg
        if len(self.grad_norms) < cfg.grad_window:
            return []
        median = statistics.median(self.grad_norms)
        span = f"over steps {step - cfg.grad_window + 1}-{step}"
        found: list[HealthEvent | None] = []
        if self._armed("grad_norm_low", cfg.grad_norm_low) and median < cfg.grad_norm_low:
            found.append(
                HealthEvent(
                    step,
                    "grad_norm_low",
                    f"grad norm median {median:.3f} {span} is below {cfg.grad_norm_low}: "
                    "LR too low? (raise optim.lr; check weight decay and clipping are not shrinking updates)",
                    median,
                )
            )
        if self._armed("grad_norm_high", cfg.grad_norm_high) and median > cfg.grad_norm_high:
            found.append(
                HealthEvent(
                    step,
                    "grad_norm_high",
                    f"grad norm median {median:.3f} {span} is above {cfg.grad_norm_high}: "
                    "clip harder / lower LR? (optim.clip_norm, optim.lr)",
                    median,
                )
            )
        return found

    def _throughput(self, step: int, record: Mapping[str, Any]) -> HealthEvent | None:
        cfg = self.cfg
        speed, step_time, data_time = record.get("tokens_per_s"), record.get("step_time_s"), record.get("data_time_s")
        if not _finite(speed):
            return None
        self.speeds.append(speed)
        if _finite(step_time) and _finite(data_time) and step_time > 0:
            self.data_shares.append(data_time / step_time)
        if not self._armed("throughput_drop", cfg.throughput_drop) or len(self.speeds) < self.speeds.maxlen:
            return None
        history = list(self.speeds)
        reference = statistics.median(history[: cfg.throughput_window])
        recent = statistics.median(history[cfg.throughput_window:])
        drop = 1.0 - recent / reference if reference > 0 else 0.0
        if drop <= cfg.throughput_drop:
            return None
        return HealthEvent(
            step,
            "throughput_drop",
            f"throughput fell {drop:.0%} at step {step}: {recent:,.0f} tokens/s over the last "
            f"{cfg.throughput_recent} steps vs a running median of {reference:,.0f} (limit {cfg.throughput_drop:.0%}): "
            f"data stall? {self._data_hint()}",
            drop,
        )

    def _data_hint(self) -> str:
        if not self.data_shares:
            return ""
        share = statistics.median(self.data_shares)
        if share >= 0.2:
            return f"(data loading took {share:.0%} of those steps: the input pipeline is the bottleneck)"
        return (f"(data loading took only {share:.1%} of those steps: more likely another process competing for the "
                "device or CPU)")

    # -- checkpointing -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"fired": sorted(self.fired), "losses": list(self.losses), "settled_losses": list(self.settled_losses),
                "grad_norms": list(self.grad_norms), "speeds": list(self.speeds), "data_shares": list(self.data_shares)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.fired = set(state.get("fired", []))
        for name in ("losses", "settled_losses", "grad_norms", "speeds", "data_shares"):
            window: deque = getattr(self, name)
            setattr(self, name, deque(state.get(name, []), maxlen=window.maxlen))


def evaluate(
    records: Iterable[Mapping[str, Any]], cfg: HealthConfig | None = None, warmup_steps: int = 0
) -> list[HealthEvent]:
    """The findings of a finished (or running) run from its metrics records (the last record per
    step, in step order), as the live monitor would have recorded them."""
    monitor = HealthMonitor(cfg or HealthConfig(), warmup_steps)
    return [event for record in step_records(records) for event in monitor.observe(record)]
