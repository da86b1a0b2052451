"""A run's checkpoints: where they are committed (``checkpoint.dir``, a folder or a URL), which survive, which to
resume from.

A checkpoint is written into a local folder first (:meth:`CheckpointDir.stage`: beside the checkpoints on a local
disk, in a node-local staging folder for a URL), checked, and committed by the one commit protocol
(:mod:`mindfoundry.storage.commit`, sealed by :data:`~mindfoundry.checkpoint.store.CHECKPOINT`: its manifest, and
``manifest.sha256`` as the marker): one rename on a disk; on a store every object, then the marker last. A folder that
was never committed is never taken (:meth:`committed`), and retention removes a checkpoint so that half of one never
looks committed.

Reading a checkpoint at a URL means reading a local copy (:meth:`local_copy`): every file fetched into this node's cache
and checked against the manifest, so a changed, cut or deleted object is found, and resuming falls back to the previous
checkpoint (:meth:`find_resumable`). Interrupted writes (temporary folders, unfinished multipart uploads, a step's
objects without their marker) are removed at the next start (:meth:`clean_interrupted`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mindfoundry import atomic
from mindfoundry.checkpoint.store import (
    BEST_FILE,
    CHECKPOINT,
    LATEST_FILE,
    MODEL_FILE,
    OPTIMIZER_FILE,
    STEP_DIR,
    CheckpointError,
    checkpoint_bytes,
    checkpoint_eval,
    read_state,
    shard_folders,
    step_dir_name,
    step_of,
    verify_checkpoint,
    write_payload,
    write_safetensors,
)
from mindfoundry.config.schema import RunConfig
from mindfoundry.storage.cache import cache_folder
from mindfoundry.storage.commit import fetch, is_committed, publish, uncommit
from mindfoundry.storage.local_path import DELETING
from mindfoundry.storage.location import Location
from mindfoundry.storage.resolve import locate


@dataclass(frozen=True)
class Retention:
    """Which committed checkpoints survive a save.

    keep_last newest ones; every checkpoint whose step is a multiple of keep_every (0 = none); and,
    with keep_best, the one with the lowest validation loss measured at its own step (:func:`checkpoint_eval`).
    """

    keep_last: int = 3
    keep_every: int = 0
    keep_best: bool = False


class DiskFullError(CheckpointError):
    """The checkpoint did not fit on its disk; the ones written before are intact."""


def checkpoints_dir(run_dir: str | Path) -> Path:
    """A run directory's own checkpoint folder (``checkpoint.dir: null``)."""
    return Path(run_dir) / "checkpoints"


class CheckpointDir:
    """The committed checkpoints under ``root`` (see the module docstring). ``staging``: the local folder a checkpoint
    for a URL root is written into before its upload; ``cache``: where local copies of its checkpoints are fetched."""

    def __init__(self, root: Path | Location, *, staging: Path | None = None, cache_dir: str | None = None) -> None:
        self.root = root = locate(root)
        self.staging = root.staging(staging or cache_folder("staging", str(root), cache_dir))
        self.cache = cache_folder("checkpoints", str(root), cache_dir)

    @classmethod
    def of_run(cls, cfg: RunConfig) -> CheckpointDir:
        """``checkpoint.dir`` of a run (its run directory's ``checkpoints`` by default)."""
        root = locate(cfg.checkpoint.dir, cfg.storage) if cfg.checkpoint.dir else checkpoints_dir(cfg.run_dir)
        return cls(root, staging=Path(cfg.run_dir) / ".checkpoint-staging", cache_dir=cfg.data.cache_dir)

    def __str__(self) -> str:
        return str(self.root)

    # -- what is there -----------------------------------------------------------------------------------------
    def committed(self) -> list[Location]:
        """The committed checkpoint folders, oldest first (whether each is intact is for :meth:`verify` to say)."""
        return [self.root / n for n in self.root.children() if STEP_DIR.match(n) and is_committed(self.root / n,
                                                                                                     CHECKPOINT)]

    def pointer(self, name: str) -> str | None:
        """The folder name ``latest`` or ``best`` points at (None without the pointer)."""
        try:
            return (self.root / name).read_text(encoding="utf-8").strip() or None
        except FileNotFoundError:
            return None

    def state(self, checkpoint: Location) -> dict[str, Any]:
        """A checkpoint's trainer_state.json ({} when missing or unreadable)."""
        return read_state(checkpoint)

    # -- writing -----------------------------------------------------------------------------------------------
    def stage(self, step: int) -> Path:
        """A new, empty local folder to write checkpoint ``step`` into before :meth:`commit`."""
        tmp = self.staging / f".tmp-{step_dir_name(step)}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        return tmp

    def commit(self, tmp: Path, step: int, retention: Retention) -> Location:
        """Commit the complete folder ``tmp`` as checkpoint ``step`` (checked first; the same step again replaces
        the old one), point ``latest`` at it, apply retention, point ``best``. Older checkpoints are deleted only once
        the new one is committed."""
        final = self.root / step_dir_name(step)
        verify_checkpoint(tmp)
        try:
            publish(tmp, final, CHECKPOINT)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self._point(LATEST_FILE, final.name)
        self.apply_retention(retention)
        self._point(BEST_FILE, self.best_of(self.committed()))
        return final

    def _point(self, pointer: str, name: str | None) -> None:
        """Point ``latest`` or ``best`` at checkpoint folder ``name`` (None: remove the pointer)."""
        if name is None:
            (self.root / pointer).delete()
        else:
            (self.root / pointer).write_text(name + "\n")

    def best_of(self, found: list[Location]) -> str | None:
        """What ``best`` points at among ``found``: the folder name of the checkpoint with the lowest own validation
        loss (the earliest of equals), or None."""
        scored = [(loss, step_of(p.name), p.name) for p in found
                  if (loss := checkpoint_eval(self.state(p))) is not None]
        return min(scored)[2] if scored else None

    def apply_retention(self, retention: Retention) -> list[Location]:
        """Delete committed checkpoints that no rule keeps; return them. The newest committed checkpoint is always
        kept (keep_last is at least 1), so retention never leaves zero checkpoints."""
        found = self.committed()
        keep = set(found[-max(retention.keep_last, 1):])
        if retention.keep_every:
            keep |= {p for p in found if step_of(p.name) % retention.keep_every == 0}
        if retention.keep_best and (best := self.best_of(found)) is not None:
            keep.add(self.root / best)
        deleted = [p for p in found if p not in keep]
        for path in deleted:
            uncommit(path, CHECKPOINT)  # never leaves half a step_N that looks committed
        return deleted

    def clean_interrupted(self) -> list[str]:
        """Remove what killed writers left: temporary, replaced and half-deleted folders; on a store, unfinished
        multipart uploads and a step's objects without their marker. Run at start-up under the run lock, so no live
        writer owns them; none was ever counted as a checkpoint. Returns what was removed, for the log."""
        removed: list[str] = []
        if self.staging.is_dir():
            for path in sorted(self.staging.glob(".tmp-step_*")):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path.name)
        if (aborted := self.root.abort_uploads()) > 0:
            removed.append(f"{aborted} unfinished upload(s)")
        for name in self.root.children():
            if name.startswith((".old-step_", DELETING)):
                (self.root / name).delete_tree()
                removed.append(name)
            elif STEP_DIR.match(name) and not is_committed(self.root / name, CHECKPOINT):
                (self.root / name).delete_tree()
                removed.append(f"{name} (objects without a commit marker)")
        return removed

    # -- reading -----------------------------------------------------------------------------------------------
    def local_copy(self, checkpoint: Location, *, reuse: bool = True) -> Path:
        """The checkpoint folder on this machine: itself, or for a URL a copy fetched into this node's cache, every file
        checked against the manifest (with ``reuse``, a copy whose marker matches is taken as it is)."""
        return fetch(checkpoint, self.cache / checkpoint.name, CHECKPOINT, reuse=reuse)

    def verify(self, checkpoint: Location) -> dict[str, Any]:
        """:func:`verify_checkpoint` of a committed checkpoint, wherever it is: a URL's objects are fetched afresh
        (its local copy replaced) and checked; errors name where it is."""
        local = self.local_copy(checkpoint, reuse=False)
        try:
            return verify_checkpoint(local)
        except CheckpointError as exc:
            raise CheckpointError(str(exc).replace(str(local), str(checkpoint))) from None

    def find_resumable(self, before_step: int | None = None) -> tuple[Path | None, list[str]]:
        """The newest checkpoint that verifies (of a step below ``before_step``, when given), as a local folder, and
        a note for each newer one that was skipped."""
        skipped = []
        candidates = self.committed()
        if before_step is not None:
            candidates = [p for p in candidates if step_of(p.name) < before_step]
        for path in reversed(candidates):
            try:
                self.verify(path)
            except CheckpointError as exc:
                skipped.append(str(exc))
                continue
            return self.local_copy(path), skipped
        return None, skipped

    def origin(self, local: Path) -> Location:
        """Where a folder :meth:`find_resumable` returned lives (its URL for a fetched copy), for messages."""
        return self.root / local.name


def write_checkpoint_files(
    tmp: Path,
    step: int,
    weights: Mapping[str, np.ndarray] | None,
    optimizer: Mapping[str, np.ndarray] | None,
    state: Mapping[str, Any],
    extra_files: Mapping[str, bytes],
    *,
    tensors_written: bool = False,
    last_size: Callable[[], int] = lambda: 0,
) -> None:
    """Write checkpoint ``step``'s files into ``tmp`` (the two safetensors files unless the engine wrote its shards,
    ``tensors_written``); a full disk is a :class:`DiskFullError` saying how much was needed and is free."""
    try:
        if not tensors_written:
            write_safetensors(tmp / MODEL_FILE, weights)
            write_safetensors(tmp / OPTIMIZER_FILE, optimizer)
        write_payload(tmp, step, state, extra_files)
    except OSError as exc:
        written = sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file()) if tmp.is_dir() else 0
        shutil.rmtree(tmp, ignore_errors=True)
        if atomic.disk_full(exc):
            need = (sum(a.nbytes for arrays in (weights, optimizer) for a in arrays.values()) if weights is not None
                    else last_size() or written)
            free = shutil.disk_usage(tmp.parent).free
            raise DiskFullError(
                f"no space left on the disk of {tmp.parent} for checkpoint step {step}: it needs about {_mib(need)} "
                f"and {_mib(free)} is free (the write stopped after {_mib(written)}, removed); free space or lower "
                "checkpoint.keep_last; the checkpoints written before are intact") from None
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def save_checkpoint(
    run_dir: str | Path | CheckpointDir,
    step: int,
    weights: Mapping[str, np.ndarray] | None,
    optimizer: Mapping[str, np.ndarray] | None,
    state: Mapping[str, Any],
    retention: Retention = Retention(),
    extra_files: Mapping[str, bytes] | None = None,
    *,
    writer: Callable[[tuple[Path, Path]], None] | None = None,
) -> Location:
    """Write and commit checkpoint ``step`` in this thread (the trainer commits in the background:
    :mod:`.committer`) into a run directory's checkpoints or a :class:`CheckpointDir`.

    ``writer`` (with weights and optimizer None): the engine writes the tensor files itself into the
    two folders it is given (``checkpoint.format: sharded``: :func:`shard_folders` of the temporary
    folder; every rank its shards, all done when it returns); the manifest then lists those files.
    """
    if (writer is None and (weights is None or optimizer is None)) or (
        writer is not None and (weights is not None or optimizer is not None)
    ):
        raise ValueError("save_checkpoint: pass weights and optimizer, or a writer (with both None)")
    directory = run_dir if isinstance(run_dir, CheckpointDir) else CheckpointDir(checkpoints_dir(run_dir))
    tmp = directory.stage(step)
    try:
        if writer is not None:
            writer(shard_folders(tmp))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_checkpoint_files(tmp, step, weights, optimizer, state, extra_files or {}, tensors_written=writer is not None,
                           last_size=lambda: last_checkpoint_size(directory))
    return directory.commit(tmp, step, retention)


def last_checkpoint_size(directory: CheckpointDir) -> int:
    """Bytes of the newest committed checkpoint (what a sharded one needs: the engine writes it), 0 if none."""
    found = directory.committed()
    return (checkpoint_bytes(found[-1]) or 0) if found else 0


def _of_run_dir(run_dir: str | Path) -> CheckpointDir:
    return CheckpointDir(checkpoints_dir(run_dir))


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """A run directory's committed checkpoint folders (on this machine), oldest first."""
    return [Path(str(p)) for p in _of_run_dir(run_dir).committed()]


def find_resumable(run_dir: str | Path, before_step: int | None = None) -> tuple[Path | None, list[str]]:
    """:meth:`CheckpointDir.find_resumable` of a run directory's checkpoints."""
    return _of_run_dir(run_dir).find_resumable(before_step)


def apply_retention(run_dir: str | Path, retention: Retention) -> list[Path]:
    """:meth:`CheckpointDir.apply_retention` of a run directory's checkpoints."""
    return [Path(str(p)) for p in _of_run_dir(run_dir).apply_retention(retention)]


def clean_interrupted(run_dir: str | Path) -> list[str]:
    """:meth:`CheckpointDir.clean_interrupted` of a run directory's checkpoints."""
    return _of_run_dir(run_dir).clean_interrupted()
