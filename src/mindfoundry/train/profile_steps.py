"""`monitor.profile.steps`: the engine's own profiler over one range of steps.

torch writes a Chrome trace per rank (`*.pt.trace.json`, which TensorBoard's profiler plugin and
chrome://tracing / ui.perfetto.dev open); MindSpore its profiler folder (`ASCEND_PROFILER_OUTPUT/
trace_view.json`, a Chrome trace, and per-operator CSVs under `FRAMEWORK/`). A resumed run profiles
the steps of the range it still runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from mindfoundry.backends.base import Backend
from mindfoundry.config.schema import RunConfig
from mindfoundry.config.selection import parse_selection


class StepProfiler:
    """Starts the backend's profiler before the range's first step this process runs, stops it after the last."""

    def __init__(self, cfg: RunConfig, run_dir: Path, backend: Backend, log: Callable[[str], None]):
        selection = parse_selection(cfg.monitor.profile.steps)
        self.first, self.last = selection.ranges[0] if selection else (0, -1)
        self.backend, self.log = backend, log
        root = Path(cfg.monitor.profile.dir) if cfg.monitor.profile.dir else run_dir / "profile"
        self.folder = root / f"steps_{self.first}-{self.last}" / f"rank{backend.rank}"
        self.active = False

    def before(self, step: int) -> None:
        if not self.active and self.first <= step <= self.last:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.backend.start_profile(self.folder)
            self.active = True

    def after(self, step: int, last_step: int) -> Path | None:
        """Stop after the range's last step (or the run's); the trace folder when it was written."""
        if self.active and step >= min(self.last, last_step):
            return self.close()
        return None

    def close(self) -> Path | None:
        if not self.active:
            return None
        self.active = False
        self.backend.stop_profile()
        self.log(
            f"profiler trace of steps {self.first}-{self.last}: {self.folder} (a Chrome trace: chrome://tracing or "
            f"ui.perfetto.dev; torch's also `tensorboard --logdir {self.folder}` with torch-tb-profiler)"
        )
        return self.folder
