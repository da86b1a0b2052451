"""One step checkpoint as a folder of safetensors + JSON: writing its files, and verifying them.

Layout (documented in docs/checkpoints.md)::

    CKPT/step_00000300/
        model.safetensors        weights under the shared parameter names
        optimizer.safetensors    AdamW moments exp_avg.NAME / exp_avg_sq.NAME (kept apart from weights)
        trainer_state.json       step, data position, schedule, loss scale, config hash, versions, ...
        data_manifest.json       the prepared data's manifest (provenance travels with the weights)
        config.yaml, tokenizer.json  the run's resolved config and tokenizer: the folder is enough to evaluate,
                                 generate or export (wherever it was copied to, a bucket included)
        manifest.json            sha256 and size of every file above
        manifest.sha256          sha256 of manifest.json itself; written last = the commit marker

With ``checkpoint.format: sharded`` the engine writes the tensors itself, each rank only its shards
(:func:`shard_folders`): ``model/`` and ``optimizer/`` folders of safetensors shard files
(torch.distributed.checkpoint's, or MindSpore semi-auto's rank slices with their strategy
file, :mod:`.rank_slices`) replace the two safetensors files; the rest, the
manifest (listing every shard file) and the commit are the same. This module never imports an engine: the engine is
handed the folders to write; reading any form is :mod:`.reader`'s, and a run's set of checkpoints (where they are
committed, which survive, which to resume from) is :mod:`.directory`'s.

A folder counts as a checkpoint only when its manifest and the manifest's checksum exist and every
file matches. No pickle anywhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import save_file

from mindfoundry.checkpoint.safetensors_check import SafetensorsHeaderError, check_safetensors
from mindfoundry.errors import MindFoundryError
from mindfoundry.storage.commit import sha256_file
from mindfoundry.storage.location import Location, Seal

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "trainer_state.json"
MANIFEST_FILE = "manifest.json"
MANIFEST_SUM = "manifest.sha256"
LATEST_FILE = "latest"
BEST_FILE = "best"
MODEL_DIR = "model"  # sharded format: the weights' shard files (one per writing rank) ...
OPTIMIZER_DIR = "optimizer"  # ... and the AdamW moments' (exp_avg.NAME / exp_avg_sq.NAME)
STEP_DIR = re.compile(r"^step_(\d{8})$")


class CheckpointError(MindFoundryError, RuntimeError):
    """A checkpoint is missing, incomplete or corrupted; the message names the file and the problem."""


@dataclass
class Checkpoint:
    path: Path
    weights: dict[str, np.ndarray]
    optimizer: dict[str, np.ndarray]
    state: dict[str, Any]


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


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


def write_payload(tmp: Path, step: int, state: Mapping[str, Any], extra_files: Mapping[str, bytes]) -> None:
    """Complete the checkpoint folder ``tmp`` whose tensor files are written: the trainer state, ``extra_files``, every
    file listed in the manifest, and the manifest's checksum last. Durability is the commit's: a local folder is
    fsynced whole when it is published (:func:`mindfoundry.atomic.publish_folder`), a URL's objects are uploaded."""
    _write_json(tmp / STATE_FILE, dict(state, step=step))
    for name, blob in extra_files.items():
        (tmp / name).write_bytes(blob)
    files = {}
    for f in _payload_files(tmp):  # whoever wrote them (this process or, sharded, every rank): listed here
        files[f.relative_to(tmp).as_posix()] = {"sha256": sha256_file(f), "bytes": f.stat().st_size}
    _write_json(tmp / MANIFEST_FILE, {"step": step, "files": files})
    (tmp / MANIFEST_SUM).write_text(sha256_file(tmp / MANIFEST_FILE) + "\n", encoding="utf-8")


def step_of(name: str) -> int:
    """The step of a checkpoint folder named ``step_N``."""
    return int(name.split("_")[1])


def checkpoint_eval(state: Mapping[str, Any]) -> float | None:
    """The validation loss measured at this checkpoint's own step, or None when no evaluation ran at it.

    trainer_state.json carries the run's latest `val_loss` along (a resumed run needs it) and `val_step`, the step
    it was measured at; a checkpoint between two evaluations holds an older step's loss, which says nothing
    about its own weights. Checkpoints without `val_step` (release 0.1.0) count as not evaluated."""
    loss, at = state.get("val_loss"), state.get("val_step")
    return float(loss) if loss is not None and at is not None and at == state.get("step") else None


def read_state(path: Path | Location) -> dict[str, Any]:
    """A checkpoint folder's trainer_state.json (a local folder or a URL), or {} when it is missing or unreadable
    (verification names why)."""
    try:
        state = json.loads((path / STATE_FILE).read_bytes())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def checkpoint_bytes(path: Location) -> int | None:
    """A checkpoint's size (sharded: its shard folders too) as its manifest lists it; None when it cannot be read."""
    try:
        manifest = json.loads((path / MANIFEST_FILE).read_bytes())
        return sum(int(meta["bytes"]) for meta in manifest["files"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


class CheckpointSeal(Seal):
    """How a checkpoint is committed (:mod:`mindfoundry.storage.commit`): ``manifest.json`` lists every file with
    its sha256, ``manifest.sha256`` -- the marker, written last -- seals the manifest."""

    marker = MANIFEST_SUM
    listing_name = "the manifest"

    def write(self, folder: Path) -> None:
        return None  # write_payload wrote the manifest and its checksum

    def listing(self, folder: Location) -> tuple[dict[str, dict[str, Any]], bytes]:
        try:
            raw, manifest = (folder / MANIFEST_SUM).read_bytes(), (folder / MANIFEST_FILE).read_bytes()
        except FileNotFoundError:
            raise CheckpointError(f"{folder}: no {MANIFEST_FILE}/{MANIFEST_SUM}; the checkpoint was never committed "
                                  "(interrupted write)") from None
        expected = raw.decode("utf-8", errors="replace").strip()
        if hashlib.sha256(manifest).hexdigest() != expected:
            raise CheckpointError(f"{folder / MANIFEST_FILE}: does not match {MANIFEST_SUM} (manifest or checksum "
                                  "corrupted)")
        try:
            files = json.loads(manifest)["files"]
            if not isinstance(files, dict):
                raise TypeError("'files' is not a mapping")
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{folder / MANIFEST_FILE}: unreadable manifest ({exc})") from None
        return {**files, MANIFEST_FILE: {"sha256": expected, "bytes": len(manifest)}}, raw

    def error(self, message: str) -> Exception:
        return CheckpointError(message)


#: The seal of every checkpoint folder.
CHECKPOINT = CheckpointSeal()


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
    named = STEP_DIR.match(path.name)
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


