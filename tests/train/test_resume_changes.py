"""Resuming with changes, as a cluster user restarts a long job (docs/checkpoints.md, "What a resume accepts"): data
that changed under the run is refused naming what changed, a refused config change names every key and what a
resume accepts, train.steps re-plans the LR decay, a new global batch keeps the data position in samples, evaluation
scores the same samples whatever the batch shape, and a launched rank's error is one line."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from mindfoundry.cli.main import main
from mindfoundry.config.load import load_config
from mindfoundry.train.metrics import read_metrics
from mindfoundry.train.schedule import learning_rate

ENGINES = ["mindspore", pytest.param("torch", marks=pytest.mark.skipif(
    __import__("importlib").util.find_spec("torch") is None, reason="torch not installed"))]


def steps_of(run_dir: Path, key: str) -> dict[int, float]:
    """``key`` of every step record (the last write of a step wins: a resumed run rewrites nothing it ran)."""
    return {r["step"]: r[key] for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r and key in r}


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith(("error:", "config error:"))]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("engine", ENGINES)
def test_raising_train_steps_replans_the_decay_from_the_resume_step(engine, tiny_run, tmp_path, capsys) -> None:
    """A run planned for 12 steps, stopped at step 4 and resumed with train.steps=8: steps 1-4 stay the 12-step plan's
    (the rule: a re-plan changes nothing before the step it resumes at), then the LR decays from step 4's to the floor
    at step 8, along a half cosine. Raised again to 10 after the end: 9-10 decay from the floor (flat)."""
    config = tiny_run("run", backend=engine, train__steps=12)
    assert main(["train", str(config), "--stop-at-step", "4"]) == 0
    assert main(["train", str(config), "--resume", "auto", "--set", "train.steps=8"]) == 0
    out = capsys.readouterr()
    assert "continuing the run with changed settings: train.steps 12 -> 8" in out.err + out.out
    cfg = load_config(config)
    floor = cfg.optim.lr * cfg.optim.min_lr_ratio
    loss, lr = steps_of(tmp_path / "run", "loss"), steps_of(tmp_path / "run", "lr")
    assert [lr[s] for s in range(1, 5)] == [learning_rate(s, 12, cfg.optim) for s in range(1, 5)]  # the 12-step plan
    assert f"train.steps 12 -> 8: from step 4 the LR decays from {lr[4]:.4g} to {floor:.4g} at step 8" in (
        out.err + out.out)
    for s in range(5, 9):
        expected = floor + (lr[4] - floor) * 0.5 * (1 + math.cos(math.pi * (s - 4) / 4))
        assert lr[s] == pytest.approx(expected, rel=1e-12), s
    assert lr[8] == pytest.approx(floor, rel=1e-12) and sorted(loss) == list(range(1, 9))
    assert main(["train", str(config), "--resume", "auto", "--set", "train.steps=10"]) == 0
    lr = steps_of(tmp_path / "run", "lr")
    assert [lr[9], lr[10]] == pytest.approx([floor, floor], rel=1e-12)
    assert main(["train", str(config), "--resume", "auto", "--set", "train.steps=6"]) == 0  # below the checkpoint
    assert "step 10 of the checkpoint reaches train.steps=6: nothing left to train" in capsys.readouterr().err


@pytest.mark.parametrize("engine", ENGINES)
def test_a_new_global_batch_continues_at_the_next_sample(engine, tiny_run, tmp_path, tiny_prepared) -> None:
    """4 steps of 8 samples, then 2 of 16: the data position counts samples, so the resumed steps draw samples 32-63,
    the very rows one run of 8 steps of 8 draws (none skipped, none twice)."""
    from mindfoundry.data.dataset.loader import TrainLoader, training_source

    config = tiny_run("gb", backend=engine, train__steps=6)
    assert main(["train", str(config), "--stop-at-step", "4"]) == 0
    assert main(["train", str(config), "--resume", "auto", "--set", "train.micro_batch_size=8"]) == 0
    consumed = steps_of(tmp_path / "gb", "consumed_samples")
    assert [consumed[s] for s in range(1, 7)] == [8, 16, 24, 32, 48, 64]
    cfg, data = tiny_prepared
    source = training_source(cfg, data)
    one = TrainLoader.for_global_batch(source, 8, grad_accum=2, prefetch=0).iterate(0)
    uninterrupted = np.concatenate([next(one).input_ids.reshape(8, -1) for _ in range(8)])
    first = TrainLoader.for_global_batch(source, 8, grad_accum=2, prefetch=0).iterate(0)
    then = TrainLoader.for_global_batch(source, 16, grad_accum=2, prefetch=0).iterate(32)
    resumed = np.concatenate([next(first).input_ids.reshape(8, -1) for _ in range(4)]
                             + [next(then).input_ids.reshape(16, -1) for _ in range(2)])
    assert np.array_equal(resumed, uninterrupted)


def test_a_refused_change_names_every_key_and_what_a_resume_accepts(tiny_run, capsys) -> None:
    config = tiny_run("refused", backend="torch", train__steps=4)
    assert main(["train", str(config)]) == 0
    code = main(["train", str(config), "--resume", "auto", "--set", "model.d_model=64", "--set", "optim.lr=0.001",
                 "--set", "train.eval_every=2", "--set", "seed=8"])
    assert code == 2
    line = error_line(capsys)
    assert "holds a different run: model.d_model 32 -> 64, model.ffn_dim " in line, line  # the derived FFN size too
    assert ("(changes the model); optim.lr 0.01 -> 0.001 (changes the optimizer); seed 7 -> 8 (changes the data order "
            "and the initial weights). A resume accepts changes of train.steps, the global batch and its split, "
            "evaluation") in line, line
    assert "eval_every" not in line  # an accepted change is not a reason to refuse
    # a debug key that changes what is trained (it was accepted with the debug section: the run switched to copying
    # its input)
    assert main(["train", str(config), "--resume", "auto", "--set", "debug.unshifted_labels=true"]) == 2
    assert ("holds a different run: debug.unshifted_labels False -> True (changes what the model learns (labels "
            "copied from the inputs))") in error_line(capsys)


def test_data_changed_under_a_run_is_refused_naming_what_changed(tiny_run, corpus_dir, tmp_path, capsys) -> None:
    """A file added to a source folder and the prepared data gone (a new node): resuming would re-prepare and retrain
    the tokenizer, then continue on the old embeddings. Refused. With the data folder in place the change is named
    and the run goes on on the data it was trained on."""
    corpus = tmp_path / "corpus"
    shutil.copytree(corpus_dir, corpus)
    config = tiny_run("data", backend="torch", train__steps=4)
    text = config.read_text().replace(str(corpus_dir), str(corpus))
    config.write_text(text)
    assert main(["train", str(config), "--stop-at-step", "2"]) == 0
    added = Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py"  # real text the corpus does not hold yet
    (corpus / "txt" / "zz_added.txt").write_text(added.read_text(encoding="utf-8"), encoding="utf-8")
    capsys.readouterr()
    assert main(["train", str(config), "--resume", "auto", "--stop-at-step", "3"]) == 0  # the data folder is there
    err = capsys.readouterr().err
    assert "; warning: its sources changed since it was prepared (asyncio: 1 file(s) added (zz_added.txt))" in err
    shutil.rmtree(tmp_path / "data" / "data")  # a new node: the prepared folder is not there
    assert main(["train", str(config), "--resume", "auto"]) == 2
    line = error_line(capsys)
    assert "step_00000003 was trained on other data than" in line
    assert "the tokenizer differs (sha256 " in line and "its ids mean other strings" in line
    assert "source asyncio: 1 file(s) added (zz_added.txt)" in line and "source code" not in line
    assert "start a new run from these weights: --set model.init_from=" in line


def test_evaluation_scores_the_same_samples_whatever_the_batch_shape(tiny_prepared) -> None:
    from mindfoundry.backends.base import create_backend
    from mindfoundry.eval.heldout import evaluate
    from mindfoundry.model.spec import ModelSpec, init_weights
    from mindfoundry.parallel.layout import launch_layout

    cfg, data = tiny_prepared
    cfg = cfg.model_copy(update={"backend": "torch"})
    spec = ModelSpec.from_config(cfg.model)
    backend = create_backend(cfg, spec, launch_layout(cfg))
    backend.load_weights(init_weights(spec, 0))
    samples = data.packed("validation", cfg.train.seq_len)
    assert len(samples) > 9
    results = {size: evaluate(backend, samples, size, 9, data.bytes_per_token("validation")) for size in (2, 3, 8)}
    assert len({r.tokens for r in results.values()}) == 1  # the same 9 samples each time
    for size in (3, 8):  # float32 sums in other groupings: measured 2.2e-08 and 7.2e-08 relative
        assert results[size].loss == pytest.approx(results[2].loss, rel=2e-7)


@pytest.mark.slow
def test_a_launched_ranks_error_is_one_line(tiny_run, tmp_path) -> None:
    """Rank 0 refuses the run directory (another run's config) while rank 1 waits for the data: the console shows
    rank 0's error line, not torchrun's failure report or rank 1 being stopped; the job exits 2."""
    from mindfoundry.parallel.launch import free_port

    config = tiny_run("launched", backend="torch", train__steps=2)
    assert main(["train", str(config)]) == 0
    proc = subprocess.run([sys.executable, "-m", "mindfoundry.cli", "launch", "train", str(config), "--set",
                           "parallel.dp_replicate=2", "--set", "model.d_model=64", "--resume", "auto",
                           "--master-port", str(free_port())], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    errors = [i for i, line in enumerate(lines) if "error:" in line]
    assert len(errors) == 1 and lines[errors[0]].startswith("[default0]:error: run directory "), proc.stderr
    assert lines[errors[0]:] == [lines[errors[0]]]  # the last word: nothing from the launcher or rank 1 after it
    for noise in ("Traceback", "ChildFailedError", "SIGTERM", "stopped before the first step"):
        assert noise not in proc.stderr, proc.stderr
