"""Checkpoint folders: atomic commit, manifest verification, retention, skipping corrupted ones."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mindfoundry.checkpoint.directory import (
    Retention,
    apply_retention,
    find_resumable,
    list_checkpoints,
    save_checkpoint,
)
from mindfoundry.checkpoint.reader import load_checkpoint
from mindfoundry.checkpoint.store import CheckpointError, checkpoint_eval, verify_checkpoint


def save(run: Path, step: int, keep_last: int = 10) -> Path:
    """A small checkpoint whose weights are a function of the step."""
    rng = np.random.default_rng(step)
    weights = {"embed.weight": rng.standard_normal((8, 4)).astype(np.float32), "norm.weight": np.ones(4, np.float32)}
    optim = {f"exp_avg.{k}": np.zeros_like(v) for k, v in weights.items()}
    state = {"consumed_samples": step * 8}
    return Path(save_checkpoint(run, step, weights, optim, state, Retention(keep_last=keep_last)))


def test_round_trip_and_layout(tmp_path: Path) -> None:
    path = save(tmp_path, 12)
    assert path.name == "step_00000012"
    assert sorted(p.name for p in path.iterdir()) == [
        "manifest.json",
        "manifest.sha256",
        "model.safetensors",
        "optimizer.safetensors",
        "trainer_state.json",
    ]
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step_00000012"
    ckpt = load_checkpoint(path)
    assert ckpt.state == {"consumed_samples": 96, "step": 12}
    assert np.array_equal(
        ckpt.weights["embed.weight"], np.random.default_rng(12).standard_normal((8, 4)).astype(np.float32)
    )
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
    (tmp_path / "checkpoints" / "step_00000009").mkdir()  # e.g. a manifest deleted by hand: the rest is there
    (tmp_path / "checkpoints" / "step_00000009" / "model.safetensors").write_bytes(b"weights")
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


FILES = [
    "model.safetensors",
    "optimizer.safetensors",
    "trainer_state.json",
    "data_manifest.json",
    "manifest.json",
    "manifest.sha256",
]


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
        newest = Path(save_checkpoint(
            run, 2, weights, {"exp_avg.w": weights["w"]}, {"consumed_samples": 16}, extra_files=extra
        ))
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
        save_checkpoint(tmp_path, step, {"w": np.zeros(2, np.float32)}, {}, {"val_loss": val[step], "val_step": step},
                        Retention(keep_last, keep_every, keep_best))
    assert [int(p.name[5:]) for p in list_checkpoints(tmp_path)] == expected


def save_evaluated(run: Path, step: int, val_loss: float | None, val_step: int | None, retention: Retention) -> None:
    """A checkpoint whose trainer state carries the run's latest validation loss, measured at `val_step`."""
    save_checkpoint(
        run, step, {"w": np.full(2, step, np.float32)}, {}, {"val_loss": val_loss, "val_step": val_step}, retention
    )


def pointer(run: Path, name: str) -> str | None:
    path = run / "checkpoints" / name
    return path.read_text().strip() if path.exists() else None


@pytest.mark.parametrize("keep_best", [False, True])
def test_best_pointer_follows_the_lowest_loss_measured_at_the_checkpoints_own_step(
    tmp_path: Path, keep_best: bool
) -> None:
    """Evaluations at steps 2, 4, 6; steps 3 and 5 carry the previous loss along (as the trainer writes it) and are
    not evaluated checkpoints: step 3 carries step 2's 1.0, the lowest value, and is still never best."""
    retention = Retention(keep_last=3, keep_best=keep_best)
    history = {1: (None, None), 2: (1.0, 2), 3: (1.0, 2), 4: (2.0, 4), 5: (2.0, 4), 6: (1.5, 6)}
    best_after = {}
    for step, (loss, at) in history.items():
        save_evaluated(tmp_path, step, loss, at, retention)
        best_after[step] = pointer(tmp_path, "best")
        assert pointer(tmp_path, "latest") == f"step_{step:08d}"
    if keep_best:  # step 2 survives retention and stays best
        assert best_after == {
            1: None,
            2: "step_00000002",
            3: "step_00000002",
            4: "step_00000002",
            5: "step_00000002",
            6: "step_00000002",
        }
        assert [p.name[5:] for p in list_checkpoints(tmp_path)] == ["00000002", "00000004", "00000005", "00000006"]
    else:  # retention deleted step 2 at step 5 (keep_last 3): the best of what is left is step 4, then step 6
        assert best_after == {
            1: None,
            2: "step_00000002",
            3: "step_00000002",
            4: "step_00000002",
            5: "step_00000004",
            6: "step_00000006",
        }
    assert (
        checkpoint_eval(json.loads((tmp_path / "checkpoints" / "step_00000005" / "trainer_state.json").read_text()))
        is None
    )
    assert (
        checkpoint_eval(json.loads((tmp_path / "checkpoints" / "step_00000006" / "trainer_state.json").read_text()))
        == 1.5
    )


def test_checkpoints_of_release_010_are_not_evaluated_ones(tmp_path: Path) -> None:
    """0.1.0 wrote val_loss without the step it was measured at: no best pointer is invented from it."""
    save_checkpoint(tmp_path, 4, {"w": np.zeros(2, np.float32)}, {}, {"val_loss": 0.5}, Retention(keep_best=True))
    assert pointer(tmp_path, "best") is None
    assert checkpoint_eval({"step": 4, "val_loss": 0.5}) is None


def test_ckpt_list_shows_each_checkpoints_own_evaluation_and_ckpt_best_prints_its_path(tmp_path: Path, capsys) -> None:
    from mindfoundry.cli.main import main

    for step, (loss, at) in {1: (None, None), 2: (2.3456, 2), 3: (2.3456, 2), 4: (1.25, 4), 5: (1.25, 4)}.items():
        save_evaluated(tmp_path, step, loss, at, Retention(keep_last=5))
    assert main(["ckpt", "list", str(tmp_path)]) == 0
    rows = {line.split()[1]: line for line in capsys.readouterr().out.splitlines() if "step_0" in line}
    assert "2.3456" in rows["step_00000002"] and "1.2500" in rows["step_00000004"] and "(best)" in rows["step_00000004"]
    for step in ("step_00000001", "step_00000003", "step_00000005"):  # step 3 used to show step 2's 2.3456
        assert "2.3456" not in rows[step] and "1.2500" not in rows[step], rows[step]
    assert "(latest)" in rows["step_00000005"] and "(best)" not in rows["step_00000005"]
    assert main(["ckpt", "best", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"{tmp_path / 'checkpoints' / 'step_00000004'}\n"
    assert "best: step_00000004, validation loss 1.2500 (sha256 verified)" in captured.err
    # a run killed between writing `latest` and `best`: the committed checkpoints' own evaluations still say (it said
    # no checkpoint was evaluated)
    (tmp_path / "checkpoints" / "best").unlink()
    assert main(["ckpt", "best", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"{tmp_path / 'checkpoints' / 'step_00000004'}\n"
    assert "no best pointer in" in captured.err and "best: step_00000004, validation loss 1.2500" in captured.err


def test_ckpt_best_without_an_evaluated_checkpoint_says_why(tmp_path: Path, capsys) -> None:
    from mindfoundry.cli.main import main

    assert main(["ckpt", "best", str(tmp_path)]) == 2
    assert f"no committed checkpoints under '{tmp_path / 'checkpoints'}'" in capsys.readouterr().err
    save_evaluated(tmp_path, 3, 2.0, 2, Retention())  # carries step 2's loss: not evaluated itself
    assert main(["ckpt", "best", str(tmp_path)]) == 2
    assert "no checkpoint of" in capsys.readouterr().err


def test_retention_never_leaves_zero_checkpoints(tmp_path: Path) -> None:
    save(tmp_path, 1)
    assert apply_retention(tmp_path, Retention(keep_last=0)) == []  # even a zero K keeps the newest
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000001"]
