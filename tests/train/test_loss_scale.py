"""Dynamic loss scaling: the scaler's rule (GradScaler semantics), its scalars, and fp16 training
through the Trainer and the CLI (overflow skipped and backed off, scale restored on resume)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mf_testing import tiny_config, tiny_run_tree
from mindfoundry.train.loss_scale import DynamicLossScaler
from mindfoundry.train.schedule import step_scalars


# -- the scaler ------------------------------------------------------------------------------------
def test_grows_after_interval_of_clean_steps() -> None:
    s = DynamicLossScaler(init_scale=1024.0, growth_interval=3)
    assert [s.update(False) for _ in range(7)] == [1024.0, 1024.0, 2048.0, 2048.0, 2048.0, 4096.0, 4096.0]


def test_backs_off_on_overflow_and_resets_the_growth_tracker() -> None:
    s = DynamicLossScaler(init_scale=1024.0, growth_interval=3)
    s.update(False)
    s.update(False)
    assert s.update(True) == 512.0  # halved, and the two clean steps no longer count
    assert [s.update(False) for _ in range(3)] == [512.0, 512.0, 1024.0]
    assert s.overflows == 1


def test_never_below_min_scale() -> None:
    s = DynamicLossScaler(init_scale=4.0, min_scale=1.0)
    assert [s.update(True) for _ in range(4)] == [2.0, 1.0, 1.0, 1.0]
    assert s.at_floor


def test_growth_stops_at_a_finite_scale() -> None:
    s = DynamicLossScaler(init_scale=2.0**1023, growth_interval=1)
    assert s.update(False) == 2.0**1023  # 2**1024 is inf in float64: keep the scale


def test_state_round_trip_continues_identically() -> None:
    a = DynamicLossScaler(init_scale=2.0**16, growth_interval=2)
    for found in (True, False, True, False):
        a.update(found)
    state = json.loads(json.dumps(a.state_dict()))  # it lives in the checkpoint's JSON trainer state
    b = DynamicLossScaler(init_scale=2.0**16, growth_interval=2)
    b.load_state_dict(state)
    assert (b.scale, b.growth_tracker, b.overflows) == (a.scale, a.growth_tracker, a.overflows) == (2.0**14, 1, 2)
    pattern = [False, False, True, False, False, False]
    assert [a.update(f) for f in pattern] == [b.update(f) for f in pattern]


def test_disabled_scaler_stays_at_one() -> None:
    s = DynamicLossScaler(init_scale=2.0**16, enabled=False)
    assert s.scale == 1.0 and s.update(True) == 1.0 and s.update(False) == 1.0
    s.load_state_dict({"scale": 512.0})
    assert s.scale == 1.0 and s.state_dict()["enabled"] is False


def test_rejects_nonsense_settings() -> None:
    with pytest.raises(ValueError, match="backoff_factor"):
        DynamicLossScaler(backoff_factor=1.5)
    with pytest.raises(ValueError, match="min_scale <= init_scale"):
        DynamicLossScaler(init_scale=0.5)


def test_step_scalars_carry_the_scale_exactly() -> None:
    optim = tiny_config().optim
    plain = step_scalars(3, 10, optim, 96)
    assert step_scalars(3, 10, optim, 96, loss_scale=1.0) == plain  # fp32: nothing changes
    scaled = step_scalars(3, 10, optim, 96, loss_scale=2.0**16)
    assert scaled.loss_scale == plain.loss_scale * 2.0**16 and scaled.grad_unscale == 2.0**-16
    assert scaled.lr == plain.lr and scaled.step_size == plain.step_size


def test_fp16_config_fields() -> None:
    t = tiny_config(train={"precision": "fp16"}).train  # allowed on the default (mindspore) backend
    assert (t.precision, t.loss_scale_init, t.loss_scale_growth_interval) == ("fp16", 65536.0, 1000)
    from mindfoundry.config.load import ConfigError

    with pytest.raises(ConfigError, match=r"train.precision='bf16' .* use train.precision: fp16"):
        tiny_config(train={"precision": "bf16"})
    with pytest.raises(ConfigError, match="train.loss_scale_init"):
        tiny_config(train={"precision": "fp16", "loss_scale_init": 0.5})


# -- through the Trainer -----------------------------------------------------------------------
pytest_ms = pytest.mark.skipif(
    __import__("importlib").util.find_spec("mindspore") is None, reason="mindspore not installed"
)


@pytest_ms
def test_trainer_backs_off_an_overflowing_scale_without_an_anomaly(tiny_prepared, tmp_path: Path) -> None:
    """A scale of 2**24 overflows float16 on the first steps: each such step is dropped (weights
    untouched), logged as loss_scale_backoff, not counted as an anomaly, and training proceeds."""
    from mindfoundry.parallel.layout import launch_layout
    from mindfoundry.train.metrics import read_metrics
    from mindfoundry.train.trainer import Trainer

    cfg, data = tiny_prepared
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={
        "precision": "fp16", "loss_scale_init": 2.0**24, "loss_scale_growth_interval": 4, "steps": 20})})
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(cfg, data, run_dir, launch_layout(cfg))
    result = trainer.run()

    records = read_metrics(run_dir / "metrics.jsonl")
    steps = [r for r in records if "loss" in r and "event" not in r]
    backoffs = [r for r in records if r.get("event") == "loss_scale_backoff"]
    assert not [r for r in records if r.get("event") == "anomaly"]
    assert trainer.anomaly.counts == {"nonfinite": 0, "spike": 0}

    first = steps[0]
    assert first["loss_scale"] == 2.0**24 and first["applied"] is False and math.isfinite(first["loss"])
    assert backoffs[0] == {**backoffs[0], "step": 1, "scale": 2.0**24, "new_scale": 2.0**23}
    assert not [r for r in records if r.get("event") == "overflow"]  # the overflow locator leaves these steps alone
    dropped = [r["step"] for r in steps if not r["applied"]]
    assert dropped == [b["step"] for b in backoffs]  # every dropped step was a loss-scale overflow
    assert trainer.progress.adam_step == len(steps) - len(dropped) >= 10  # and training went on
    assert steps[-1]["loss"] < steps[0]["loss"] - 0.3
    for prev, rec in zip(steps, steps[1:]):  # the scale each step ran with follows the rule
        assert rec["loss_scale"] in (prev["loss_scale"] / 2, prev["loss_scale"], prev["loss_scale"] * 2)
        assert (rec["loss_scale"] < prev["loss_scale"]) == (not prev["applied"])
    state = trainer.trainer_state()["loss_scale"]
    assert state["enabled"] and state["scale"] == trainer.scaler.scale and state["overflows"] == len(dropped)
    assert result.step == 20


# -- exact resume through the CLI --------------------------------------------------------------
def cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "mindfoundry.cli", *args], capture_output=True, text=True, env=env, timeout=600
    )


def _fp16_tree(corpus: Path, root: Path, name: str) -> Path:
    tree = tiny_run_tree(corpus, root / name)
    # growth every 2 clean steps from a scale that overflows float16 once: the scale changes across the
    # split at step 3 both ways, so a resume that lost it would log different scales (and drop other steps)
    tree["train"].update({"precision": "fp16", "loss_scale_init": 2.0**21, "loss_scale_growth_interval": 3})
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


@pytest_ms
@pytest.mark.slow
def test_fp16_resume_reproduces_the_uninterrupted_run(corpus_dir: Path, tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    from mindfoundry.train.metrics import read_metrics

    def steps(run: Path) -> dict[int, dict]:
        return {r["step"]: r for r in read_metrics(run / "metrics.jsonl") if "loss" in r and "event" not in r}

    straight = _fp16_tree(corpus_dir, tmp_path, "straight")
    assert (p := cli("train", str(straight))).returncode == 0, p.stderr
    split = _fp16_tree(corpus_dir, tmp_path, "split")
    assert (p := cli("train", str(split), "--stop-at-step", "3")).returncode == 0, p.stderr
    assert (p := cli("train", str(split), "--resume", "auto")).returncode == 0, p.stderr
    assert "resumed from" in p.stderr

    a, b = steps(tmp_path / "straight"), steps(tmp_path / "split")
    assert sorted(a) == sorted(b) == [1, 2, 3, 4, 5, 6]
    assert [a[s]["loss"] for s in a] == [b[s]["loss"] for s in a]  # same floats
    assert [a[s]["loss_scale"] for s in a] == [b[s]["loss_scale"] for s in a]
    assert [a[s]["applied"] for s in a] == [b[s]["applied"] for s in a]
    applied = [a[s]["applied"] for s in a]
    assert any(applied) and not all(applied)  # the run both overflowed and trained
    ckpt = tmp_path / "split" / "checkpoints" / "step_00000003"
    saved = json.loads((ckpt / "trainer_state.json").read_text())["loss_scale"]
    assert saved["enabled"] and saved["scale"] == a[4]["loss_scale"]
    # the state at the split is not the configured start, so a resume that lost it would have diverged
    assert (saved["scale"], saved["growth_tracker"]) != (2.0**21, 0) and saved["overflows"] >= 1
    wa = load_file(str(tmp_path / "straight" / "checkpoints" / "step_00000006" / "model.safetensors"))
    wb = load_file(str(tmp_path / "split" / "checkpoints" / "step_00000006" / "model.safetensors"))
    assert all((wa[k] == wb[k]).all() for k in wa)
