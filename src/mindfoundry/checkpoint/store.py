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

A folder counts as a checkpoint only when its manifest and the manifest's checksum exist and every
file matches. Writes go to a hidden temporary folder which is fsynced and renamed into place, so a
crash mid-write never leaves a folder that looks complete. No pickle anywhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "trainer_state.json"
MANIFEST_FILE = "manifest.json"
MANIFEST_SUM = "manifest.sha256"
LATEST_FILE = "latest"
_STEP_DIR = re.compile(r"^step_(\d{8})$")


class CheckpointError(RuntimeError):
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
    with keep_best, the one with the lowest validation loss recorded in its trainer state.
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


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _write_payload(tmp: Path, step: int, weights, optimizer, state, extra_files: Mapping[str, bytes]) -> None:
    save_file({k: np.ascontiguousarray(v) for k, v in weights.items()}, str(tmp / MODEL_FILE), metadata={"format": "mindfoundry"})
    save_file({k: np.ascontiguousarray(v) for k, v in optimizer.items()}, str(tmp / OPTIMIZER_FILE), metadata={"format": "mindfoundry"})
    _write_json(tmp / STATE_FILE, dict(state, step=step))
    for name, blob in extra_files.items():
        (tmp / name).write_bytes(blob)
    files = {}
    for name in (MODEL_FILE, OPTIMIZER_FILE, STATE_FILE, *extra_files):
        _fsync(tmp / name)
        files[name] = {"sha256": sha256_file(tmp / name), "bytes": (tmp / name).stat().st_size}
    _write_json(tmp / MANIFEST_FILE, {"step": step, "files": files})
    _fsync(tmp / MANIFEST_FILE)
    (tmp / MANIFEST_SUM).write_text(sha256_file(tmp / MANIFEST_FILE) + "\n", encoding="utf-8")
    _fsync(tmp / MANIFEST_SUM)


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    weights: Mapping[str, np.ndarray],
    optimizer: Mapping[str, np.ndarray],
    state: Mapping[str, Any],
    retention: Retention = Retention(),
    extra_files: Mapping[str, bytes] | None = None,
) -> Path:
    """Write and atomically commit checkpoint `step`, verify it, update `latest`, apply retention.

    Older checkpoints are deleted only after the new one has verified, so a failing disk never
    leaves the run without a valid checkpoint.
    """
    root = checkpoints_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        _write_payload(tmp, step, weights, optimizer, state, extra_files or {})
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replaced = None
    if final.exists():  # the same step again (e.g. after a rollback): keep the old one until the swap
        replaced = root / f".old-{final.name}-{os.getpid()}"
        os.replace(final, replaced)
    os.replace(tmp, final)
    _fsync(root)
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)
    verify_checkpoint(final)
    _point_latest(root, final.name)
    apply_retention(run_dir, retention)
    return final


def _point_latest(root: Path, name: str) -> None:
    tmp = root / f".{LATEST_FILE}.tmp"
    tmp.write_text(name + "\n", encoding="utf-8")
    os.replace(tmp, root / LATEST_FILE)


def _step_of(path: Path) -> int:
    return int(path.name.split("_")[1])


def _val_loss(path: Path) -> float | None:
    try:
        value = json.loads((path / STATE_FILE).read_text(encoding="utf-8")).get("val_loss")
    except (OSError, json.JSONDecodeError):
        return None
    return float(value) if value is not None else None


def apply_retention(run_dir: str | Path, retention: Retention) -> list[Path]:
    """Delete committed checkpoints that no rule keeps; return the deleted folders.

    The newest committed checkpoint is always kept (keep_last is at least 1), so retention can
    never leave zero checkpoints.
    """
    found = list_checkpoints(run_dir)
    keep = set(found[-max(retention.keep_last, 1):])
    if retention.keep_every:
        keep |= {p for p in found if _step_of(p) % retention.keep_every == 0}
    if retention.keep_best:
        scored = [(loss, p) for p in found if (loss := _val_loss(p)) is not None]
        if scored:
            keep.add(min(scored, key=lambda t: t[0])[1])
    deleted = [p for p in found if p not in keep]
    for path in deleted:
        shutil.rmtree(path, ignore_errors=True)
    return deleted


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
        raise CheckpointError(f"{path}: no {MANIFEST_FILE}/{MANIFEST_SUM}; the checkpoint was never committed (interrupted write)")
    expected = sum_path.read_text(encoding="utf-8", errors="replace").strip()
    if sha256_file(manifest_path) != expected:
        raise CheckpointError(f"{manifest_path}: does not match {MANIFEST_SUM} (manifest or checksum corrupted)")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        files = manifest["files"]
    except (json.JSONDecodeError, KeyError, UnicodeDecodeError, TypeError) as exc:
        raise CheckpointError(f"{manifest_path}: unreadable manifest ({exc})") from None
    for name, meta in files.items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"{f}: file listed in the manifest is missing")
        size = f.stat().st_size
        if size != meta["bytes"]:
            raise CheckpointError(f"{f}: size {size} bytes, manifest says {meta['bytes']} (truncated or replaced)")
        if sha256_file(f) != meta["sha256"]:
            raise CheckpointError(f"{f}: sha256 does not match the manifest (corrupted)")
    return manifest


def load_checkpoint(path: str | Path, *, verify: bool = True) -> Checkpoint:
    """Verify (unless the caller just did, e.g. through find_resumable), then read a checkpoint folder."""
    path = Path(path)
    if verify:
        verify_checkpoint(path)
    try:
        weights = load_file(str(path / MODEL_FILE))
        optimizer = load_file(str(path / OPTIMIZER_FILE))
    except SafetensorError as exc:
        raise CheckpointError(f"{path}: unreadable safetensors ({exc})") from None
    state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
    return Checkpoint(path=path, weights=weights, optimizer=optimizer, state=state)


def find_resumable(run_dir: str | Path) -> tuple[Path | None, list[str]]:
    """The newest checkpoint that verifies, and a note for each newer one that was skipped."""
    skipped = []
    for path in reversed(list_checkpoints(run_dir)):
        try:
            verify_checkpoint(path)
        except CheckpointError as exc:
            skipped.append(str(exc))
            continue
        return path, skipped
    return None, skipped
