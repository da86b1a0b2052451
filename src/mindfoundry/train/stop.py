"""SIGTERM and SIGINT in a training process, from its first line to its last.

What a stop signal does depends on where the run is (:class:`Phase`):

- start-up (config, run directory, data preparation, engine build, restore, the step-0 evaluation): the
  signal raises :class:`Preempted` where the process is. Every start-up stage already survives SIGKILL
  at any point (atomic commits, leftovers cleaned at the next start), and an exception there is no
  worse; nothing half written is ever taken for finished work. Exit 75.
- training (the step loop): the signal is noted; the current step finishes and is checkpointed, then
  the trainer raises Preempted (exit 75). Under several processes the ranks agree at every step
  boundary, so all of them stop after the same step.
- finishing (every step done): noted; the command completes normally (exit 0).

A second signal exits at once, without a checkpoint, with status 128 + its number and one line naming it.

Some start-up work must not be cut by an exception: importing an engine (MindSpore's native extension, left
half initialised by a Preempted raised inside its import, aborted the process at exit: status -6 instead of
75). Such work runs inside :meth:`StopSignals.held`: a signal there is noted and raised when it ends.

MindSpore's runtime threads install a native SIGINT handler that sends SIGTERM to the whole process
(`IntHandler` in its ccsrc: ``kill(getpid(), SIGTERM)``), so a Ctrl-C would arrive as SIGTERM.
:func:`route_sigint` therefore blocks SIGINT in every thread of a training process, before any
thread exists (threads inherit the mask; numpy's BLAS starts one at import), and a watcher thread
takes it with ``sigwaitinfo`` and hands it to the main thread as SIGINT: the native handler never
runs. Child processes inherit the blocked SIGINT (data workers stop through their parent).

A process forked from a training process (a library's worker pool: MindSpore's summary writer and
its pool, its profiler's parsers) is not that process: it gets back the handlers from before
:meth:`StopSignals.install`. With ours, the SIGTERM by which ``multiprocessing.Pool.terminate`` ends
its workers was only noted (training phase) or raised inside the pool's queue lock (start-up), the
worker lived on and the pool's join waited for ever: a CI run hung 10 min closing MindSpore's
``SummaryRecord``.

This module imports only the standard library: the program's entry point imports it first.
"""

from __future__ import annotations

import _thread
import contextlib
import enum
import os
import signal
import sys
import threading
from typing import Callable, Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(BaseException):
    """A stop signal ended the command (exit 75). A BaseException like KeyboardInterrupt, so that no
    ``except Exception`` on the way (a library's cleanup, a retry loop) swallows it during start-up."""


class Phase(enum.Enum):
    START_UP = "start-up"
    TRAINING = "training"
    FINISHING = "finishing"


def route_sigint() -> None:
    """Block SIGINT in this thread (and so in every thread started after) and deliver it to the main thread's
    Python handler from a watcher thread. Call before anything starts a thread."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    threading.Thread(target=_forward_sigint, name="mindfoundry-sigint", daemon=True).start()


def _forward_sigint() -> None:
    while True:
        signal.sigwaitinfo({signal.SIGINT})
        _thread.interrupt_main(signal.SIGINT)  # the main thread runs its Python SIGINT handler, as for a real signal


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class StopSignals:
    """The process's stop-signal handler (one per process: signals are process-wide)."""

    def __init__(self) -> None:
        self.received: int | None = None  # the first stop signal's number
        self.phase = Phase.START_UP
        self.installed = False
        self._log: Callable[[str], None] = _stderr
        self._previous: dict[int, object] = {}
        self._holding = 0  # depth of held() blocks: a start-up signal inside one waits for its end

    @property
    def name(self) -> str | None:
        return None if self.received is None else signal.Signals(self.received).name

    def install(self, log: Callable[[str], None] = _stderr) -> None:
        """Handle SIGTERM and SIGINT from now on, in the start-up phase."""
        self.received, self.phase, self._log, self.installed = None, Phase.START_UP, log, True
        self._previous = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}

    def uninstall(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous, self.installed = {}, False

    def after_fork_in_child(self) -> None:
        """A forked child does not stop the way its parent does (module docstring): the handlers from before install."""
        if self.installed:
            self.uninstall()

    def enter(self, phase: Phase) -> None:
        self.phase = phase

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Run the block whole: a start-up stop signal received inside it raises Preempted when it ends."""
        self._holding += 1
        try:
            yield
        finally:
            self._holding -= 1
        if not self._holding and (stopped := self.start_up_stop()) is not None:
            raise Preempted(stopped)

    def start_up_stop(self) -> str | None:
        """What to tell when a stop signal ended the start-up (None otherwise). An exception that the signal's
        Preempted turned into on its way (an extension module being imported reports "initialization failed")
        is the same stop."""
        if self.received is None or self.phase is not Phase.START_UP:
            return None
        return (
            f"stopped by {self.name} before the first step; nothing half written is kept: continue with --resume auto"
        )

    def _on_signal(self, signum: int, _frame) -> None:
        name = signal.Signals(signum).name
        if self.received is not None:
            self._log(f"second stop signal ({name}): exiting at once without a checkpoint (exit {128 + signum}); "
                      "the newest valid checkpoint still resumes with --resume auto")
            os._exit(128 + signum)
        self.received = signum
        if self.phase is Phase.START_UP and not self._holding:
            raise Preempted(self.start_up_stop())
        if self.phase is Phase.TRAINING:
            self._log(f"{name} received: checkpointing after this step (send it again to exit at once)")
        else:
            self._log(f"{name} received after the last step: finishing normally (send it again to exit at once)")


#: The one handler of this process (the CLI installs it for `train` and `run`; the trainer otherwise).
signals = StopSignals()
os.register_at_fork(after_in_child=signals.after_fork_in_child)
