"""eval.tasks: zero-shot tasks scored at every held-out evaluation of training, in metrics, TensorBoard and the report.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from mindfoundry.config.load import ConfigError  # noqa: E402
from mindfoundry.eval.tasks import read_tasks, score_tasks  # noqa: E402
from mindfoundry.monitor.tensorboard import scalars  # noqa: E402
from mindfoundry.parallel.layout import launch_layout  # noqa: E402
from mindfoundry.train.metrics import read_metrics  # noqa: E402
from mindfoundry.train.trainer import Trainer  # noqa: E402

ROWS = [{"question": "def main():\n    ", "choices": ["return", "zzzz", "}}}}"], "answer": 0, "subject": "code"},
        {"question": "import", "choices": [" json", " ((((", " ;;;;"], "answer": 0, "subject": "code"}]


def test_tasks_are_scored_at_every_evaluation(tiny_prepared, tmp_path: Path) -> None:
    from mindfoundry.report.render import write_report

    cfg, data = tiny_prepared
    task = tmp_path / "mc.jsonl"
    task.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    cfg = cfg.model_copy(update={"backend": "torch", "eval": cfg.eval.model_copy(update={"tasks": [str(task)]}),
                                 "train": cfg.train.model_copy(update={"steps": 2, "eval_every": 1})})
    trainer = Trainer(cfg, data, Path(cfg.run_dir), launch_layout(cfg))
    trainer.run()
    evals = [r for r in read_metrics(Path(cfg.run_dir) / "metrics.jsonl") if "task_acc" in r]
    assert [r["step"] for r in evals] == [0, 1, 2] and all(set(r["task_acc"]) == {"mc"} for r in evals)
    final = score_tasks(trainer.backend, data.tokenizer, read_tasks(task), cfg.model.max_seq_len)["overall"]
    assert (evals[-1]["task_acc"]["mc"], evals[-1]["task_acc_norm"]["mc"]) == (final["acc"], final["acc_norm"])
    assert scalars(evals[-1])["task_acc/mc"] == final["acc"]
    assert "zero-shot accuracy (eval.tasks)" in write_report(cfg.run_dir, None, None).read_text()


def test_a_missing_task_file_is_a_config_error(make_config) -> None:
    with pytest.raises(ConfigError, match=r"eval.tasks\[0\]='/no/mc.jsonl' does not exist"):
        make_config(eval={"tasks": ["/no/mc.jsonl"]})
