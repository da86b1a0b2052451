"""Training through the CLI, as a user runs it: exact resume across processes, run-dir safety."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import load_file

pytest.importorskip("mindspore")

from mindfoundry.train.metrics import read_metrics  # noqa: E402

pytestmark = pytest.mark.slow


def cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "mindfoundry.cli", *args], capture_output=True, text=True, env=env, timeout=600)


def losses(run_dir: Path) -> dict[int, float]:
    """Per-step training loss; a re-logged step (after a resume) keeps its latest value."""
    return {r["step"]: r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r}


def final_state(run_dir: Path, step: int) -> tuple[dict, dict]:
    ckpt = run_dir / "checkpoints" / f"step_{step:08d}"
    return load_file(str(ckpt / "model.safetensors")), load_file(str(ckpt / "optimizer.safetensors"))


def test_resume_is_bit_exact(tiny_run) -> None:
    """6 uninterrupted steps vs 3 + a new process + 3: identical losses, weights and optimizer state."""
    straight = tiny_run("straight")
    assert cli("train", str(straight)).returncode == 0
    split = tiny_run("split")
    first = cli("train", str(split), "--stop-at-step", "3")
    assert first.returncode == 0, first.stderr
    second = cli("train", str(split), "--resume", "auto")
    assert second.returncode == 0, second.stderr
    assert "resumed from" in second.stderr and "step 3" in second.stderr

    a, b = losses(straight.parent / "straight"), losses(split.parent / "split")
    assert sorted(a) == sorted(b) == [1, 2, 3, 4, 5, 6]
    assert [a[s] for s in range(1, 7)] == [b[s] for s in range(1, 7)]  # same floats, not approximately
    assert a[6] < a[1]
    (wa, oa), (wb, ob) = final_state(straight.parent / "straight", 6), final_state(split.parent / "split", 6)
    assert wa.keys() == wb.keys() and oa.keys() == ob.keys()
    assert all(np.array_equal(wa[k], wb[k]) for k in wa)
    assert all(np.array_equal(oa[k], ob[k]) for k in oa)


def test_run_dir_of_another_run_is_refused(tiny_run) -> None:
    cfg = tiny_run("guarded", train__steps=2)
    assert cli("train", str(cfg)).returncode == 0
    run_dir = cfg.parent / "guarded"
    before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())

    again = cli("train", str(cfg))
    assert again.returncode == 2
    assert "already holds a run of this config: pass --resume auto" in again.stderr

    tree = yaml.safe_load(cfg.read_text())
    tree["optim"]["lr"] = 0.5
    other = cfg.with_name("other.yaml")
    other.write_text(yaml.safe_dump(tree))
    refused = cli("train", str(other))
    assert refused.returncode == 2 and "holds a different run" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == before  # nothing touched

    moved = cli("train", str(other), "--overwrite")
    assert moved.returncode == 0, moved.stderr
    aside = [p for p in run_dir.parent.iterdir() if p.name.startswith("guarded.old-")]
    assert len(aside) == 1 and sorted(p.name for p in (aside[0] / "checkpoints").iterdir()) == before
