"""What a new user sees while `train` runs (issue #36, item 8): what the first seconds are spent on, each evaluation
as it happens and how much of the validation split it scored, and an MFU that cannot read above 100%."""

from __future__ import annotations

from mindfoundry.cli.main import main
from mindfoundry.train.metrics import read_metrics


def test_train_prints_the_start_up_and_every_evaluation_with_its_scope(tiny_run, tmp_path, capsys) -> None:
    cfg = tiny_run(train__steps=4, train__eval_every=2, train__eval_samples=4, checkpoint__every=0)
    assert main(["train", str(cfg)]) == 0
    out = capsys.readouterr()
    text = out.out + out.err
    assert "step 0: evaluating the untrained model (4 of " in text and "compiles the model's step" in text
    for step in (0, 2, 4):
        assert f"step {step}: validation loss " in text, text
    assert text.count("validation samples") == 4  # the notice and three evaluations, each saying what it scored
    assert "`mindfoundry eval` scores all" in text
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert all(0 < r["mfu"] <= 1.0 for r in records if r.get("mfu") is not None)


def test_a_metrics_line_still_being_written_is_not_read_yet(tmp_path) -> None:
    """A reader polling a live run (reports, supervisor tests) met a line cut at `... "process_cpu": 47.4`."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 4, "loss": 5.9}\n{"step": 5, "loss": 5.75, "process_cpu": 47.4')
    assert read_metrics(path) == [{"step": 4, "loss": 5.9}]
