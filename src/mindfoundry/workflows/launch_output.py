"""What a launched job shows on the console when one of its ranks fails: the rank's own one-line error, not the
launcher's report around it.

torchrun tees every rank's output to the console, each line prefixed ``[defaultN]:``. When a rank exits with an error
(a config refused at start-up, data that does not match a checkpoint: one ``error: ...`` line, exit 2), torchrun stops
the other ranks with SIGTERM -- each then says it was stopped -- and prints its own ``ChildFailedError`` traceback and
failure report, some 50 lines in which the one line that matters is lost. :class:`LauncherOutput` passes the launcher's
error stream through unchanged until a rank prints an error line; from then on it holds back what the launcher itself
prints and what the other ranks print while they are being stopped, so the failing rank's line is the last word on the
console. Every rank's full output is still in its log file (``launch``'s per-rank logs).
"""

from __future__ import annotations

import re
import threading
from typing import IO

_RANK_LINE = re.compile(r"^\[[A-Za-z_]+(\d+)\]:(.*)$")  # torchrun's tee prefix: [ROLE RANK]:, e.g. [default0]:
_ERROR = re.compile(r"^(config )?error: ")


class LauncherOutput:
    """Copies a launcher's error stream to ``sink`` as it comes, holding back the noise around a rank's failure (see
    the module docstring); :attr:`failed` is the rank whose error line was seen, if any."""

    def __init__(self, sink: IO[str]) -> None:
        self.sink = sink
        self.failed: int | None = None
        self.held = 0  # lines held back

    def line(self, text: str) -> None:
        """One line of the launcher's error stream (with its newline)."""
        rank_line = _RANK_LINE.match(text.rstrip("\n"))
        if self.failed is None:
            if rank_line is not None and _ERROR.match(rank_line.group(2)):
                self.failed = int(rank_line.group(1))
            self._write(text)
        elif rank_line is not None and int(rank_line.group(1)) == self.failed:
            self._write(text)
        else:
            self.held += 1

    def _write(self, text: str) -> None:
        self.sink.write(text)
        self.sink.flush()

    def pump(self, stream: IO[str]) -> threading.Thread:
        """Copy ``stream`` line by line in a thread (started; join it once the launcher ended)."""

        def run() -> None:
            for text in stream:
                self.line(text)

        thread = threading.Thread(target=run, name="mindfoundry-launcher-output", daemon=True)
        thread.start()
        return thread
