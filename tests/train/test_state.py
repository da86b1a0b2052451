"""Trainer state: each component saves and restores its own entries of trainer_state.json."""

from __future__ import annotations

import pytest

from mindfoundry.train.loss_scale import DynamicLossScaler
from mindfoundry.train.schedule import Replan
from mindfoundry.train.state import DataPosition, Evaluations, Keyed, Progress, restore_state, save_state


def components(scaler: DynamicLossScaler, mixture=None) -> list:
    return [
        Progress(),
        DataPosition(seed=7, shuffle=True, mixture_state=mixture),
        Keyed("loss_scale", scaler),
        Evaluations(),
    ]


def test_components_round_trip_through_the_state() -> None:
    scaler = DynamicLossScaler(1024.0, growth_interval=2, enabled=True)
    saved = components(scaler, mixture=lambda position: {"block": position // 10})
    saved[0].step, saved[0].adam_step = 5, 4
    saved[0].steps, saved[0].replans = 12, [Replan(4, 1e-3, 12)]  # planned for 12 steps, re-planned at step 4
    saved[1].consumed_samples, saved[1].consumed_tokens, saved[1].skipped_windows = 40, 1280, [[8, 16]]
    saved[3].initial = {"val_loss": 5.5}
    saved[3].measured(4.25, 4)  # evaluated at step 4, carried along into step 5's checkpoint
    scaler.update(found_nonfinite=True)  # backs off to 512
    state = save_state(saved) | {"step": 5}  # the store adds the step
    assert state == {
        "step": 5, "adam_step": 4,
        "lr_schedule": {"kind": "warmup_cosine", "step": 5, "steps": 12, "replans": [[4, 1e-3, 12]]},
        "consumed_samples": 40, "consumed_tokens": 1280, "skipped_windows": [[8, 16]],
        "data_order": {"seed": 7, "shuffle": True, "position": 40, "mixture": {"block": 4}},
        "loss_scale": scaler.state_dict(), "val_loss": 4.25, "val_step": 4, "initial_eval": {"val_loss": 5.5},
    }
    fresh_scaler = DynamicLossScaler(1024.0, growth_interval=2, enabled=True)
    fresh = components(fresh_scaler)
    restore_state(fresh, state)
    assert (fresh[0], fresh[3]) == (saved[0], saved[3])
    assert (fresh[1].consumed_samples, fresh[1].consumed_tokens, fresh[1].skipped_windows) == (40, 1280, [[8, 16]])
    assert fresh_scaler.scale == 512.0


def test_older_or_fp32_states_leave_the_defaults() -> None:
    """A checkpoint without a component's keys (an older release) or with a disabled loss scale (an fp32 run)."""
    scaler = DynamicLossScaler(1024.0, enabled=True)
    parts = components(scaler)
    restore_state(parts, {"step": 3, "consumed_samples": 24, "consumed_tokens": 768})
    assert (parts[0].step, parts[0].adam_step, parts[1].skipped_windows, parts[3].initial, parts[3].val_step) == (
        3,
        3,
        [],
        None,
        None,
    )
    assert scaler.scale == 1024.0
    Keyed("loss_scale", scaler).restore({"loss_scale": DynamicLossScaler(1.0, enabled=False).state_dict()})
    assert scaler.scale == 1024.0


def test_two_components_cannot_claim_one_key() -> None:
    with pytest.raises(RuntimeError, match=r"\['step'\] are claimed by two components"):
        save_state([Keyed("step", DynamicLossScaler(2.0)), Keyed("step", DynamicLossScaler(2.0))])
