"""Health rules on synthetic curves: each fires on its pathology, once, and none fires on a healthy run."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from mindfoundry.monitor.health import RULES, HealthConfig, HealthEvent, HealthMonitor, evaluate

STEPS = 400
WARMUP = 20


def healthy(steps: int = STEPS, seed: int = 0) -> dict[str, np.ndarray]:
    """A curve shaped like the demo's: loss decaying from ~9 towards ~3 with per-batch noise, grad
    norms ~0.6-2 decaying, steady throughput with a little jitter."""
    rng = np.random.default_rng(seed)
    t = np.arange(1, steps + 1)
    return {
        "loss": 3.0 + 6.0 * np.exp(-t / 80.0) + rng.normal(0, 0.05, steps),
        "grad_norm": 0.6 + 1.5 * np.exp(-t / 60.0) + np.abs(rng.normal(0, 0.05, steps)),
        "tokens_per_s": 5000.0 * (1 + rng.normal(0, 0.03, steps)),
        "data_time_s": np.full(steps, 0.001),
        "step_time_s": np.full(steps, 0.4),
    }


def records(curves: dict[str, np.ndarray]) -> list[dict]:
    n = len(curves["loss"])
    return [
        {
            "step": i + 1,
            "applied": True,
            **{k: (None if not math.isfinite(v[i]) else float(v[i])) for k, v in curves.items()},
        }
        for i in range(n)
    ]


def fired(curves: dict[str, np.ndarray], cfg: HealthConfig | None = None) -> list[HealthEvent]:
    return evaluate(records(curves), cfg, warmup_steps=WARMUP)


def test_healthy_run_fires_nothing():
    for seed in range(5):
        assert fired(healthy(seed=seed)) == []


def test_real_demo_noise_is_not_oscillation():
    """The demo's per-batch loss noise (std ~0.3 nats with 2k-token batches mixing four categories)
    is noise, not oscillation: the smoothing keeps it under the 0.2 limit."""
    curves = healthy()
    curves["loss"] = curves["loss"] + np.random.default_rng(1).normal(0, 0.3, STEPS)
    assert [e.rule for e in fired(curves)] == []


def test_nonfinite_fires_once_at_first_nan():
    curves = healthy()
    curves["loss"][99] = math.nan
    curves["grad_norm"][149] = math.inf
    events = fired(curves)
    assert [(e.rule, e.step) for e in events] == [("nonfinite", 100)]
    assert "loss=NaN/Inf" in events[0].message


def test_loss_spike_fires_once():
    curves = healthy()
    curves["loss"][199] += 2.0
    curves["loss"][299] += 3.0
    events = fired(curves)
    assert [(e.rule, e.step) for e in events] == [("loss_spike", 200)]
    assert events[0].value == pytest.approx(2.0, abs=0.2)
    assert "nats above the running mean" in events[0].message


def test_loss_oscillation_fires_once():
    curves = healthy()
    t = np.arange(STEPS)
    curves["loss"] = curves["loss"] + np.where(t > 150, 0.5 * np.sin(2 * np.pi * t / 20), 0.0)
    events = fired(curves)
    assert [e.rule for e in events] == ["loss_oscillation"]
    assert 150 < events[0].step < 200
    assert events[0].value > 0.2
    assert "LR too high" in events[0].message


def test_grad_norm_low_fires_after_warmup_only():
    curves = healthy()
    curves["grad_norm"] = np.full(STEPS, 0.2)
    events = fired(curves)
    assert [(e.rule, e.step) for e in events] == [("grad_norm_low", WARMUP + 50)]  # the window fills after warmup
    assert events[0].value == pytest.approx(0.2)
    assert "LR too low?" in events[0].message


def test_grad_norm_high():
    curves = healthy()
    curves["grad_norm"] = np.full(STEPS, 8.0)
    events = fired(curves)
    assert [e.rule for e in events] == ["grad_norm_high"]
    assert "clip harder / lower LR?" in events[0].message


def test_throughput_drop_names_the_data_pipeline_when_it_is_slow():
    curves = healthy()
    curves["tokens_per_s"][250:] *= 0.5
    curves["data_time_s"][250:] = 0.3
    events = fired(curves)
    assert [e.rule for e in events] == ["throughput_drop"]
    assert 250 < events[0].step <= 256
    assert events[0].value == pytest.approx(0.5, abs=0.05)
    assert "data stall?" in events[0].message and "input pipeline is the bottleneck" in events[0].message


def test_one_slow_step_is_not_a_stall():
    curves = healthy()
    curves["tokens_per_s"][[100, 200, 300]] = 100.0
    assert fired(curves) == []


def test_each_rule_fires_at_most_once_even_when_all_fire():
    curves = healthy()
    t = np.arange(STEPS)
    curves["loss"] = curves["loss"] + 0.6 * np.sin(2 * np.pi * t / 16) + np.where(t % 50 == 49, 4.0, 0.0)
    curves["loss"][[120, 330]] = math.nan
    curves["grad_norm"] = np.full(STEPS, 9.0)
    curves["tokens_per_s"][200:] *= 0.3
    rules = [e.rule for e in fired(curves)]
    assert sorted(rules) == sorted(set(rules))
    assert set(rules) == {"nonfinite", "loss_spike", "loss_oscillation", "grad_norm_high", "throughput_drop"}


def test_streaming_equals_offline_and_state_survives_a_resume():
    """A monitor restored from state_dict mid-run finds what an uninterrupted one finds, and does not
    repeat a finding made before the restart."""
    curves = healthy()
    curves["loss"][99] += 3.0
    curves["grad_norm"] = np.full(STEPS, 0.1)
    recs = records(curves)
    whole = HealthMonitor(HealthConfig(), WARMUP)
    expected = [e for r in recs for e in whole.observe(r)]
    first = HealthMonitor(HealthConfig(), WARMUP)
    got = [e for r in recs[:150] for e in first.observe(r)]
    resumed = HealthMonitor(HealthConfig(), WARMUP)
    resumed.load_state_dict(first.state_dict())
    got += [e for r in recs[150:] for e in resumed.observe(r)]
    assert got == expected == fired(curves)
    assert [e.rule for e in expected] == ["grad_norm_low", "loss_spike"]


def test_offline_takes_the_last_record_per_step_and_ignores_other_kinds():
    """A crashed attempt logged NaN at steps 101-110; the resumed run re-logged them finite: the last wins."""
    recs = records(healthy())
    crashed = [dict(r, loss=None) for r in recs[100:110]]
    others = [
        {"event": "start", "step": 0},
        {"step": 20, "val_loss": 3.0},
        {"step": 50, "layer_grad_norm": {"embed": 1.0}},
    ]
    assert evaluate([*others, *recs[:100], *crashed, *recs[100:]], warmup_steps=WARMUP) == []
    assert [e.rule for e in evaluate([*recs[:100], *crashed], warmup_steps=WARMUP)] == ["nonfinite"]


def test_thresholds_configurable_and_disable_with_null():
    curves = healthy()
    curves["grad_norm"] = np.full(STEPS, 0.2)
    assert fired(curves, HealthConfig(grad_norm_low=None)) == []
    assert [e.rule for e in fired(curves, HealthConfig(grad_norm_low=0.1, grad_norm_high=0.15))] == ["grad_norm_high"]
    assert fired(curves, HealthConfig(enabled=False)) == []


def test_config_rejects_unknown_keys_and_documents_every_field():
    with pytest.raises(ValidationError, match="extra"):
        HealthConfig(grad_norm_lo=0.5)
    with pytest.raises(ValidationError):
        HealthConfig(throughput_drop=1.5)
    assert all(field.description for field in HealthConfig.model_fields.values())


def test_event_record_shape():
    event = HealthEvent(7, "nonfinite", "msg", math.nan)
    assert event.to_dict() == {"step": 7, "event": "health", "rule": "nonfinite", "message": "msg", "value": None}
    assert set(RULES) == {
        "nonfinite",
        "loss_spike",
        "loss_oscillation",
        "grad_norm_low",
        "grad_norm_high",
        "throughput_drop",
    }
