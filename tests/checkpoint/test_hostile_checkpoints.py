"""Checkpoint folders tampered with, left half-written, or written onto a full disk: named, skipped, cleaned."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import yaml

from mf_testing import shared_once, tiny_run_tree
from mindfoundry.checkpoint.directory import find_resumable, list_checkpoints
from mindfoundry.checkpoint.store import MODEL_FILE, STATE_FILE, CheckpointError, verify_checkpoint
from mindfoundry.cli.main import main
from mindfoundry.config.load import load_config, to_yaml
from mindfoundry.train.rundir import CONFIG_FILE


@pytest.fixture(scope="module")
def trained_once(corpus_dir, tmp_path_factory):
    """A tiny run trained 6 steps with checkpoints at 3 and 6, once per test run: a folder to copy, never to change."""

    def make(root):
        cfg = root / "run.yaml"
        cfg.write_text(yaml.safe_dump(tiny_run_tree(corpus_dir, root / "run", train__steps=6)))
        assert main(["train", str(cfg)]) == 0
        return root / "run"

    return shared_once(tmp_path_factory, "hostile-checkpoints", make)


@pytest.fixture
def trained(trained_once, tiny_run, tmp_path):
    """:func:`trained_once`'s run in this test's folder, free to tamper with (its config, run dir): the run's
    config.yaml is the one a run in this folder writes, so the copy is that run."""
    cfg = tiny_run(train__steps=6)
    run = tmp_path / "run"
    shutil.copytree(trained_once, run, symlinks=True)
    (run / CONFIG_FILE).write_text(to_yaml(load_config(cfg)))
    assert [p.name for p in list_checkpoints(run)] == ["step_00000003", "step_00000006"]
    return cfg, run


def test_tampered_checkpoints_are_named_and_skipped(trained, tmp_path, capsys) -> None:
    cfg, run = trained
    step3, step6 = list_checkpoints(run)

    # step 6's folder holding step 3's files: verifies file by file, but its steps disagree
    saved6 = tmp_path / "saved6"
    shutil.copytree(step6, saved6)
    shutil.rmtree(step6)
    shutil.copytree(step3, step6)
    with pytest.raises(CheckpointError, match="its steps disagree \\(folder 6, manifest 3, trainer_state 3\\)"):
        verify_checkpoint(step6)
    path, skipped = find_resumable(run)
    assert path == step3 and "steps disagree" in skipped[0]
    assert main(["ckpt", "verify", str(run)]) == 2
    shutil.rmtree(step6)
    shutil.copytree(saved6, step6)

    # a weights file replaced by a symlink to an identical copy outside the run: same bytes, refused
    outside = tmp_path / "outside.safetensors"
    shutil.copy(step6 / MODEL_FILE, outside)
    (step6 / MODEL_FILE).unlink()
    (step6 / MODEL_FILE).symlink_to(outside)
    with pytest.raises(CheckpointError, match="not a regular file inside the checkpoint folder"):
        verify_checkpoint(step6)
    (step6 / MODEL_FILE).unlink()
    shutil.copy(outside, step6 / MODEL_FILE)
    verify_checkpoint(step6)

    # another run's checkpoint copied into this run's folder: refused on resume, not trained on
    state = json.loads((step6 / STATE_FILE).read_text())
    state["run_identity"] = "0" * 64
    capsys.readouterr()
    (step6 / STATE_FILE).write_text(json.dumps(state))
    manifest = json.loads((step6 / "manifest.json").read_text())
    data = (step6 / STATE_FILE).read_bytes()
    manifest["files"][STATE_FILE] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (step6 / "manifest.json").write_text(json.dumps(manifest))
    (step6 / "manifest.sha256").write_text(hashlib.sha256((step6 / "manifest.json").read_bytes()).hexdigest() + "\n")
    verify_checkpoint(step6)  # a consistent folder ...
    assert main(["train", str(cfg), "--resume", "auto"]) == 2  # ... of another run
    assert "was written by a different run" in capsys.readouterr().err

    # garbage where `convert` expects an engine's native file: named, nothing imported
    for suffix in (".pt", ".ckpt"):
        garbage = tmp_path / f"garbage{suffix}"
        garbage.write_bytes(bytes(range(256)) * 20)
        assert main(["convert", str(garbage), str(run)]) == 2
        err = capsys.readouterr().err
        assert f"is not a {suffix} file that `mindfoundry convert` wrote" in err and "Traceback" not in err, err
    assert [p.name for p in list_checkpoints(run)] == ["step_00000003", "step_00000006"]


def test_leftovers_of_killed_writers_are_removed_at_start(trained, capsys) -> None:
    cfg, run = trained
    root = run / "checkpoints"
    for name in (".tmp-step_00000009-4242", ".old-step_00000006-4242", ".deleting-step_00000001-4242"):
        (root / name).mkdir()
        (root / name / MODEL_FILE).write_bytes(b"half")
    assert main(["ckpt", "verify", str(run)]) == 0  # leftovers are never checkpoints
    capsys.readouterr()
    assert main(["train", str(cfg), "--resume", "auto"]) == 0
    out = capsys.readouterr()
    for name in (".deleting-step_00000001-4242", ".old-step_00000006-4242", ".tmp-step_00000009-4242"):
        assert f"removed {name}: what an interrupted checkpoint write or deletion left behind" in out.out + out.err
        assert not (root / name).exists()
    assert [p.name for p in list_checkpoints(run)] == ["step_00000003", "step_00000006"]


def test_a_full_disk_ends_in_one_line_and_keeps_the_earlier_checkpoints(corpus_dir, tmp_path, capsys) -> None:

    from mf_testing import small_disk, tiny_run_tree

    with small_disk(tmp_path / "disk", "1400k") as disk:
        cfg = tmp_path / "run.yaml"
        cfg.write_text(yaml.safe_dump(tiny_run_tree(corpus_dir, disk / "run", data__output_dir=str(tmp_path / "data"),
                                                    checkpoint__every=1, checkpoint__keep_last=10)))
        capsys.readouterr()
        assert main(["train", str(cfg)]) == 2
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip()]
        assert lines[-1].startswith("error: no space left on the disk of") and "for checkpoint step" in lines[-1]
        assert (
            "it needs about" in lines[-1]
            and "is free" in lines[-1]
            and "the checkpoints written before are intact" in lines[-1]
        )
        assert "Traceback" not in err and "last-gasp" not in err  # no retry of the write that failed
        kept = list_checkpoints(disk / "run")
        assert kept and all(verify_checkpoint(p) for p in kept)
        assert not list((disk / "run" / "checkpoints").glob(".tmp-*"))  # the failed write removed its folder


def _reseal(step, name: str, data: bytes) -> None:
    """Write ``data`` as the checkpoint's file ``name`` and seal it into the manifest, as a tamperer would."""
    (step / name).write_bytes(data)
    manifest = json.loads((step / "manifest.json").read_text())
    manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (step / "manifest.json").write_text(json.dumps(manifest))
    (step / "manifest.sha256").write_text(hashlib.sha256((step / "manifest.json").read_bytes()).hexdigest() + "\n")


@pytest.mark.parametrize("lie", ["header_length", "shape", "offset"])
def test_a_resealed_lying_safetensors_header_fails_verify_and_resume_falls_back(trained, capsys, lie: str) -> None:
    """The sha256 matches (resealed), the header lies: `ckpt verify` said ok and resume exited 2 without a fallback."""
    import struct

    cfg, run = trained
    step3, step6 = list_checkpoints(run)
    raw = (step6 / MODEL_FILE).read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    name = next(k for k in header if k != "__metadata__")
    if lie == "header_length":
        data = struct.pack("<Q", 2 ** 62) + raw[8:]
        message = "its header claims 4,611,686,018,427,387,904 bytes"
    else:
        if lie == "shape":
            header[name]["shape"] = [2 ** 40]
            message = f"tensor '{name}' of shape [1099511627776]"
        else:
            header[name]["data_offsets"] = [0, 2 ** 40]
            message = f"tensor '{name}' has offsets [0, 1099511627776] outside the file's"
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        data = struct.pack("<Q", len(text)) + text + raw[8 + length:]
    _reseal(step6, MODEL_FILE, data)
    with pytest.raises(CheckpointError, match=message.replace("[", "\\[").replace("]", "\\]")):
        verify_checkpoint(step6)
    capsys.readouterr()
    assert main(["ckpt", "verify", str(step6)]) == 2
    assert f"INVALID  {step6}" in (out := capsys.readouterr().out) and message in out
    path, skipped = find_resumable(run)
    assert path == step3 and message in skipped[0]  # resume falls back to the previous valid step, as for a bad hash
    assert main(["train", str(cfg), "--resume", "auto"]) == 0
    assert "step_00000003" in capsys.readouterr().err
