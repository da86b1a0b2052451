"""One writer per run directory: an advisory lock that `train`, `run`, `prepare` and `--overwrite` take first.

The lock is ``RUN_DIR/.lock`` (:mod:`mindfoundry.locks`), held for the life of the process that claimed the run, so a
second writer is refused before it writes or moves anything (two writers would lose one's results, and
``--overwrite`` would move the folder aside under the first), and a lock left by a dead process is taken over with
its holder named. flock is local to one machine on most network file systems: two hosts writing one run dir over NFS
are caught only when the lock file names another host, which the message then says.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Callable

from mindfoundry import locks
from mindfoundry.config.storage_config import public_command
from mindfoundry.errors import MindFoundryError
from mindfoundry.storage.claim import ClaimHeldError
from mindfoundry.storage.location import Claim, Location

LOCK_FILE = ".lock"
_held: dict[Path, int] = {}  # run dir (resolved) -> open descriptor of its locked file, in this process
_claims: dict[str, Claim] = {}  # checkpoint.dir outside the run dir -> this process's claim on it


class RunLockedError(MindFoundryError, RuntimeError):
    """Another live process writes this run directory."""


class RunDirUnusableError(MindFoundryError, OSError):
    """The run directory cannot hold or lock the run's lock file (a /proc path, a read-only mount)."""


def acquire(run_dir: Path, log: Callable[[str], None] = print) -> None:
    """Hold RUN_DIR's lock until this process ends (or :func:`release`); RunLockedError if another process holds it."""
    run_dir = Path(run_dir)
    key = run_dir.resolve()
    if key in _held:
        return
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = locks.open_lock(run_dir / LOCK_FILE)
    except OSError as exc:  # /proc/self, a read-only mount, a file where the folder should be
        raise RunDirUnusableError(f"run directory '{run_dir}' cannot hold the run's lock file {LOCK_FILE} "
                                  f"({exc.strerror or type(exc).__name__}): choose a folder on a writable disk for "
                                  "run_dir (nothing was written)") from None
    try:
        previous = locks.take(fd, public_command(sys.argv))
    except locks.LockHeldError as held:
        raise RunLockedError(f"run directory '{run_dir}' is being written by {held}: one writer per run; "
                             f"wait for it, stop it, or use another run_dir (nothing was written or moved)") from None
    except OSError as exc:
        os.close(fd)
        raise RunDirUnusableError(f"run directory '{run_dir}' cannot lock {LOCK_FILE} ({exc.strerror}): choose a "
                                  "folder on a local disk that supports file locks for run_dir") from None
    if previous and previous.get("pid") != os.getpid():
        elsewhere = previous.get("host") != socket.gethostname()
        log(f"run directory '{run_dir}': taking over the lock of {locks.describe(previous)}, "
            + ("a process on another host: make sure it is gone" if elsewhere else "which is gone"))
    _held[key] = fd


def claim_checkpoints(root: Location) -> None:
    """Hold a ``checkpoint.dir`` outside the run directory until this process ends: one run writes it at a time (two
    runs started together on one checkpoint.dir overwrote each other's checkpoints). A lock file there on a disk, a
    lease object on a store (:mod:`mindfoundry.storage.claim`)."""
    if str(root) in _claims:
        return
    try:
        _claims[str(root)] = (root / LOCK_FILE).claim()
    except ClaimHeldError as held:
        raise RunLockedError(f"checkpoint.dir {root} is being written by {held}: one run per checkpoint.dir; wait for "
                             "it, stop it, or give this run another checkpoint.dir (nothing was written)") from None


def release(run_dir: Path) -> None:
    """Give up RUN_DIR's lock (before moving the folder aside, or when the command is done)."""
    fd = _held.pop(Path(run_dir).resolve(), None)
    if fd is not None:
        locks.release(fd)


def release_all() -> None:
    """Every lock this process holds: the end of a command (the CLI's, or a test's in-process call)."""
    for key in list(_held):
        release(key)
    for claim in _claims.values():
        claim.release()
    _claims.clear()
