"""The staged `prepare`'s work area: one folder per stage, one per task, a committed folder per finished task.

Every stage of :mod:`~mindfoundry.data.prepare.pipeline` is a set of independent tasks. A task writes into an attempt
folder of its own on this node (``task-000012.tmp-HOST-PID``), then its result (``result.json``, small: counters and
sizes), and commits it as the task's folder ``stages/STAGE/task-000012`` (:mod:`mindfoundry.storage.commit`: one
rename on a disk, the objects and then their marker on a store). A task killed at any moment leaves only an attempt
(removed by the next run of its stage) or objects without a marker; a `prepare` started again skips every committed
task. On a store (``data.work_dir: s3://...``, workers that share no disk) the attempts and the finished tasks' copies
live in this node's cache: a later task reads a finished task's files from this node's copy, fetched once and checked
(the node that wrote them keeps its attempt as that copy).

The area belongs to one data identity (``workdir.json``): a `prepare` of another data config finds the old work stale
and starts afresh; a folder that holds anything else is refused, never cleared. One `prepare` at a time holds the
area (a claim on ``.lock``: an flock on a disk, a lease on a store, :mod:`mindfoundry.storage.claim`).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any

from mindfoundry import atomic
from mindfoundry.errors import MindFoundryError
from mindfoundry.storage.cache import cache_folder
from mindfoundry.storage.claim import ClaimHeldError, alive
from mindfoundry.storage.commit import fetch, is_committed, publish
from mindfoundry.storage.failures import StorageError
from mindfoundry.storage.location import Claim, Location
from mindfoundry.storage.resolve import locate

FORMAT = "mindfoundry.prepare-work/1"
MARKER = "workdir.json"
LOCK = ".lock"
RESULT = "result.json"
ATTEMPT = ".tmp-"


class WorkDirError(MindFoundryError, RuntimeError):
    """The work area cannot be used: not writable, full, another prepare's, or not ours."""


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
    """The work area of one data identity at ``root``, a folder or a URL (see the module docstring).

    Only the location travels to the workers (the object pickles as it and the cache setting); :meth:`claim` (lock,
    identity, stale work) runs once, in the process that drives the stages.
    """

    def __init__(self, root: Path | Location, cache_dir: str | None = None) -> None:
        self.root = locate(root)
        self.cache_dir = cache_dir
        self._claim: Claim | None = None  # the driver's hold on .lock

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "cache_dir": self.cache_dir, "_claim": None}

    @property
    def scratch(self) -> Path:
        """This node's side of the area, where it writes (what a full disk is reported for): the area itself on a
        disk, this node's cache for a URL (resolved in this process)."""
        return self.root.staging(cache_folder("work", str(self.root), self.cache_dir))

    # -- the driver's side ---------------------------------------------------------------------

    def claim(self, identity: str, plan: str, *, fresh: bool, log: Any) -> None:
        """Lock the area for this `prepare` and make it hold the work of ``identity`` over the input files
        ``plan`` (a digest of the files' list, sizes and times): kept when it already does (resume),
        emptied when it holds other work (another data config, changed files) or ``fresh`` is asked."""
        try:
            self.root.check_writable()
        except StorageError as exc:
            raise space_problem(exc, self.scratch) or WorkDirError(
                f"the prepare work folder '{self.root}' is not writable ({exc.strerror or exc}): set data.work_dir to "
                "a writable folder (on shared storage for a cluster)") from None
        held = self._read_marker(self.root / MARKER)
        # the lock, the identity (whole, or half written by a prepare stopped while claiming)
        claim_files = (LOCK, MARKER, MARKER + atomic.PARTIAL)
        others = [name for name in self.root.children() if name not in claim_files]
        if held is None and others:
            raise WorkDirError(
                f"the prepare work folder '{self.root}' holds files that are not a MindFoundry prepare's "
                f"(e.g. '{others[0]}'): choose an empty or new folder for data.work_dir"
            )
        try:
            self._claim = (self.root / LOCK).claim()
        except ClaimHeldError as holder:
            raise WorkDirError(f"another prepare ({holder}) is working in '{self.root}': wait for it to finish, or "
                               "give this config another data.output_dir / data.work_dir") from None
        except OSError as exc:
            raise WorkDirError(f"the prepare work folder '{self.root}' cannot be locked ({exc.strerror or exc}): "
                               "choose a folder on a local disk that supports file locks for data.work_dir") from None
        stale = self.stale_reason(held, identity, plan, fresh)
        if stale is not None:
            log(f"discarding the earlier prepare's work in {self.root} ({stale})")
            for name in others:
                (self.root / name).delete_tree()
            shutil.rmtree(self.scratch / "stages", ignore_errors=True)
        elif others:
            log(f"resuming the prepare in {self.root}: finished tasks are kept")
        aborted = self.root.abort_uploads()
        if aborted:
            log(f"aborted {aborted} unfinished upload(s) a stopped prepare left in {self.root}")
        (self.root / MARKER).write_text(json.dumps({"format": FORMAT, "identity": identity, "plan": plan},
                                                   ensure_ascii=False, sort_keys=True))

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
    def _read_marker(marker: Location) -> dict[str, Any] | None:
        try:
            held = json.loads(marker.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {"identity": None}  # ours (the name says so) but damaged: stale
        return held if isinstance(held, dict) and held.get("format") == FORMAT else {"identity": None}

    def release(self) -> None:
        if self._claim is not None:
            self._claim.release()
            self._claim = None

    def remove(self) -> None:
        """Delete the area (and this node's copies) once its output is in place (the lock goes with it)."""
        self.release()
        self.root.delete_tree()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def clear_attempts(self, stage: str) -> None:
        """Remove what killed attempts of ``stage``'s tasks left. An attempt whose process still runs on this machine
        (a worker of a driver killed alone, finishing its task) is left be: it commits whole or not at all, and the
        task's new attempt does the same (:meth:`commit` keeps whichever finishes first)."""
        folder = self._local_stage(stage)
        if folder.is_dir():
            for path in folder.glob(f"*{ATTEMPT}*"):
                host, _, pid = path.name.split(ATTEMPT, 1)[1].rpartition("-")
                if not (host == socket.gethostname() and pid.isdigit() and int(pid) != os.getpid() and alive(int(pid))):
                    shutil.rmtree(path, ignore_errors=True)

    # -- both sides ----------------------------------------------------------------------------

    def _local_stage(self, stage: str) -> Path:
        return self.scratch / "stages" / stage

    def _task(self, stage: str, task: int) -> Location:
        return self.root / "stages" / stage / f"task-{task:06d}"

    def task(self, stage: str, task: int) -> Path:
        """The folder of a finished task on this node (a store's fetched once and checked against its marker)."""
        return fetch(self._task(stage, task), self._local_stage(stage) / f"task-{task:06d}")

    def done(self, stage: str, task: int) -> bool:
        return is_committed(self._task(stage, task))

    def result(self, stage: str, task: int) -> dict[str, Any]:
        return json.loads((self._task(stage, task) / RESULT).read_bytes())

    def attempt(self, stage: str, task: int) -> Path:
        """A fresh folder for one attempt at a task (its name says which host and process made it)."""
        path = self._local_stage(stage) / f"task-{task:06d}{ATTEMPT}{socket.gethostname()}-{os.getpid()}"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def commit(self, stage: str, task: int, attempt: Path, result: dict[str, Any]) -> None:
        """Commit an attempt as the task's folder, its result written first; what a store's commit leaves of the
        attempt becomes this node's copy."""
        (attempt / RESULT).write_text(json.dumps(result, ensure_ascii=False, sort_keys=True), encoding="utf-8")
        where = self._task(stage, task)
        if is_committed(where):  # another attempt (a retry after a lost worker) finished first: same bytes
            shutil.rmtree(attempt)
            return
        try:
            publish(attempt, where)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            shutil.rmtree(attempt)  # another attempt finished first
            return
        if attempt.exists():
            try:
                atomic.publish_folder(attempt, self._local_stage(stage) / f"task-{task:06d}")
            except OSError:  # a copy is already there
                shutil.rmtree(attempt, ignore_errors=True)
