"""Checkpoint folders: atomic commit, manifest verification, retention, skipping corrupted ones."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mindfoundry.checkpoint.store import (
    CheckpointError, Retention, find_resumable, list_checkpoints, load_checkpoint, save_checkpoint, verify_checkpoint,
)


def save(run: Path, step: int, keep_last: int = 10) -> Path:
    """A small checkpoint whose weights are a function of the step."""
    rng = np.random.default_rng(step)
    weights = {"embed.weight": rng.standard_normal((8, 4)).astype(np.float32), "norm.weight": np.ones(4, np.float32)}
    optim = {f"exp_avg.{k}": np.zeros_like(v) for k, v in weights.items()}
    return save_checkpoint(run, step, weights, optim, {"consumed_samples": step * 8}, Retention(keep_last=keep_last))


def test_round_trip_and_layout(tmp_path: Path) -> None:
    path = save(tmp_path, 12)
    assert path.name == "step_00000012"
    assert sorted(p.name for p in path.iterdir()) == ["manifest.json", "manifest.sha256", "model.safetensors", "optimizer.safetensors", "trainer_state.json"]
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step_00000012"
    ckpt = load_checkpoint(path)
    assert ckpt.state == {"consumed_samples": 96, "step": 12}
    assert np.array_equal(ckpt.weights["embed.weight"], np.random.default_rng(12).standard_normal((8, 4)).astype(np.float32))
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["files"]["model.safetensors"]["bytes"] == (path / "model.safetensors").stat().st_size


@pytest.mark.parametrize("damage,message", [
    (lambda p: p.write_bytes(p.read_bytes()[:-7]), "size"),
    (lambda p: p.write_bytes(bytes([p.read_bytes()[0] ^ 1]) + p.read_bytes()[1:]), "sha256 does not match"),
    (lambda p: p.unlink(), "missing"),
])
def test_damage_is_named(tmp_path: Path, damage, message: str) -> None:
    path = save(tmp_path, 3)
    damage(path / "model.safetensors")
    with pytest.raises(CheckpointError, match=message) as info:
        load_checkpoint(path)
    assert "model.safetensors" in str(info.value)


def test_resume_skips_damaged_and_uncommitted(tmp_path: Path) -> None:
    save(tmp_path, 3)
    newest = save(tmp_path, 6)
    (newest / "optimizer.safetensors").write_bytes(b"garbage")
    (tmp_path / "checkpoints" / "step_00000009").mkdir()  # a crash before the manifest: not a checkpoint
    path, skipped = find_resumable(tmp_path)
    assert path is not None and path.name == "step_00000003"
    assert len(skipped) == 1 and "optimizer.safetensors" in skipped[0]


def test_retention_keeps_the_newest(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        save(tmp_path, step, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000003", "step_00000004"]
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


def test_uncommitted_folder_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "step_00000001").mkdir()
    with pytest.raises(CheckpointError, match="never committed"):
        verify_checkpoint(tmp_path / "step_00000001")
