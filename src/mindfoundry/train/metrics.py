"""Where numbers go: an append-only metrics.jsonl and a live console line.

One :class:`MetricsLogger` fans records out to every sink, so the loop has a single `log()` call.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Mapping

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from mindfoundry.config.schema import MonitorConfig
from mindfoundry.monitor.tensorboard import TensorBoardSink, scalars
from mindfoundry.train.rundir import METRICS_FILE


class JsonlSink:
    """One JSON object per line; flushed each record so a crash loses at most the current line."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(path, "a", encoding="utf-8")

    def write(self, record: Mapping[str, Any]) -> None:
        self._fh.write(json.dumps(record, sort_keys=False) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


class ProgressSink:
    """A live rich progress bar with loss, tokens/s and ETA on a terminal; plain lines otherwise.

    Plain lines (about ten per run) keep CI logs and `tee`d output readable.
    """

    def __init__(self, total_steps: int, start_step: int, console: Console, enabled: bool, every: int):
        self.every = every
        self.console = console
        self.live = enabled and console.is_terminal
        self.plain_every = max(1, total_steps // 10) if enabled and not self.live else 0
        self._progress = Progress(
            TextColumn("[bold]step {task.completed}/{task.total}"),
            BarColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
            disable=not self.live,
            transient=False,
        )
        self._task = self._progress.add_task("train", total=total_steps, completed=start_step, info="")
        self._progress.start()

    def write(self, record: Mapping[str, Any]) -> None:
        if record.get("loss") is None or record.get("grad_norm") is None:
            return
        step = record["step"]
        info = (f"loss {record['loss']:.4f}  lr {record['lr']:.2e}  gnorm {record['grad_norm']:.3f}  "
                f"{record['tokens_per_s']:,.0f} tok/s")
        if self.plain_every and step % self.plain_every == 0:
            self.console.print(f"step {step}  {info}", highlight=False)
        self._progress.update(self._task, completed=step, info=info if step % self.every == 0 else None)

    def close(self) -> None:
        self._progress.stop()


class MetricsLogger:
    def __init__(self, sinks: list):
        self.sinks = sinks

    def log(self, record: Mapping[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        clean = dict(clean, time=round(time.time(), 3))
        for sink in self.sinks:
            sink.write(clean)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def run_sinks(monitor: MonitorConfig, run_dir: Path) -> list:
    """Where rank 0's records go: RUN/metrics.jsonl, and TensorBoard and MindSpore Insight files when asked for (a
    config rule refuses the Insight files on other engines than MindSpore)."""
    sinks: list = [JsonlSink(run_dir / METRICS_FILE)]
    if monitor.tensorboard:
        sinks.append(TensorBoardSink(run_dir / "tb"))
    if monitor.mindinsight:
        from mindfoundry.backends.mindspore.summary import MindInsightSink

        sinks.append(MindInsightSink(run_dir / "mindinsight", scalars))
    return sinks


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All complete records of a metrics.jsonl (used by tests, reports and resume checks).

    A live run may be half-way through writing its last line: a line without its newline is not a record yet.
    """
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.endswith("\n") and line.strip()]
