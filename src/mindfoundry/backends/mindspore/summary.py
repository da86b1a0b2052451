"""`monitor.mindinsight`: the run's scalars as MindSpore summary files, for MindSpore Insight.

MindSpore Insight (the practitioners' dashboard) reads the files of `mindspore.SummaryRecord`
(`events.out.events.summary.<time>.<host>_MS`: length-prefixed, CRC-framed `summary_pb2.Event`
protobufs), not TensorBoard's. This sink writes the same scalars as the TensorBoard sink, under the
same tags: the trainer hands it :func:`mindfoundry.monitor.tensorboard.scalars` (`train/loss`,
`train/lr`, `train/grad_norm`, `layer_grad_norm/<module>`, ...), one `record(step)` per metrics record.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import mindspore as ms
import numpy as np


class MindInsightSink:
    """`write(record)` / `close()`, like the other metrics sinks; RUN_DIR/mindinsight holds the summary files."""

    def __init__(self, log_dir: str | Path, scalars: Callable[[Mapping[str, Any]], dict[str, float]]):
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        self._record = ms.SummaryRecord(str(log_dir), raise_exception=True)
        self._scalars = scalars  # a metrics record -> {tag: value}

    def write(self, record: Mapping[str, Any]) -> None:
        if record.get("step") is None:
            return
        values = self._scalars(record)
        for tag, value in values.items():
            self._record.add_value("scalar", tag, ms.Tensor(np.float32(value)))
        if values:
            self._record.record(int(record["step"]))

    def close(self) -> None:
        self._record.close()
