"""Checkpoint folders: atomic commit, manifest verification, retention, skipping corrupted ones."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mindfoundry.checkpoint.store import (
    CheckpointError, Retention, apply_retention, find_resumable, list_checkpoints, load_checkpoint, save_checkpoint, verify_checkpoint,
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
    (tmp_path / "checkpoints" / "step_00000009").mkdir()  # e.g. a manifest deleted by hand
    (tmp_path / "checkpoints" / ".tmp-step_00000012-77").mkdir()  # a crash mid-write: never a candidate
    path, skipped = find_resumable(tmp_path)
    assert path is not None and path.name == "step_00000003"
    assert len(skipped) == 2 and "never committed" in skipped[0] and "optimizer.safetensors" in skipped[1]


def test_retention_keeps_the_newest(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        save(tmp_path, step, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000003", "step_00000004"]
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


def test_uncommitted_folder_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "step_00000001").mkdir()
    with pytest.raises(CheckpointError, match="never committed"):
        verify_checkpoint(tmp_path / "step_00000001")


FILES = ["model.safetensors", "optimizer.safetensors", "trainer_state.json", "data_manifest.json", "manifest.json", "manifest.sha256"]


def test_fifty_random_corruptions_are_all_detected(tmp_path: Path) -> None:
    """Truncations, byte flips and deletions anywhere in the newest checkpoint: every one is caught,
    and auto-resume falls back to the previous valid checkpoint."""
    rng = np.random.default_rng(2026)
    kinds = {"truncate": 0, "flip": 0, "delete": 0}
    for trial in range(50):
        run = tmp_path / f"r{trial}"
        weights = {"w": rng.standard_normal((16, 8)).astype(np.float32)}
        extra = {"data_manifest.json": b'{"sources": []}\n'}
        save_checkpoint(run, 1, weights, {"exp_avg.w": weights["w"] * 0}, {"consumed_samples": 8}, extra_files=extra)
        newest = save_checkpoint(run, 2, weights, {"exp_avg.w": weights["w"]}, {"consumed_samples": 16}, extra_files=extra)
        target = newest / FILES[rng.integers(len(FILES))]
        kind = ["truncate", "flip", "delete"][rng.integers(3)]
        kinds[kind] += 1
        data = target.read_bytes()
        if kind == "truncate":
            target.write_bytes(data[: rng.integers(len(data))])
        elif kind == "flip":
            pos = rng.integers(len(data))
            target.write_bytes(data[:pos] + bytes([data[pos] ^ (1 << int(rng.integers(8)))]) + data[pos + 1:])
        else:
            target.unlink()
        with pytest.raises(CheckpointError):
            load_checkpoint(newest)
        path, skipped = find_resumable(run)
        assert path is not None and path.name == "step_00000001" and len(skipped) == 1
    assert min(kinds.values()) >= 10  # each kind of damage well represented


@pytest.mark.parametrize("keep_last,keep_every,keep_best,expected", [
    (1, 0, False, [6]),
    (2, 0, False, [5, 6]),
    (1, 3, False, [3, 6]),
    (1, 0, True, [2, 6]),  # step 2 has the lowest validation loss
    (2, 2, True, [2, 4, 5, 6]),
])
def test_retention_rules(tmp_path: Path, keep_last: int, keep_every: int, keep_best: bool, expected: list[int]) -> None:
    val = {1: 3.0, 2: 1.0, 3: 2.5, 4: 2.0, 5: 1.5, 6: 1.2}
    for step in range(1, 7):
        save_checkpoint(tmp_path, step, {"w": np.zeros(2, np.float32)}, {}, {"val_loss": val[step]},
                        Retention(keep_last, keep_every, keep_best))
    assert [int(p.name[5:]) for p in list_checkpoints(tmp_path)] == expected


def test_retention_never_leaves_zero_checkpoints(tmp_path: Path) -> None:
    save(tmp_path, 1)
    assert apply_retention(tmp_path, Retention(keep_last=0)) == []  # even a zero K keeps the newest
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000001"]
