"""Checkpoints committed in the background, so that training does not wait for the disk or the network.

The training thread only takes the snapshot: the engine's weights and AdamW moments as host arrays (copies), the
trainer state, the small files that travel with them -- and, for ``checkpoint.format: sharded``, the engine's own
shard files (every rank writes its shards; a collective, so it stays on the training thread). A background thread then
writes the safetensors files, hashes and lists everything, and commits (:meth:`CheckpointDir.commit`: a rename, or an
upload with the marker last), then updates the pointers and applies retention -- the same steps and the same files as a
save in the foreground, in the same order.

At most one commit is in flight: :meth:`Committer.submit` waits for the previous one first (and raises its failure,
e.g. a full disk, on the training thread). A process killed while a commit is in flight leaves no committed half: the
run resumes from the previous committed checkpoint, and the next start removes what the commit left.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mindfoundry.checkpoint.directory import CheckpointDir, Retention, last_checkpoint_size, write_checkpoint_files
from mindfoundry.checkpoint.store import shard_folders, step_dir_name
from mindfoundry.storage.location import Location

#: The background work's niceness (Linux; per thread): it takes the cores when training leaves them, so the training
#: threads are slowed as little as the machine allows.
BACKGROUND_NICE = 19
#: The name of a commit's thread (then its step): the program's exit looks for one still running.
COMMIT_THREAD = "mindfoundry-commit-"


def yield_cores(native_thread_id: int) -> None:
    """Lower the scheduling priority of one thread of this process (Linux: niceness is per thread) to
    :data:`BACKGROUND_NICE`; elsewhere nothing (there the call would reach the whole process)."""
    if sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, native_thread_id, BACKGROUND_NICE)
        except OSError:
            pass


@dataclass(frozen=True)
class Committed:
    """A commit that finished: its step, where it is, and how long the background work took."""

    step: int
    location: Location
    seconds: float


class Committer:
    """One checkpoint commit at a time, in a background thread (see the module docstring). ``say`` is told "committed
    step N" when a commit ends."""

    def __init__(self, directory: CheckpointDir, retention: Retention, say: Callable[[str], None]) -> None:
        self.directory, self.retention, self.say = directory, retention, say
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._finished: list[Committed] = []
        self._lock = threading.Lock()
        self.in_flight: int | None = None

    def submit(self, step: int, weights: Mapping[str, np.ndarray] | None, optimizer: Mapping[str, np.ndarray] | None,
               state: Mapping[str, Any], extra_files: Mapping[str, bytes], *,
               writer: Callable[[tuple[Path, Path]], None] | None = None) -> Location:
        """Start committing checkpoint ``step`` (after the one in flight, whose failure is raised here); returns where
        it will be. ``writer``: the engine writes its shard files now, into the folders it is given."""
        self.wait()
        tmp = self.directory.stage(step)
        if writer is not None:
            try:
                writer(shard_folders(tmp))
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        self.in_flight = step
        self._thread = threading.Thread(target=self._commit, name=f"{COMMIT_THREAD}{step}", daemon=True,
                                        args=(tmp, step, weights, optimizer, dict(state), dict(extra_files),
                                              writer is not None))
        self._thread.start()
        return self.directory.root / step_dir_name(step)

    def _commit(self, tmp: Path, step: int, weights: Mapping[str, np.ndarray] | None,
                optimizer: Mapping[str, np.ndarray] | None, state: dict[str, Any], extra_files: dict[str, bytes],
                tensors_written: bool) -> None:
        yield_cores(threading.get_native_id())
        self.directory.root.on_io_threads(lambda: yield_cores(threading.get_native_id()))  # a store's uploads
        start = time.perf_counter()
        try:
            write_checkpoint_files(tmp, step, weights, optimizer, state, extra_files, tensors_written=tensors_written,
                                   last_size=lambda: last_checkpoint_size(self.directory))
            location = self.directory.commit(tmp, step, self.retention)
        except BaseException as exc:  # raised on the training thread by the next wait()
            shutil.rmtree(tmp, ignore_errors=True)
            self._error = exc
            return
        seconds = time.perf_counter() - start
        with self._lock:
            self._finished.append(Committed(step, location, seconds))
        self.say(f"committed step {step} ({location}, {seconds:.1f} s in the background)")

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the commit in flight (at most ``timeout`` seconds); False when it is still running. A commit that
        failed raises its error here."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return False
            self._thread, self.in_flight = None, None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return True

    def finished(self) -> list[Committed]:
        """The commits that ended since the last call (a failure is raised by :meth:`wait`, not reported here)."""
        with self._lock:
            done, self._finished = self._finished, []
        return done
