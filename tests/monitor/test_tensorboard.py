"""Event files written by the sink, read back with TensorBoard's own reader (EventAccumulator)."""

from __future__ import annotations

import math
import sys
import time

import numpy as np
import pytest

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from mindfoundry.monitor.tensorboard import TensorBoardSink, scalars  # noqa: E402

STEP = {"step": 3, "loss": 7.123456789, "lr": 0.003, "grad_norm": 1.5, "applied": True, "tokens": 2048,
        "tokens_per_s": 5123.25, "step_time_s": 0.4, "data_time_s": 0.001, "model_tflops_per_s": 0.163, "mfu": 0.0123,
        "rss_mb": 1536.5, "consumed_samples": 48, "time": 1_700_000_000.5}


def read(log_dir) -> EventAccumulator:
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return acc


def values(acc: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def f32(x: float) -> float:
    """TensorBoard stores scalars as float32: the exact value read back is the float32 of what was written."""
    return float(np.float32(x))


def test_scalars_read_back_exactly(tmp_path):
    sink = TensorBoardSink(tmp_path / "tb")
    sink.write(STEP)
    sink.write(
        {**STEP, "step": 4, "loss": 6.5, "grad_norm": None, "time": 1_700_000_001.0}
    )  # None = NaN/Inf in metrics.jsonl
    sink.write({"step": 4, "val_loss": 6.75, "val_perplexity": 854.06, "val_bits_per_byte": 2.5, "val_tokens": 512})
    sink.close()
    acc = read(tmp_path / "tb")
    assert values(acc, "train/loss") == [(3, f32(7.123456789)), (4, 6.5)]
    assert values(acc, "train/grad_norm") == [(3, 1.5)]
    assert values(acc, "train/lr") == [(3, f32(0.003)), (4, f32(0.003))]
    assert values(acc, "val/loss") == [(4, 6.75)]
    assert values(acc, "perf/tokens_per_s") == [(3, 5123.25), (4, 5123.25)]
    assert values(acc, "perf/mfu") == [(3, f32(0.0123)), (4, f32(0.0123))]
    assert values(acc, "mem/rss_mb") == [(3, 1536.5), (4, 1536.5)]
    assert [e.wall_time for e in acc.Scalars("train/loss")] == [1_700_000_000.5, 1_700_000_001.0]
    assert set(acc.Tags()["scalars"]) == {  # counters and flags (tokens, applied, consumed_samples) are not plotted
        "train/loss",
        "train/lr",
        "train/grad_norm",
        "val/loss",
        "val/perplexity",
        "val/bits_per_byte",
        "perf/tokens_per_s",
        "perf/step_time_s",
        "perf/data_time_s",
        "perf/model_tflops_per_s",
        "perf/mfu",
        "mem/rss_mb",
    }


def test_per_layer_dicts_health_and_anomalies(tmp_path):
    sink = TensorBoardSink(tmp_path / "tb")
    sink.write({"step": 10, "layer_grad_norm": {"embed": 0.5, "layers.0": 0.25, "norm": 0.125},
                "layer_weight_norm": {"embed": 20.0}, "layer_update_ratio": {"layers.0": 0.001}})
    sink.write({"step": 12, "event": "health", "rule": "grad_norm_low", "message": "LR too low?", "value": 0.375})
    sink.write({"step": 13, "event": "anomaly", "kind": "nonfinite", "reason": "loss=nan", "action": "skipped"})
    sink.write({"step": 14, "event": "checkpoint", "path": "x", "seconds": 0.5})  # nothing to plot
    sink.close()
    acc = read(tmp_path / "tb")
    assert values(acc, "layer_grad_norm/layers.0") == [(10, 0.25)]
    assert values(acc, "layer_grad_norm/norm") == [(10, 0.125)]
    assert values(acc, "layer_weight_norm/embed") == [(10, 20.0)]
    assert values(acc, "layer_update_ratio/layers.0") == [(10, f32(0.001))]
    assert values(acc, "health/grad_norm_low") == [(12, 0.375)]
    assert values(acc, "anomaly/nonfinite") == [(13, 1.0)]


def test_resume_drops_the_crashed_attempts_later_steps(tmp_path):
    """Steps 5-6 were logged, the run crashed, resumed from step 4 and logged 5-6 again: TensorBoard
    shows the resumed values only."""
    first = TensorBoardSink(tmp_path / "tb")
    for step, loss in ((4, 4.0), (5, 99.0), (6, 98.0)):
        first.write({"step": step, "loss": loss, "time": 100.0 + step})
    first.close()
    # TensorBoard reads a folder's event files in name order: events.out.tfevents.<unix second>.<host>.<pid>.<writer
    # count>. A resumed attempt is a new process seconds later, so its file sorts after the crashed one's; two writers
    # of
    # one process in one second sort by the count as text (uid 10 before 9: this failed under pytest -n 2, where a
    # worker had opened 9 writers before). Open the second in a later second, as a restart does.
    time.sleep(math.floor(time.time()) + 1.01 - time.time())
    second = TensorBoardSink(tmp_path / "tb")
    second.write({"event": "resume", "step": 4, "backend": "mindspore", "time": 200.0})
    for step, loss in ((5, 3.5), (6, 3.25)):
        second.write({"step": step, "loss": loss, "time": 200.0 + step})
    second.close()
    assert values(read(tmp_path / "tb"), "train/loss") == [(4, 4.0), (5, 3.5), (6, 3.25)]


def test_realized_mixture_in_either_shape():
    report = {"categories": {"news": {"target": 0.5, "realized": 0.25, "samples": 4}}, "sources": {}}
    assert scalars({"step": 1, "mixture": report}) == {"mixture/news": 0.25}
    assert scalars({"step": 1, "mixture": {"code": 0.75}}) == {"mixture/code": 0.75}


def test_writer_does_not_import_torch():
    """A MindSpore training process must not load torch through the TensorBoard sink."""
    import subprocess

    code = "import sys, mindfoundry.monitor.tensorboard; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
