"""One writer at a time on a location, local or at a URL: a claim that names its holder and is never left behind by a
process that died.

On a disk a claim is an ``flock`` on a lock file (:mod:`mindfoundry.locks`): the kernel drops it when its process
dies, however it dies; readers may share it (``shared``), a writer excludes them. A store has no lock: a claim is a
lease object naming its holder (pid, host, start, command) and the time it was last renewed (a writer's; each reader
has one of its own beside it); the holder renews it every :data:`RENEW_S` seconds while it works. Another process
takes a lease over at once when its holder is a process of this host that is gone, and after :data:`STALE_S` seconds
without renewal when the holder is on another host (whose processes this one cannot see). The command a holder
records is the public one: secrets left out.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from mindfoundry import locks
from mindfoundry.config.storage_config import public_command
from mindfoundry.storage.location import Claim, Location

#: The holder renews its lease this often; a lease of another host's process this much older is a dead holder's.
RENEW_S, STALE_S = 30.0, 180.0


class ClaimHeldError(Exception):
    """Another live process holds the claim; ``holder`` is its record, ``str()`` names it."""

    def __init__(self, holder: dict[str, Any]) -> None:
        super().__init__(describe_holder(holder))
        self.holder = holder


def describe_holder(holder: dict[str, Any]) -> str:
    """A holder as messages name it: pid, host, when it started and its command."""
    return locks.describe(holder)


def alive(pid: int) -> bool:
    """Whether a process of this machine runs with that id."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _me() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "start": time.time(),
            "command": public_command(sys.argv)[:300]}


class FileClaim(Claim):
    """A claim on a disk: an flock on ``path`` (see the module docstring)."""

    def __init__(self, path: Path, *, shared: bool) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = locks.open_lock(path)
        try:
            self.previous = locks.take(fd, public_command(sys.argv), shared=shared)
        except locks.LockHeldError as held:
            raise ClaimHeldError(held.holder) from None
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            locks.release(self._fd)
            self._fd = None


class LeaseClaim(Claim):
    """A claim on a store: the lease object ``lease`` (a writer's) or one object per reader beside it
    (``LEASE.readers/HOST-PID``, ``shared``), renewed by a thread until :meth:`release` (see the module docstring). A
    writer is refused while a live reader or writer holds a lease; a reader while a live writer does."""

    def __init__(self, lease: Location, *, shared: bool) -> None:
        me = _me()
        held = _record(lease)
        if held is not None and not _gone(held, me):
            raise ClaimHeldError(held)
        readers = lease.with_name(lease.name + ".readers")
        if shared:
            self.lease = readers / f"{me['host']}-{me['pid']}"
        else:
            for name in readers.children():
                reader = _record(readers / name)
                if reader is not None and not _gone(reader, me):
                    raise ClaimHeldError(reader)
            self.lease, self.previous = lease, held or {}
        record = dict(me, time=time.time())
        self.lease.write_text(json.dumps(record))
        self._stop = threading.Event()
        threading.Thread(target=self._renew, args=(record,), name="mindfoundry-lease", daemon=True).start()

    def _renew(self, record: dict[str, Any]) -> None:
        while not self._stop.wait(RENEW_S):
            try:
                self.lease.write_text(json.dumps(dict(record, time=time.time())))
            except OSError:
                pass  # the next renewal may get through; the work itself reports a lasting failure

    def release(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            try:
                self.lease.delete()
            except OSError:
                pass  # unreachable now: the lease goes stale and the next claim takes it over


def _record(lease: Location) -> dict[str, Any] | None:
    """The holder a lease object names (None when there is none, or it is not one)."""
    try:
        record = json.loads(lease.read_bytes())
    except (FileNotFoundError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _gone(held: dict[str, Any], me: dict[str, Any]) -> bool:
    """Whether the lease's holder has stopped: this process itself (a claim taken again), a process of this host that
    no longer runs, or a holder that has not renewed for :data:`STALE_S` seconds."""
    pid, host = held.get("pid"), held.get("host")
    if host == me["host"] and isinstance(pid, int):
        return pid == me["pid"] or not alive(pid)
    return time.time() - float(held.get("time", 0) or 0) >= STALE_S
