"""One writer per run directory: an advisory lock that `train`, `run`, `prepare` and `--overwrite` take first.

The lock is ``RUN_DIR/.lock``, held with ``flock`` for the life of the process that claimed the
run, and holding who took it (pid, host, start time, command) for the message a second writer gets.
The kernel drops an flock when its process dies however it dies (SIGKILL included), so a lock file
left behind by a dead process is recognised as stale by simply acquiring it, whatever became of its
pid; its previous holder is named when it is taken over. Two processes on one run dir used to both
exit 0 with one's results lost (``--overwrite`` moved the first's folder aside while it kept
writing); now the second is refused before it writes or moves anything.

flock is local to one machine on most network file systems: two hosts writing one run dir over NFS
are caught only when the lock file names another host, which the message then says.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Callable

from mindfoundry.errors import MindFoundryError

LOCK_FILE = ".lock"
_held: dict[Path, int] = {}  # run dir (resolved) -> open descriptor of its locked file, in this process


class RunLockedError(MindFoundryError, RuntimeError):
    """Another live process writes this run directory."""


class RunDirUnusableError(MindFoundryError, OSError):
    """The run directory cannot hold or lock the run's lock file (a /proc path, a read-only mount)."""


def _describe(holder: dict) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("start", 0)))
    return f"pid {holder.get('pid')} on {holder.get('host')} (started {started}: {holder.get('command', '?')})"


def _read(fd: int) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 65536)
    try:
        holder = json.loads(raw.decode("utf-8")) if raw.strip() else {}
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return holder if isinstance(holder, dict) else {}


def acquire(run_dir: Path, log: Callable[[str], None] = print) -> None:
    """Hold RUN_DIR's lock until this process ends (or :func:`release`); RunLockedError if another process holds it."""
    run_dir = Path(run_dir)
    key = run_dir.resolve()
    if key in _held:
        return
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:  # /proc/self, a read-only mount, a file where the folder should be
        raise RunDirUnusableError(f"run directory '{run_dir}' cannot hold the run's lock file {LOCK_FILE} "
                                  f"({exc.strerror or type(exc).__name__}): choose a folder on a writable disk for "
                                  "run_dir (nothing was written)") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if not isinstance(exc, BlockingIOError):
            os.close(fd)
            raise RunDirUnusableError(f"run directory '{run_dir}' cannot lock {LOCK_FILE} ({exc.strerror}): choose a "
                                      "folder on a local disk that supports file locks for run_dir") from None
        holder = _read(fd)
        os.close(fd)
        raise RunLockedError(f"run directory '{run_dir}' is being written by {_describe(holder)}: one writer per run; "
                             f"wait for it, stop it, or use another run_dir (nothing was written or moved)") from None
    previous = _read(fd)
    if previous and previous.get("pid") != os.getpid():
        elsewhere = previous.get("host") != socket.gethostname()
        log(f"run directory '{run_dir}': taking over the lock of {_describe(previous)}, "
            + ("a process on another host: make sure it is gone" if elsewhere else "which is gone"))
    holder = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "start": time.time(),
        "command": " ".join(sys.argv)[:300],
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(holder) + "\n").encode("utf-8"), 0)
    _held[key] = fd


def release(run_dir: Path) -> None:
    """Give up RUN_DIR's lock (before moving the folder aside, or when the command is done)."""
    fd = _held.pop(Path(run_dir).resolve(), None)
    if fd is not None:
        os.ftruncate(fd, 0)  # a clean end leaves no holder to report; a killed process leaves its name
        os.close(fd)  # closing the descriptor drops the flock


def release_all() -> None:
    """Every lock this process holds: the end of a command (the CLI's, or a test's in-process call)."""
    for key in list(_held):
        release(key)
