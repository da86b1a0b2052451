"""Step checkpoints as folders of safetensors + JSON, committed atomically and verified on load.

Layout (documented in docs/checkpoints.md)::

    RUN/checkpoints/step_00000300/
        model.safetensors        weights under the shared parameter names
        optimizer.safetensors    AdamW moments exp_avg.NAME / exp_avg_sq.NAME (kept apart from weights)
        trainer_state.json       step, data position, schedule, loss scale, config hash, versions, ...
        data_manifest.json       the prepared data's manifest (provenance travels with the weights)
        manifest.json            sha256 and size of every file above
        manifest.sha256          sha256 of manifest.json itself; written last = the commit marker
    RUN/checkpoints/latest       name of the newest committed checkpoint
    RUN/checkpoints/best         name of the checkpoint with the lowest validation loss measured at its own step

With ``checkpoint.format: sharded`` the engine writes the tensors itself, each rank only its shards
(see :func:`save_checkpoint`'s ``writer``): ``model/`` and ``optimizer/`` folders of safetensors
shard files (torch.distributed.checkpoint's, or MindSpore semi-auto's rank slices with their strategy
file, :mod:`.rank_slices`) replace the two safetensors files; the rest, the
manifest (listing every shard file) and the commit are the same. This module names the folders
(:func:`shard_folders`), writes and verifies, and never imports an engine: the engine is handed the folders to
write; reading any form is :mod:`.reader`'s.

A folder counts as a checkpoint only when its manifest and the manifest's checksum exist and every
file matches. Writes go to a hidden temporary folder which is fsynced and renamed into place, so a
crash mid-write never leaves a folder that looks complete. No pickle anywhere.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import save_file

from mindfoundry import atomic
from mindfoundry.checkpoint.safetensors_check import SafetensorsHeaderError, check_safetensors
from mindfoundry.errors import MindFoundryError

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "trainer_state.json"
MANIFEST_FILE = "manifest.json"
MANIFEST_SUM = "manifest.sha256"
LATEST_FILE = "latest"
BEST_FILE = "best"
MODEL_DIR = "model"  # sharded format: the weights' shard files (one per writing rank) ...
OPTIMIZER_DIR = "optimizer"  # ... and the AdamW moments' (exp_avg.NAME / exp_avg_sq.NAME)
_STEP_DIR = re.compile(r"^step_(\d{8})$")
DELETING = ".deleting-"  # prefix of a checkpoint folder retention is deleting


class CheckpointError(MindFoundryError, RuntimeError):
    """A checkpoint is missing, incomplete or corrupted; the message names the file and the problem."""


@dataclass
class Checkpoint:
    path: Path
    weights: dict[str, np.ndarray]
    optimizer: dict[str, np.ndarray]
    state: dict[str, Any]


@dataclass(frozen=True)
class Retention:
    """Which committed checkpoints survive a save.

    keep_last newest ones; every checkpoint whose step is a multiple of keep_every (0 = none); and,
    with keep_best, the one with the lowest validation loss measured at its own step (:func:`checkpoint_eval`).
    """

    keep_last: int = 3
    keep_every: int = 0
    keep_best: bool = False


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def written_files(path: Path) -> list[Path]:
    """`path` itself when it is a file, else every file under it, sorted."""
    return [path] if path.is_file() else sorted(f for f in path.rglob("*") if f.is_file())


def publish_mode(path: Path) -> None:
    """Give `path` (a file, or every file under a folder) the mode a plain ``open()`` would: 0666 less the umask.

    Writers differ (safetensors creates 0600, MindSpore's save_checkpoint 0400, torch.save 0644); files
    our users hand to their own tools, or share on a cluster, should not depend on which one wrote them."""
    mask = os.umask(0)
    os.umask(mask)
    for file in written_files(path):
        file.chmod(0o666 & ~mask)


def write_safetensors(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """One safetensors file as the checkpoints hold it (also `mindfoundry convert STEP out.safetensors`).

    safetensors reports a failed write as SafetensorError; an OS error inside it is raised as the
    OSError it is, so that a full disk is told as one (see :class:`DiskFullError`)."""
    try:
        save_file(
            {k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(path), metadata={"format": "mindfoundry"}
        )
        publish_mode(path)
    except SafetensorError as exc:
        code = re.search(r"os error (\d+)", str(exc))
        if code:
            raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(path)) from None
        raise


def _payload_files(tmp: Path) -> list[Path]:
    """Every file under the temporary folder (shard files in sub-folders too), in a fixed order."""
    return sorted((p for p in tmp.rglob("*") if p.is_file()), key=lambda p: p.relative_to(tmp).as_posix())


def _write_payload(
    tmp: Path, step: int, write_tensors: Callable[[Path], None], state, extra_files: Mapping[str, bytes]
) -> None:
    write_tensors(tmp)
    _write_json(tmp / STATE_FILE, dict(state, step=step))
    for name, blob in extra_files.items():
        (tmp / name).write_bytes(blob)
    files = {}
    for f in _payload_files(tmp):  # whoever wrote them (this process or, sharded, every rank): fsynced and listed here
        atomic.fsync_path(f)
        files[f.relative_to(tmp).as_posix()] = {"sha256": sha256_file(f), "bytes": f.stat().st_size}
    for sub in (d for d in tmp.rglob("*") if d.is_dir()):
        atomic.fsync_path(sub)
    _write_json(tmp / MANIFEST_FILE, {"step": step, "files": files})
    atomic.fsync_path(tmp / MANIFEST_FILE)
    (tmp / MANIFEST_SUM).write_text(sha256_file(tmp / MANIFEST_FILE) + "\n", encoding="utf-8")
    atomic.fsync_path(tmp / MANIFEST_SUM)


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    weights: Mapping[str, np.ndarray] | None,
    optimizer: Mapping[str, np.ndarray] | None,
    state: Mapping[str, Any],
    retention: Retention = Retention(),
    extra_files: Mapping[str, bytes] | None = None,
    *,
    writer: Callable[[tuple[Path, Path]], None] | None = None,
) -> Path:
    """Write and atomically commit checkpoint `step`, verify it, update `latest`, apply retention.

    Older checkpoints are deleted only after the new one has verified, so a failing disk never
    leaves the run without a valid checkpoint.

    `writer` (with weights and optimizer None): the engine writes the tensor files itself into the
    two folders it is given (``checkpoint.format: sharded``: :func:`shard_folders` of the temporary
    folder; every rank its shards, all done when it returns); the manifest then lists those files.
    """
    if (writer is None and (weights is None or optimizer is None)) or (
        writer is not None and (weights is not None or optimizer is not None)
    ):
        raise ValueError("save_checkpoint: pass weights and optimizer, or a writer (with both None)")

    def write_tensors(tmp: Path) -> None:
        if writer is not None:
            writer(shard_folders(tmp))
        else:
            write_safetensors(tmp / MODEL_FILE, weights)
            write_safetensors(tmp / OPTIMIZER_FILE, optimizer)

    root = checkpoints_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        _write_payload(tmp, step, write_tensors, state, extra_files or {})
    except OSError as exc:
        written = sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file()) if tmp.is_dir() else 0
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _disk_full(root, step, weights, optimizer, written) from None
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replaced = None
    if final.exists():  # the same step again (e.g. after a rollback): keep the old one until the swap
        replaced = root / f".old-{final.name}-{os.getpid()}"
        os.replace(final, replaced)
    atomic.publish_folder(tmp, final)
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)
    verify_checkpoint(final)
    _point(root, LATEST_FILE, final.name)
    apply_retention(run_dir, retention)
    _point(root, BEST_FILE, _best_of(list_checkpoints(run_dir)))
    return final


class DiskFullError(CheckpointError):
    """The checkpoint did not fit on its disk; the ones written before are intact."""


def _disk_full(root: Path, step: int, weights, optimizer, written: int) -> DiskFullError:
    """One line: how much the checkpoint needs, how much is free, what to do."""
    if weights is not None:
        need = sum(a.nbytes for arrays in (weights, optimizer) for a in arrays.values())
    else:  # sharded: the engine writes; the last committed checkpoint's size is the best estimate
        last = list_checkpoints(root.parent)
        need = sum(f.stat().st_size for f in last[-1].rglob("*") if f.is_file()) if last else written
    free = shutil.disk_usage(root).free
    return DiskFullError(f"no space left on the disk of {root} for checkpoint step {step}: it needs about "
                         f"{_mib(need)} and {_mib(free)} is free (the write stopped after {_mib(written)}, removed); "
                         f"free space or lower checkpoint.keep_last; the checkpoints written before are intact")


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _point(root: Path, pointer: str, name: str | None) -> None:
    """Point `latest` or `best` at checkpoint folder `name` by an atomic rename (None: remove the pointer)."""
    if name is None:
        (root / pointer).unlink(missing_ok=True)
        return
    atomic.write_text(root / pointer, name + "\n")


def _step_of(path: Path) -> int:
    return int(path.name.split("_")[1])


def checkpoint_eval(state: Mapping[str, Any]) -> float | None:
    """The validation loss measured at this checkpoint's own step, or None when no evaluation ran at it.

    trainer_state.json carries the run's latest `val_loss` along (a resumed run needs it) and `val_step`, the step
    it was measured at; a checkpoint between two evaluations holds an older step's loss, which says nothing
    about its own weights. Checkpoints without `val_step` (release 0.1.0) count as not evaluated."""
    loss, at = state.get("val_loss"), state.get("val_step")
    return float(loss) if loss is not None and at is not None and at == state.get("step") else None


def read_state(path: Path) -> dict[str, Any]:
    """A checkpoint folder's trainer_state.json, or {} when it is missing or unreadable (verification names why)."""
    try:
        state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return state if isinstance(state, dict) else {}


def _best_of(found: list[Path]) -> str | None:
    """The folder name of the checkpoint with the lowest own validation loss (the earliest of equals), or None."""
    scored = [(loss, _step_of(p), p.name) for p in found if (loss := checkpoint_eval(read_state(p))) is not None]
    return min(scored)[2] if scored else None


def apply_retention(run_dir: str | Path, retention: Retention) -> list[Path]:
    """Delete committed checkpoints that no rule keeps; return the deleted folders.

    The newest committed checkpoint is always kept (keep_last is at least 1), so retention can
    never leave zero checkpoints.
    """
    found = list_checkpoints(run_dir)
    keep = set(found[-max(retention.keep_last, 1):])
    if retention.keep_every:
        keep |= {p for p in found if _step_of(p) % retention.keep_every == 0}
    if retention.keep_best and (best := _best_of(found)) is not None:
        keep.add(checkpoints_dir(run_dir) / best)
    deleted = [p for p in found if p not in keep]
    for path in deleted:
        doomed = path.with_name(f"{DELETING}{path.name}-{os.getpid()}")
        os.replace(path, doomed)  # atomic: a kill during the delete leaves a hidden folder, never half a step_N
        shutil.rmtree(doomed, ignore_errors=True)
    return deleted


def clean_interrupted(run_dir: str | Path) -> list[Path]:
    """Remove the leftovers of killed writers: temporary (``.tmp-``), replaced (``.old-``) and half-deleted
    (``.deleting-``) checkpoint folders; return them. Run at start-up under the run lock, so no live
    writer owns them; none was ever counted as a checkpoint."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    leftovers = sorted(
        p for p in root.iterdir() if p.is_dir() and p.name.startswith((".tmp-step_", ".old-step_", DELETING))
    )
    for path in leftovers:
        shutil.rmtree(path, ignore_errors=True)
    return leftovers


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Checkpoint folders, oldest first.

    A `step_N` folder only ever appears by renaming a complete temporary folder, so each one was
    committed; whether it is still intact is for :func:`verify_checkpoint` to say.
    """
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP_DIR.match(p.name) and p.is_dir()]
    return sorted(found, key=lambda p: p.name)


def verify_checkpoint(path: str | Path) -> dict[str, Any]:
    """Check the manifest's checksum and every file against the manifest; return the manifest."""
    path = Path(path)
    manifest_path, sum_path = path / MANIFEST_FILE, path / MANIFEST_SUM
    if not manifest_path.is_file() or not sum_path.is_file():
        raise CheckpointError(
            f"{path}: no {MANIFEST_FILE}/{MANIFEST_SUM}; the checkpoint was never committed (interrupted write)"
        )
    expected = sum_path.read_text(encoding="utf-8", errors="replace").strip()
    if sha256_file(manifest_path) != expected:
        raise CheckpointError(f"{manifest_path}: does not match {MANIFEST_SUM} (manifest or checksum corrupted)")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        files = manifest["files"]
    except (json.JSONDecodeError, KeyError, UnicodeDecodeError, TypeError) as exc:
        raise CheckpointError(f"{manifest_path}: unreadable manifest ({exc})") from None
    inside = path.resolve()
    for name, meta in files.items():
        f = path / name
        if (
            Path(name).is_absolute()
            or ".." in Path(name).parts
            or f.is_symlink()
            or not f.resolve().is_relative_to(inside)
        ):
            raise CheckpointError(
                f"{f}: not a regular file inside the checkpoint folder (a symlink, or a path out of it): "
                f"checkpoint files are never links; the checkpoint was tampered with"
            )
        if not f.is_file():
            raise CheckpointError(f"{f}: file listed in the manifest is missing")
        size = f.stat().st_size
        if size != meta["bytes"]:
            raise CheckpointError(f"{f}: size {size} bytes, manifest says {meta['bytes']} (truncated or replaced)")
        if sha256_file(f) != meta["sha256"]:
            raise CheckpointError(f"{f}: sha256 does not match the manifest (corrupted)")
        if f.suffix == ".safetensors":
            try:
                check_safetensors(f)  # sealed is not sound: a resealed lying header passes the hash
            except SafetensorsHeaderError as exc:
                raise CheckpointError(f"{exc}: the file is damaged or was tampered with") from None
    _check_steps(path, manifest)
    return manifest


def _check_steps(path: Path, manifest: Mapping[str, Any]) -> None:
    """The folder's name, its manifest and its trainer state name one step: a folder holding another step's
    files (copied or renamed by hand) would resume from the wrong place without a word."""
    state_step = None
    try:
        state_step = json.loads((path / STATE_FILE).read_text(encoding="utf-8")).get("step")
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        pass
    named = _STEP_DIR.match(path.name)
    steps = {
        "folder": int(named.group(1)) if named else manifest.get("step"),
        "manifest": manifest.get("step"),
        "trainer_state": state_step,
    }
    if len(set(steps.values())) != 1:
        listed = ", ".join(f"{k} {v}" for k, v in steps.items())
        raise CheckpointError(f"{path}: its steps disagree ({listed}): files of another checkpoint were put here; "
                              f"resume from another checkpoint or restore this one's files")


def shard_folders(path: str | Path) -> tuple[Path, Path]:
    """The weights' and the AdamW moments' shard folders of a sharded checkpoint folder `path`."""
    return Path(path) / MODEL_DIR, Path(path) / OPTIMIZER_DIR


def is_sharded(path: str | Path) -> bool:
    """Whether checkpoint folder `path` holds shard folders (checkpoint.format: sharded) instead of the two files."""
    return (Path(path) / MODEL_DIR).is_dir()


def find_resumable(run_dir: str | Path, before_step: int | None = None) -> tuple[Path | None, list[str]]:
    """The newest checkpoint that verifies (of a step below `before_step`, when given), and a note
    for each newer one that was skipped."""
    skipped = []
    candidates = list_checkpoints(run_dir)
    if before_step is not None:
        candidates = [p for p in candidates if int(_STEP_DIR.match(p.name).group(1)) < before_step]
    for path in reversed(candidates):
        try:
            verify_checkpoint(path)
        except CheckpointError as exc:
            skipped.append(str(exc))
            continue
        return path, skipped
    return None, skipped
