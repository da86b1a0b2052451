"""The work area of `prepare` on object storage (``data.work_dir: s3://bucket/prefix``): workers that share no disk.

The stages see the same interface as the local area (:class:`~mindfoundry.data.execute.workdir.WorkDir`): an
attempt folder to write into, a commit, the folder of a finished task, its result. Here the attempt is a folder of
this node's cache (:func:`~mindfoundry.storage.cache.cache_folder`, resolved in each process, so each node of a Ray
cluster uses its own disk); the commit uploads its files under ``PREFIX/stages/STAGE/task-N/`` and then the task's
commit marker (:mod:`mindfoundry.storage.commit`), which is what makes the task finished: a task killed during its
upload has no marker and runs again. A later task reads a finished task's files from this node's copy, fetched from
the store once and checked against the marker (the node that wrote them keeps its attempt as that copy).

The area's identity (``workdir.json``) is an object, as locally; the lock is a lease (``.lock``: owner and time) that
the driver renews while it runs: another `prepare` refuses an area whose lease is fresh and takes over a stale one
(its driver is gone). Unfinished multipart uploads of killed tasks are aborted when the area is claimed.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any

from mindfoundry import atomic
from mindfoundry.data.execute.workdir import FORMAT, MARKER, RESULT, WorkDir, WorkDirError
from mindfoundry.storage.cache import cache_folder
from mindfoundry.storage.commit import COMMIT_FILE, FETCHED, fetch, is_committed, publish
from mindfoundry.storage.remote import ObjectMissingError, Remote

LEASE = ".lock"
#: The driver renews its lease this often; a lease this much older is a dead driver's.
RENEW_S, STALE_S = 30.0, 180.0


class RemoteWorkDir:
    """The work area of one data identity under a URL (see the module docstring)."""

    def __init__(self, root: Remote, cache_dir: str | None = None) -> None:
        self.root, self.cache_dir = root, cache_dir
        self._lease: threading.Event | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "cache_dir": self.cache_dir, "_lease": None}

    @property
    def local(self) -> WorkDir:
        """This node's side of the area: attempts and fetched copies of finished tasks (resolved in this process)."""
        return WorkDir(cache_folder("work", self.root.url, self.cache_dir))

    # -- the driver's side ---------------------------------------------------------------------
    def claim(self, identity: str, plan: str, *, fresh: bool, log: Any) -> None:
        """As :meth:`WorkDir.claim`: take the lease, keep the work of ``identity`` over ``plan`` or empty the area."""
        self.root.check_writable()
        lease = self.root / LEASE
        me = f"pid {os.getpid()} on {socket.gethostname()}"
        try:
            held = json.loads(lease.read_text())
        except (ObjectMissingError, ValueError):
            held = None
        age = time.time() - float(held.get("time", 0)) if isinstance(held, dict) else STALE_S
        if isinstance(held, dict) and held.get("owner") != me and age < STALE_S:
            raise WorkDirError(f"another prepare ({held.get('owner')}) is working in '{self.root}' (its lease was "
                               f"renewed {age:.0f} s ago): wait for it to finish, or give this config another "
                               "data.output_dir / data.work_dir")
        self._renew(lease, me)
        marker = self.root / MARKER
        try:
            known = json.loads(marker.read_text())
            known = known if isinstance(known, dict) and known.get("format") == FORMAT else {"identity": None}
        except ObjectMissingError:
            known = None
        except ValueError:
            known = {"identity": None}
        others = [name for name in self.root.children() if name not in (LEASE, MARKER)]
        if known is None and others:
            self.release()
            raise WorkDirError(f"the prepare work area '{self.root}' holds objects that are not a MindFoundry "
                               f"prepare's (e.g. '{others[0]}'): choose an empty or new prefix for data.work_dir")
        stale = WorkDir.stale_reason(known, identity, plan, fresh)
        if stale is not None:
            log(f"discarding the earlier prepare's work in {self.root} ({stale})")
            for name in others:
                (self.root / name).delete_tree()
            shutil.rmtree(self.local.root, ignore_errors=True)
        elif others:
            log(f"resuming the prepare in {self.root}: finished tasks are kept")
        aborted = self.root.abort_uploads()
        if aborted:
            log(f"aborted {aborted} unfinished upload(s) a stopped prepare left in {self.root}")
        marker.write_text(json.dumps({"format": FORMAT, "identity": identity, "plan": plan}, sort_keys=True))

    def _renew(self, lease: Remote, me: str) -> None:
        """Write the lease now and every :data:`RENEW_S` seconds until :meth:`release`."""
        lease.write_text(json.dumps({"owner": me, "time": time.time()}))
        stop = self._lease = threading.Event()

        def renew() -> None:
            while not stop.wait(RENEW_S):
                try:
                    lease.write_text(json.dumps({"owner": me, "time": time.time()}))
                except OSError:
                    pass  # the next renewal may get through; the work itself reports a lasting failure

        threading.Thread(target=renew, name="mindfoundry-work-lease", daemon=True).start()

    def release(self) -> None:
        if self._lease is not None:
            self._lease.set()
            self._lease = None
            try:
                (self.root / LEASE).delete()
            except OSError:
                pass  # unreachable now: the lease goes stale and the next prepare takes the area over

    def remove(self) -> None:
        """Delete the area (and this node's copies) once its output is in place."""
        self.release()
        self.root.delete_tree()
        shutil.rmtree(self.local.root, ignore_errors=True)

    def clear_attempts(self, stage: str) -> None:
        self.local.clear_attempts(stage)

    @property
    def scratch(self) -> Path:
        """Where this node writes (what a full disk is reported for)."""
        return self.local.root

    # -- both sides ----------------------------------------------------------------------------
    def _remote_task(self, stage: str, task: int) -> Remote:
        return self.root / "stages" / stage / f"task-{task:06d}"

    def task(self, stage: str, task: int) -> Path:
        """The finished task's folder on this node (fetched once and checked against its commit marker)."""
        return fetch(self._remote_task(stage, task), self.local.task(stage, task))

    def done(self, stage: str, task: int) -> bool:
        return is_committed(self._remote_task(stage, task))

    def result(self, stage: str, task: int) -> dict[str, Any]:
        return json.loads((self._remote_task(stage, task) / RESULT).read_text())

    def attempt(self, stage: str, task: int) -> Path:
        return self.local.attempt(stage, task)

    def commit(self, stage: str, task: int, attempt: Path, result: dict[str, Any]) -> None:
        """Upload the attempt's files, then the task's commit marker; keep the attempt as this node's copy."""
        (attempt / RESULT).write_text(json.dumps(result, ensure_ascii=False, sort_keys=True), encoding="utf-8")
        remote = self._remote_task(stage, task)
        if is_committed(remote):  # another attempt (a retry after a lost worker) finished first: same bytes
            shutil.rmtree(attempt)
            return
        publish(attempt, remote)
        (attempt / FETCHED).write_bytes((remote / COMMIT_FILE).read_bytes())
        try:
            atomic.publish_folder(attempt, self.local.task(stage, task))
        except OSError:  # a copy is already there
            shutil.rmtree(attempt, ignore_errors=True)
