"""Progress of the staged `prepare`: tasks done of total and documents per second, per stage.

On a terminal (stderr) each stage has a rich bar; otherwise a stage prints one plain line when it
ends (and one every :data:`PLAIN_EVERY_S` seconds while it runs), so logs and CI output stay
readable. What a stage reports also goes into the manifest's ``timings``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

#: Without a terminal, a long stage still reports at least this often.
PLAIN_EVERY_S = 30.0


class StageProgress:
    """One stage's tasks as they finish; :meth:`summary` is what the manifest records of it."""

    def __init__(self, title: str, total: int, skipped: int, log: Callable[[str], None], bars: Progress | None) -> None:
        self.title, self.total, self.skipped = title, total, skipped
        self.done = skipped
        self.documents = 0
        self.task_seconds = 0.0
        self._log, self._bars = log, bars
        self._bar = bars.add_task(title, total=total, completed=skipped, documents="") if bars is not None else None
        self.start = self._reported = time.perf_counter()

    def advance(self, documents: int, seconds: float) -> None:
        """One more task finished, having gone through ``documents`` documents in ``seconds``."""
        self.done += 1
        self.documents += documents
        self.task_seconds += seconds
        if self._bars is not None:
            self._bars.update(self._bar, advance=1, documents=self._rate())
        elif time.perf_counter() - self._reported >= PLAIN_EVERY_S:
            self._reported = time.perf_counter()
            self._log(f"{self.title}: {self.done}/{self.total} tasks{self._rate()} so far")

    def _rate(self) -> str:
        if not self.documents:
            return ""
        return f", {self.documents:,} documents, {self.documents / max(time.perf_counter() - self.start, 1e-9):,.0f}/s"

    def close(self) -> None:
        if self._bars is None:
            before = f" ({self.skipped} done before)" if self.skipped else ""
            self._log(f"{self.title}: {self.done}/{self.total} tasks{before}{self._rate()} "
                      f"in {time.perf_counter() - self.start:.1f}s")

    def summary(self) -> dict[str, Any]:
        seconds = time.perf_counter() - self.start
        return {"tasks": self.total, "skipped": self.skipped, "documents": self.documents, "seconds": round(seconds, 2),
                "task_seconds": round(self.task_seconds, 2),
                "documents_per_s": round(self.documents / seconds) if self.documents and seconds else None}


class StagesProgress:
    """The bars of all stages of one `prepare` (a context manager: the bars live while it is open)."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self._log = log
        self._bars = (
            Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("tasks{task.fields[documents]}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
            )
            if sys.stderr.isatty()
            else None
        )

    def __enter__(self) -> StagesProgress:
        if self._bars is not None:
            self._bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bars is not None:
            self._bars.stop()

    def stage(self, title: str, total: int, skipped: int) -> StageProgress:
        return StageProgress(title, total, skipped, self._log, self._bars)
