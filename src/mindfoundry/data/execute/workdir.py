"""The staged `prepare`'s work area: one folder per stage, one per task, a completion marker per task.

Every stage of :mod:`~mindfoundry.data.prepare.pipeline` is a set of independent tasks. A task
writes into an attempt folder of its own (``task-000012.tmp-HOST-PID``), then its result
(``result.json``, small: counters and sizes), fsyncs what it wrote and renames the attempt to
``task-000012``: the rename is the completion marker. So a folder without the ``.tmp-`` suffix is
always complete, a task killed at any moment leaves only an attempt folder (removed by the next
run of its stage), and a `prepare` started again skips every task whose folder exists.

The area belongs to one data identity (``workdir.json``): a `prepare` of another data config
finds the old work stale and starts afresh; a folder that holds anything else is refused, never
cleared. One `prepare` at a time holds the area (an exclusive lock on ``.lock``).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

from mindfoundry import atomic, locks
from mindfoundry.config.storage_config import public_command
from mindfoundry.errors import MindFoundryError

FORMAT = "mindfoundry.prepare-work/1"
MARKER = "workdir.json"
LOCK = ".lock"
RESULT = "result.json"
ATTEMPT = ".tmp-"


class WorkDirError(MindFoundryError, RuntimeError):
    """The work area cannot be used: not writable, full, another prepare's, or not ours."""


def write_json(path: Path, value: Any) -> None:
    """``value`` as JSON at ``path``, written aside, fsynced and renamed into place (:mod:`mindfoundry.atomic`)."""
    atomic.write_text(path, json.dumps(value, ensure_ascii=False, sort_keys=True))


def alive(pid: int) -> bool:
    """Whether a process of this machine runs with that id."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def link_or_copy(source: Path, target: Path) -> None:
    """``target`` as a hard link to ``source`` (a file of the work area handed on without copying its bytes), or a
    copy where the two are on different file systems (``data.work_dir`` elsewhere) or links are not supported."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def space_problem(exc: OSError, where: Path) -> WorkDirError | None:
    """A full disk (or quota) as the one-line error a user can act on; None for any other error."""
    if atomic.disk_full(exc):
        return WorkDirError(
            f"no space left writing under '{where}': free space or set data.work_dir (and data.output_dir) "
            "to a larger disk, then run prepare again; finished tasks are kept and skipped"
        )
    return None


class WorkDir:
    """The work area of one data identity (see the module docstring).

    Only paths travel to the workers (the object pickles as its root); :meth:`claim` (lock, identity,
    stale work) runs once, in the process that drives the stages.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._lock: int | None = None  # the descriptor of the locked .lock file, in the driver

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "_lock": None}

    # -- the driver's side ---------------------------------------------------------------------

    def claim(self, identity: str, plan: str, *, fresh: bool, log: Any) -> None:
        """Lock the area for this `prepare` and make it hold the work of ``identity`` over the input files
        ``plan`` (a digest of the files' list, sizes and times): kept when it already does (resume),
        emptied when it holds other work (another data config, changed files) or ``fresh`` is asked."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".probe-{os.getpid()}"
            probe.write_bytes(b"ok")
            probe.unlink()
        except OSError as exc:
            raise space_problem(exc, self.root) or WorkDirError(
                f"the prepare work folder '{self.root}' is not writable ({exc.strerror or exc}): "
                "set data.work_dir to a writable folder (on shared storage for a cluster)") from None
        marker = self.root / MARKER
        held = self._read_marker(marker)
        # the lock, the identity (whole, or half written by a prepare stopped while claiming) and the write probe
        claim_files = (LOCK, MARKER, MARKER + atomic.PARTIAL)
        others = [p for p in self.root.iterdir() if p.name not in claim_files and not p.name.startswith(".probe-")]
        if held is None and others:
            raise WorkDirError(
                f"the prepare work folder '{self.root}' holds files that are not a MindFoundry prepare's "
                f"(e.g. '{others[0].name}'): choose an empty or new folder for data.work_dir"
            )
        fd = locks.open_lock(self.root / LOCK)
        try:
            locks.take(fd, public_command(sys.argv))
        except locks.LockHeldError as held:
            raise WorkDirError(f"another prepare ({held}) is working in '{self.root}': wait for it to finish, or give "
                               "this config another data.output_dir / data.work_dir") from None
        except OSError as exc:
            os.close(fd)
            raise WorkDirError(f"the prepare work folder '{self.root}' cannot be locked ({exc.strerror}): choose a "
                               "folder on a local disk that supports file locks for data.work_dir") from None
        self._lock = fd
        stale = self.stale_reason(held, identity, plan, fresh)
        if stale is not None:
            log(f"discarding the earlier prepare's work in {self.root} ({stale})")
            for path in others:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        elif others:
            log(f"resuming the prepare in {self.root}: finished tasks are kept")
        write_json(marker, {"format": FORMAT, "identity": identity, "plan": plan})

    @staticmethod
    def stale_reason(held: dict[str, Any] | None, identity: str, plan: str, fresh: bool) -> str | None:
        """Why the work the area holds cannot be resumed (None: it can, or there is none)."""
        if held is None:
            return None
        if fresh:
            return "--overwrite"
        if held.get("identity") != identity:
            return "the data config changed"
        if held.get("plan") != plan:
            return "the source files changed since it began"
        return None

    @staticmethod
    def _read_marker(marker: Path) -> dict[str, Any] | None:
        if not marker.is_file():
            return None
        try:
            held = json.loads(marker.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {"identity": None}  # ours (the name says so) but damaged: stale
        return held if isinstance(held, dict) and held.get("format") == FORMAT else {"identity": None}

    @property
    def scratch(self) -> Path:
        """Where this process writes (what a full disk is reported for)."""
        return self.root

    def release(self) -> None:
        if self._lock is not None:
            locks.release(self._lock)
            self._lock = None

    def remove(self) -> None:
        """Delete the area once its output is in place (the lock goes with it)."""
        self.release()
        shutil.rmtree(self.root, ignore_errors=True)

    def clear_attempts(self, stage: str) -> None:
        """Remove what killed attempts of ``stage``'s tasks left. An attempt whose process still runs on this machine
        (a worker of a driver killed alone, finishing its task) is left be: it commits whole or not at all, and the
        task's new attempt does the same (:meth:`commit` keeps whichever finishes first)."""
        folder = self.stage(stage)
        if folder.is_dir():
            for path in folder.glob(f"*{ATTEMPT}*"):
                host, _, pid = path.name.split(ATTEMPT, 1)[1].rpartition("-")
                if not (host == socket.gethostname() and pid.isdigit() and int(pid) != os.getpid() and alive(int(pid))):
                    shutil.rmtree(path, ignore_errors=True)

    # -- both sides ----------------------------------------------------------------------------

    def stage(self, stage: str) -> Path:
        return self.root / "stages" / stage

    def task(self, stage: str, task: int) -> Path:
        """The folder of a finished task (exists only once it finished)."""
        return self.stage(stage) / f"task-{task:06d}"

    def done(self, stage: str, task: int) -> bool:
        return (self.task(stage, task) / RESULT).is_file()

    def result(self, stage: str, task: int) -> dict[str, Any]:
        return json.loads((self.task(stage, task) / RESULT).read_text(encoding="utf-8"))

    def attempt(self, stage: str, task: int) -> Path:
        """A fresh folder for one attempt at a task (its name says which host and process made it)."""
        path = self.stage(stage) / f"task-{task:06d}{ATTEMPT}{socket.gethostname()}-{os.getpid()}"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def commit(self, stage: str, task: int, attempt: Path, result: dict[str, Any]) -> None:
        """Publish an attempt as the task's output: result written, everything fsynced, one rename."""
        (attempt / RESULT).write_text(json.dumps(result, ensure_ascii=False, sort_keys=True), encoding="utf-8")
        try:
            atomic.publish_folder(attempt, self.task(stage, task))
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            shutil.rmtree(attempt)  # another attempt (a retry after a lost worker) finished first: same bytes
