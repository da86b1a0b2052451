"""Training through the CLI, as a user runs it: exact resume across processes, run-dir safety."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import load_file

pytest.importorskip("mindspore")
pytest.importorskip("torch")

from mf_testing import rewrite_as_rank_slices, shared_once, tiny_run_tree  # noqa: E402
from mindfoundry.report.plots import mixture_rows  # noqa: E402
from mindfoundry.report.run_data import load_run  # noqa: E402
from mindfoundry.train.metrics import read_metrics  # noqa: E402

pytestmark = pytest.mark.slow


def cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "mindfoundry.cli", *args], capture_output=True, text=True, env=env, timeout=600
    )


def losses(run_dir: Path) -> dict[int, float]:
    """Per-step training loss; a re-logged step (after a resume) keeps its latest value."""
    return {r["step"]: r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r}


def final_state(run_dir: Path, step: int) -> tuple[dict, dict]:
    ckpt = run_dir / "checkpoints" / f"step_{step:08d}"
    return load_file(str(ckpt / "model.safetensors")), load_file(str(ckpt / "optimizer.safetensors"))


ENGINES = ["mindspore", "torch"]


@pytest.fixture(scope="module")
def straight_runs(corpus_dir: Path, tmp_path_factory) -> dict[str, Path]:
    """6 uninterrupted steps on each engine, shared by the tests below (and the test workers)."""

    def make(root: Path) -> dict[str, Path]:
        runs = {}
        for engine in ENGINES:
            cfg = write_tiny(corpus_dir, root, f"straight-{engine}")
            proc = cli("train", str(cfg), "--set", f"backend={engine}")
            assert proc.returncode == 0, proc.stderr
            runs[engine] = root / f"straight-{engine}"
        return runs

    return shared_once(tmp_path_factory, "straight", make)


def write_tiny(corpus_dir: Path, root: Path, name: str) -> Path:
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(tiny_run_tree(corpus_dir, root / name)))
    return path


@pytest.mark.parametrize("engine", ["torch"])
def test_resume_is_bit_exact(engine: str, straight_runs, corpus_dir: Path, tmp_path: Path) -> None:
    """6 uninterrupted steps vs 3 + a new process + 3: identical losses, weights and optimizer state. The second
    half starts from the step-3 checkpoint in a MindSpore cluster's rank-slice form and recomputes every block (the
    memory section may change between resumes: it changes no number). MindSpore's
    CLI resume, with the same recompute change, is tests/train/test_mlm.py's (and the SIGKILL soak's,
    test_recovery.py)."""
    split = write_tiny(corpus_dir, tmp_path, "split")
    first = cli("train", str(split), "--set", f"backend={engine}", "--stop-at-step", "3")
    assert first.returncode == 0, first.stderr
    # the step-3 checkpoint rewritten as a MindSpore semi-auto cluster writes it (4 ranks, FSDP(2) x TP(2): rank slices
    # and the strategy file): the run continues from it in one process to the uninterrupted run's numbers
    sliced = rewrite_as_rank_slices(tmp_path / "split" / "checkpoints" / "step_00000003", {"dp_shard": 2, "tp": 2}, 4)
    assert sorted(p.name for p in (sliced / "model").iterdir())[-2:] == ["rank_3.safetensors", "strategy.json"]
    second = cli(
        "train", str(split), "--set", f"backend={engine}", "--resume", "auto", "--set", "memory.recompute=full"
    )
    assert second.returncode == 0, second.stderr
    assert "resumed from" in second.stderr and "step 3" in second.stderr

    a, b = losses(straight_runs[engine]), losses(tmp_path / "split")
    assert sorted(a) == sorted(b) == [1, 2, 3, 4, 5, 6]
    for run in (
        straight_runs[engine],
        tmp_path / "split",
    ):  # eval_every 0: only the last step was evaluated, so it is best
        assert (run / "checkpoints" / "best").read_text() == "step_00000006\n"
    assert [a[s] for s in range(1, 7)] == [b[s] for s in range(1, 7)]  # same floats, not approximately
    assert a[6] < a[1]
    detail = [r for r in read_metrics(straight_runs[engine] / "metrics.jsonl") if "layer_update_ratio" in r]
    assert [r["step"] for r in detail] == [3, 6]  # monitor.detail_every=3
    assert set(detail[0]["layer_grad_norm"]) == {"embed", "layers.0", "layers.1", "norm"}
    assert all(0 < v < 1 for v in detail[0]["layer_update_ratio"].values())
    records = read_metrics(tmp_path / "split" / "metrics.jsonl")
    assert all(r["peak_rss_mb"] >= r["rss_mb"] > 100 for r in records if "loss" in r)
    assert [r["memory"] for r in records if r.get("event") in ("start", "resume")] == [
        "no recompute, no offload, whole-vocabulary loss", "full recompute (all blocks)"]
    steps = [r for r in read_metrics(straight_runs[engine] / "metrics.jsonl") if "loss" in r]
    assert all(0 < r["mfu"] < 1 for r in steps)  # against the CPU GEMM peak measured in the run
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = EventAccumulator(str(straight_runs[engine] / "tb"))
    tb.Reload()
    assert [e.value for e in tb.Scalars("train/loss")] == pytest.approx([a[s] for s in range(1, 7)])
    (wa, oa), (wb, ob) = final_state(straight_runs[engine], 6), final_state(tmp_path / "split", 6)
    assert wa.keys() == wb.keys() and oa.keys() == ob.keys()
    assert all(np.array_equal(wa[k], wb[k]) for k in wa)
    assert all(np.array_equal(oa[k], ob[k]) for k in oa)


@pytest.mark.parametrize("first,then", [("mindspore", "torch"), ("torch", "mindspore")])
def test_checkpoint_continues_on_the_other_engine(
    first: str, then: str, straight_runs, corpus_dir: Path, tmp_path: Path
) -> None:
    """3 steps on one engine, 3 more on the other == 6 steps on the first, within 1e-4 relative."""
    cfg = write_tiny(corpus_dir, tmp_path, "mixed")
    assert cli("train", str(cfg), "--set", f"backend={first}", "--stop-at-step", "3").returncode == 0
    cont = cli("train", str(cfg), "--set", f"backend={then}", "--resume", "auto")
    assert cont.returncode == 0, cont.stderr
    ref, got = losses(straight_runs[first]), losses(tmp_path / "mixed")
    assert [got[s] for s in (1, 2, 3)] == [ref[s] for s in (1, 2, 3)]
    for s in (4, 5, 6):
        assert got[s] == pytest.approx(ref[s], rel=1e-4)
    (wa, _), (wb, _) = final_state(straight_runs[first], 6), final_state(tmp_path / "mixed", 6)
    assert max(float(np.abs(wa[k] - wb[k]).max()) for k in wa) < 1e-4


def test_run_dir_of_another_run_is_refused(tiny_run, capsys) -> None:
    """(The run-dir rules are the engine's business on neither engine: torch, which starts faster, trains here, in this
    process.)"""
    from mindfoundry.cli.main import main

    cfg = tiny_run("guarded", train__steps=2)
    torch = ("--set", "backend=torch")
    assert main(["train", str(cfg), *torch]) == 0
    run_dir = cfg.parent / "guarded"
    before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())

    capsys.readouterr()
    assert main(["train", str(cfg), *torch]) == 2
    assert "already holds a run of this config: pass --resume auto" in capsys.readouterr().err

    tree = yaml.safe_load(cfg.read_text())
    tree["optim"]["lr"] = 0.5
    other = cfg.with_name("other.yaml")
    other.write_text(yaml.safe_dump(tree))
    assert main(["train", str(other), *torch]) == 2
    err = capsys.readouterr().err
    assert "holds a different run" in err and "Traceback" not in err
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == before  # nothing touched

    assert main(["train", str(other), "--overwrite", *torch]) == 0
    aside = [p for p in run_dir.parent.iterdir() if p.name.startswith("guarded.old-")]
    assert len(aside) == 1 and sorted(p.name for p in (aside[0] / "checkpoints").iterdir()) == before


def test_checkpoint_of_another_model_shape_is_refused_by_name(tiny_run, capsys) -> None:
    """A checkpoint imported into a run of a different model size: a clear error naming file and tensor (in this
    process: the commands' own code path, without four interpreter start-ups)."""
    from mindfoundry.cli.main import main

    small = tiny_run("small", train__steps=2, backend="torch")
    assert main(["train", str(small)]) == 0
    exported = small.parent / "small.pt"
    assert main(["convert", str(small.parent / "small" / "checkpoints" / "step_00000002"), str(exported)]) == 0
    wide = tiny_run("wide", model__d_model=64, backend="torch")
    assert main(["prepare", str(wide)]) == 0
    assert main(["convert", str(exported), str(wide.parent / "wide")]) == 0
    capsys.readouterr()
    assert main(["train", str(wide), "--resume", "auto"]) == 2
    err = capsys.readouterr().err
    assert "step_00000002" in err and "has shape (512, 32), the model expects (512, 64)" in err
    assert "Traceback" not in err


def test_mixture_run_reports_realized_shares_and_resumes_exactly(corpus_dir: Path, tmp_path: Path) -> None:
    """Training through the category mixture: realized shares logged, 3 + restart + 3 == 6 steps."""
    def config(name: str) -> Path:
        tree = tiny_run_tree(corpus_dir, tmp_path / name)
        tree["data"]["mixture"] = {"weights": {"code": 3, "asyncio": 1}, "block_size": 8}
        tree["backend"] = "torch"  # the mixture is the data layer's: either engine trains what it is given
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(tree))
        return path

    straight, split = config("mix-straight"), config("mix-split")
    assert cli("train", str(straight)).returncode == 0
    assert cli("train", str(split), "--stop-at-step", "3").returncode == 0
    assert cli("train", str(split), "--resume", "auto").returncode == 0
    a, b = losses(tmp_path / "mix-straight"), losses(tmp_path / "mix-split")
    assert [a[s] for s in range(1, 7)] == [b[s] for s in range(1, 7)]
    detail = [r for r in read_metrics(tmp_path / "mix-straight" / "metrics.jsonl") if "mixture" in r]
    shares = detail[-1]["mixture"]["categories"]
    assert shares["code"]["target"] == pytest.approx(0.75) and shares["code"]["realized"] == pytest.approx(0.75)
    # the report reads the realized mixture from those same records (issue #19: it looked on the step records)
    rows = dict(mixture_rows(load_run(tmp_path / "mix-straight")))
    assert rows["realized mixture (training)"] == pytest.approx({"code": 0.75, "asyncio": 0.25})
    assert rows["target mixture (config)"] == pytest.approx({"code": 0.75, "asyncio": 0.25})
    state = json.loads((tmp_path / "mix-split" / "checkpoints" / "step_00000006" / "trainer_state.json").read_text())
    assert state["data_order"]["position"] == 48 and "mixture" in state["data_order"]
