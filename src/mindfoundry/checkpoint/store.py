"""Step checkpoints as folders of safetensors + JSON, committed atomically and verified on load.

Layout (documented in docs/checkpoints.md)::

    RUN/checkpoints/step_00000300/
        model.safetensors        weights under the shared parameter names
        optimizer.safetensors    AdamW moments exp_avg.NAME / exp_avg_sq.NAME (kept apart from weights)
        trainer_state.json       step, data position, config hash, versions, ...
        manifest.json            sha256 and size of every file above; written last
    RUN/checkpoints/latest       name of the newest committed checkpoint

A folder counts as a checkpoint only when its manifest exists and every file matches it. Writes go
to a hidden temporary folder which is fsynced and renamed into place, so a crash mid-write never
leaves a folder that looks complete. No pickle anywhere: a checkpoint from elsewhere is safe to load.
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


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    weights: Mapping[str, np.ndarray],
    optimizer: Mapping[str, np.ndarray],
    state: Mapping[str, Any],
    keep_last: int,
) -> Path:
    """Write and atomically commit checkpoint `step`, update `latest`, apply retention."""
    root = checkpoints_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_file({k: np.ascontiguousarray(v) for k, v in weights.items()}, str(tmp / MODEL_FILE), metadata={"format": "mindfoundry"})
    save_file({k: np.ascontiguousarray(v) for k, v in optimizer.items()}, str(tmp / OPTIMIZER_FILE), metadata={"format": "mindfoundry"})
    _write_json(tmp / STATE_FILE, dict(state, step=step))
    files = {}
    for name in (MODEL_FILE, OPTIMIZER_FILE, STATE_FILE):
        _fsync(tmp / name)
        files[name] = {"sha256": sha256_file(tmp / name), "bytes": (tmp / name).stat().st_size}
    _write_json(tmp / MANIFEST_FILE, {"step": step, "files": files})
    _fsync(tmp / MANIFEST_FILE)
    if final.exists():  # a re-run of the same step (e.g. after a rollback): the new one wins
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync(root)
    _point_latest(root, final.name)
    _retain(root, keep_last)
    return final


def _point_latest(root: Path, name: str) -> None:
    tmp = root / f".{LATEST_FILE}.tmp"
    tmp.write_text(name + "\n", encoding="utf-8")
    os.replace(tmp, root / LATEST_FILE)


def _retain(root: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` committed checkpoints (the newest is never deleted)."""
    for old in list_checkpoints(root.parent)[:-max(keep_last, 1)]:
        shutil.rmtree(old, ignore_errors=True)


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Committed checkpoint folders (manifest present), oldest first."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP_DIR.match(p.name) and (p / MANIFEST_FILE).is_file()]
    return sorted(found, key=lambda p: p.name)


def verify_checkpoint(path: str | Path) -> dict[str, Any]:
    """Check every file against the manifest; return the manifest or raise CheckpointError."""
    path = Path(path)
    manifest_path = path / MANIFEST_FILE
    if not manifest_path.is_file():
        raise CheckpointError(f"{path}: no {MANIFEST_FILE}; the checkpoint was never committed (interrupted write)")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        files = manifest["files"]
    except (json.JSONDecodeError, KeyError, UnicodeDecodeError) as exc:
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


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Verify, then read a checkpoint folder."""
    path = Path(path)
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
