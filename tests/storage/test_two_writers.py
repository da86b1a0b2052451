"""One writer per output, on a local disk and at a URL (a real S3 server): a second `prepare` aimed at another run's
committed (or committing) output, a `prepare --overwrite` of the data a run trains on, a second run on one
checkpoint.dir -- each refused in one line naming the other run, nothing of the other run changed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mindfoundry.cli.main import main
from mindfoundry.data.prepare import pipeline
from mindfoundry.storage.commit import COMMIT
from mindfoundry.storage.location import Location
from mindfoundry.storage.resolve import locate
from mindfoundry.train.trainer import Trainer


@pytest.fixture(params=["local", "url"])
def where(request, tmp_path):
    """A folder for outputs: a local one, or a prefix of a fresh bucket on the test S3 server."""
    if request.param == "local":
        return str(tmp_path / "shared")
    s3 = request.getfixturevalue("s3")
    return f"s3://{s3.bucket()}/shared"


def snapshot(folder: Location) -> dict[str, bytes]:
    """Every file below ``folder`` (leases and locks aside), by its path."""
    return {f.relative_to(folder): f.read_bytes() for f in folder.files() if ".lock" not in str(f)}


def cli(*args: str) -> subprocess.CompletedProcess:
    """A second process: `mindfoundry ARGS` (the environment, S3 variables included, is this one's)."""
    return subprocess.run([sys.executable, "-m", "mindfoundry.cli", *args], capture_output=True, text=True,
                          timeout=300)


def error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in output, output
    return lines[0]


def during_training(monkeypatch, action) -> list:
    """Run ``action`` once, as the next training run starts its steps (its run dir, data and checkpoint.dir held)."""
    seen = []
    original = Trainer.run

    def run(self, **kwargs):
        seen.append(action())
        return original(self, **kwargs)

    monkeypatch.setattr(Trainer, "run", run)
    return seen


def test_a_prepare_never_replaces_another_runs_output(tiny_run, where, monkeypatch, capsys) -> None:
    out = locate(where + "/data")
    first = tiny_run("first", data__output_dir=str(out))
    second = tiny_run("second", data__output_dir=str(out), data__validation_fraction=0.2)
    assert main(["prepare", str(first)]) == 0
    before = snapshot(out)
    capsys.readouterr()
    # committed before the second began: refused at its start
    assert main(["prepare", str(second)]) == 2
    line = error_line(capsys.readouterr().err)
    assert line.startswith(f"error: '{out}' holds data prepared from a different data config (by the run in ")
    assert line.endswith("/first): pass --overwrite to rebuild it (the old folder is moved aside) or set "
                         "data.output_dir")
    assert snapshot(out) == before
    # committed while the second ran its stages (it found nothing at its start): refused when it publishes
    (out.parent / "aside").delete_tree()
    out.move_folder(out.parent / "aside", COMMIT)
    claim = pipeline.claim_output

    def first_commits_meanwhile(location, *, shared):
        (out.parent / "aside").move_folder(out, COMMIT)
        return claim(location, shared=shared)

    monkeypatch.setattr(pipeline, "claim_output", first_commits_meanwhile)
    assert main(["prepare", str(second)]) == 2
    assert "holds data prepared from a different data config (by the run in " in error_line(capsys.readouterr().err)
    assert snapshot(out) == before


@pytest.mark.slow
def test_no_prepare_overwrite_or_second_run_under_a_training_run(tiny_run, where, monkeypatch, capsys) -> None:
    """The data a run trains on and its checkpoint.dir are held while it trains: another process's `prepare
    --overwrite` of the data and a second run on the checkpoint.dir are refused, naming the run; and the run's
    checkpoints hold the tokenizer it started with, whatever the data folder's file holds later."""
    out, ckpt = locate(where + "/data"), locate(where + "/ckpt")
    config = tiny_run("trains", backend="torch", data__output_dir=str(out), checkpoint={"dir": str(ckpt), "every": 3})
    overwriter = tiny_run("overwriter", data__output_dir=str(out))  # the same data, another run directory
    other = tiny_run("other", backend="torch", checkpoint={"dir": str(ckpt)})
    assert main(["prepare", str(config)]) == 0
    data_before, tokenizer = snapshot(out), (out / "tokenizer.json").read_bytes()

    def others_try() -> tuple[str, str]:
        overwrite = cli("prepare", str(overwriter), "--overwrite")
        second = cli("train", str(other))
        assert overwrite.returncode == 2 and second.returncode == 2
        return error_line(overwrite.stderr), error_line(second.stderr)

    tried = during_training(monkeypatch, others_try)
    assert main(["train", str(config)]) == 0
    (overwrite, second), = tried
    assert overwrite.startswith(f"error: data.output_dir {out} is held by pid {os.getpid()} on ")
    assert "one prepare writes it at a time, and none while a run trains on it" in overwrite
    assert second.startswith(f"error: checkpoint.dir {ckpt} is being written by pid {os.getpid()} on ")
    assert "one run per checkpoint.dir" in second
    assert snapshot(out) == data_before
    steps = sorted(name for name in ckpt.children() if name.startswith("step_"))
    assert steps == ["step_00000003", "step_00000006"]
    assert all((ckpt / name / "tokenizer.json").read_bytes() == tokenizer for name in steps)
    run_dir = Path(yaml.safe_load(other.read_text())["run_dir"])
    assert not run_dir.exists()  # the refused run wrote nothing


def test_a_checkpoint_keeps_the_tokenizer_its_run_started_with(tiny_run, monkeypatch, tmp_path) -> None:
    """prepare --overwrite of a run's data under it once spoiled 11 of its 15 later checkpoints: each save read the
    tokenizer file again."""
    config = tiny_run("kept", backend="torch")
    data = locate(yaml.safe_load(config.read_text())["run_dir"]) / "data"
    started = []

    def replace_the_file() -> None:
        started.append((data / "tokenizer.json").read_bytes())
        (data / "tokenizer.json").write_text('{"not": "the tokenizer the run started with"}')

    during_training(monkeypatch, replace_the_file)
    assert main(["train", str(config)]) == 0
    ckpt = data.parent / "checkpoints"
    assert [(ckpt / n / "tokenizer.json").read_bytes() for n in ("step_00000003", "step_00000006")] == started * 2
