"""One writer at a time: an exclusive ``flock`` on a file that names its holder.

The kernel drops an flock when its process dies however it dies (SIGKILL included), so a lock file
left behind never blocks anyone; what the file holds is only the holder's name (pid, host, start,
command), for the message a second writer gets and for the note when a lock is taken over from a
process that is gone. A clean :func:`release` empties the file. flock is local to one machine on most
network file systems: the run directory and `prepare`'s work area each say what that means for them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path


class LockHeldError(Exception):
    """Another live process holds the lock; ``holder`` is its record (empty when it wrote none)."""

    def __init__(self, holder: dict) -> None:
        super().__init__(describe(holder))
        self.holder = holder


def describe(holder: dict) -> str:
    """A holder record as a message names it: pid, host, when it started and its command."""
    if not holder:
        return "another process"
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


def open_lock(path: Path) -> int:
    """The descriptor of lock file ``path`` (created if missing); OSError when it cannot be opened."""
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)


def take(fd: int, command: str, *, shared: bool = False) -> dict:
    """Hold an exclusive flock on the open lock file ``fd`` for as long as it stays open, and write this process as
    its holder (``command``: its command line as it may be shown, secrets left out; ``shared``: a reader's lock, which
    other readers may hold too and a writer may not); the previous holder's record ({} after a clean release; a
    killed process leaves its own). Raises :class:`LockHeldError` (and closes ``fd``) when
    another process holds it, OSError when the file system cannot lock."""
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read(fd)
        os.close(fd)
        raise LockHeldError(holder) from None
    previous = _read(fd)
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "start": time.time(),
              "command": command[:300]}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(holder) + "\n").encode("utf-8"), 0)
    return previous


@contextlib.contextmanager
def waiting(path: Path) -> Iterator[None]:
    """Hold lock file ``path`` for the block, waiting while another process holds it (no holder recorded: the
    others only wait their turn)."""
    fd = open_lock(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor drops the flock


def release(fd: int) -> None:
    """Give the lock up: a clean end leaves no holder to report (closing the descriptor drops the flock)."""
    os.ftruncate(fd, 0)
    os.close(fd)
