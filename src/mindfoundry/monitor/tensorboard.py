"""A metrics sink writing TensorBoard event files: `tensorboard --logdir RUN_DIR/tb`.

It uses the `tensorboard` package's own event writer (protobuf only, no TensorFlow), not
tensorboardX or torch.utils.tensorboard: tensorboardX imports torch whenever torch is installed,
which a MindSpore training process must not do.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Mapping

from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from mindfoundry.monitor.records import LAYER_KEYS, TASK_KEYS, realized_shares

#: metrics.jsonl key -> TensorBoard tag, for the scalars of step and eval records.
SCALAR_TAGS = {
    "loss": "train/loss",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "loss_scale": "train/loss_scale",
    "val_loss": "val/loss",
    "val_perplexity": "val/perplexity",
    "val_bits_per_byte": "val/bits_per_byte",
    "tokens_per_s": "perf/tokens_per_s",
    "mfu": "perf/mfu",
    "model_tflops_per_s": "perf/model_tflops_per_s",
    "step_time_s": "perf/step_time_s",
    "data_time_s": "perf/data_time_s",
    "ckpt_time_s": "perf/ckpt_time_s",
    "rss_mb": "mem/rss_mb",
    "peak_rss_mb": "mem/peak_rss_mb",
    "device_mem_allocated_mb": "mem/device_allocated_mb",
    "device_mem_reserved_mb": "mem/device_reserved_mb",
    "device_mem_peak_mb": "mem/device_peak_mb",
    "cpu_util": "hw/cpu_util",
    "process_cpu": "hw/process_cpu",
    "device_util": "hw/device_util",
    "device_temp_c": "hw/device_temp_c",
    "device_power_w": "hw/device_power_w",
}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The (tag, value) pairs of one metrics record; None (a non-finite value) and text are skipped.

    Per-layer dicts become `layer_grad_norm/layers.0` etc., zero-shot task scores `task_acc/<task>`; health findings
    `health/<rule>` (their
    measured value); anomalies `anomaly/<kind>` = 1; a realized data mixture `mixture/<category>`.
    """
    out = {tag: float(record[key]) for key, tag in SCALAR_TAGS.items() if _number(record.get(key))}
    for key in (*LAYER_KEYS, *TASK_KEYS):
        out.update({f"{key}/{module}": float(v) for module, v in (record.get(key) or {}).items() if _number(v)})
    if isinstance(record.get("mixture"), Mapping):
        out.update({f"mixture/{category}": share for category, share in realized_shares(record["mixture"]).items()})
    event = record.get("event")
    if event == "health":
        value = record.get("value")
        out[f"health/{record['rule']}"] = float(value) if _number(value) else 1.0
    elif event == "anomaly":
        out[f"anomaly/{record.get('kind', 'unknown')}"] = 1.0
    return out


class TensorBoardSink:
    """`write(record)` / `close()`, like the sinks of train/metrics.py. A "resume" event record marks a
    restart, so TensorBoard drops the steps the crashed attempt logged after its last checkpoint
    (the resumed run logs them again)."""

    def __init__(self, log_dir: str | Path, flush_secs: float = 10.0):
        self.log_dir = Path(log_dir)
        self._writer = EventFileWriter(str(self.log_dir), max_queue_size=100, flush_secs=flush_secs)

    def write(self, record: Mapping[str, Any]) -> None:
        if record.get("step") is None:
            return
        step = int(record["step"])
        wall_time = float(record.get("time") or time.time())
        if record.get("event") == "resume":
            self._writer.add_event(
                Event(wall_time=wall_time, step=step + 1, session_log=SessionLog(status=SessionLog.START))
            )
        values = [Summary.Value(tag=tag, simple_value=value) for tag, value in scalars(record).items()]
        if values:
            self._writer.add_event(Event(wall_time=wall_time, step=step, summary=Summary(value=values)))

    def close(self) -> None:
        self._writer.close()
