"""`mindfoundry eval`: validation numbers per category, documents, zero-shot multiple choice."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from mf_testing import random_checkpoint  # noqa: E402
from mindfoundry.backends.base import create_backend  # noqa: E402
from mindfoundry.cli.main import main  # noqa: E402
from mindfoundry.data.tokenizer import encode_batch  # noqa: E402
from mindfoundry.eval.sampling import generate  # noqa: E402
from mindfoundry.eval.tasks import TaskError, read_tasks  # noqa: E402
from mindfoundry.model.spec import ModelSpec  # noqa: E402
from mindfoundry.parallel.layout import launch_layout  # noqa: E402


@pytest.fixture
def trained(tiny_prepared):
    """The tiny run (torch engine) with a checkpoint of random weights, and a backend holding them."""
    cfg, data = tiny_prepared
    _, weights, cfg = random_checkpoint(cfg.model_copy(update={"backend": "torch"}), data, seed=4)
    backend = create_backend(cfg, ModelSpec.from_config(cfg.model), launch_layout(cfg))
    backend.load_weights(weights)
    return cfg, data, Path(cfg.run_dir), backend


def test_validation_overall_and_per_category(trained, tmp_path: Path) -> None:
    cfg, data, run, _ = trained
    assert main(["eval", str(run), "--json", str(tmp_path / "eval.json")]) == 0
    result = json.loads((tmp_path / "eval.json").read_text())["validation"]
    assert sorted(result) == ["all", "asyncio", "code"]
    # each packing scores every token of its stream but the first: the category's own sources, or all of them
    tokens = {s["category"]: s["splits"]["validation"]["tokens"] for s in data.manifest["sources"]}
    assert {name: r["tokens"] for name, r in result.items()} == {"all": sum(tokens.values()) - 1,
                                                                 **{c: n - 1 for c, n in tokens.items()}}
    parts = [result["asyncio"], result["code"]]
    pooled = sum(p["loss"] * p["tokens"] for p in parts) / sum(p["tokens"] for p in parts)
    assert (
        abs(pooled - result["all"]["loss"]) < 1e-3
    )  # measured 2.0e-4: window placement differs at the source boundary
    assert result["all"]["perplexity"] == pytest.approx(math.exp(result["all"]["loss"]), rel=1e-12)
    assert (
        main(["eval", str(run), "--json", str(tmp_path / "eval.json")]) == 2
    )  # an existing --json is never overwritten


def test_documents_are_scored_once_per_token(trained, tmp_path: Path) -> None:
    cfg, data, run, backend = trained
    texts = ["def f(x):\n    return x + 1\n", "import json\nprint(json.dumps({'a': 1}))\n" * 3]
    folder = tmp_path / "docs"
    folder.mkdir()
    for i, t in enumerate(texts):
        (folder / f"{i}.txt").write_text(t)
    assert main(["eval", str(run), "--data", str(folder), "--json", str(tmp_path / "e.json")]) == 0
    got = json.loads((tmp_path / "e.json").read_text())["data"][str(folder)]
    stream = np.concatenate(encode_batch(data.tokenizer, texts))
    assert got["tokens"] == len(stream) - 1
    logits = np.concatenate(
        [
            backend.logits(stream[i : i + cfg.train.seq_len][None].astype(np.int32))[0]
            for i in range(0, len(stream) - 1, cfg.train.seq_len)
        ]
    )[: len(stream) - 1].astype(np.float64)
    nll = -(logits[np.arange(len(stream) - 1), stream[1:]] - np.logaddexp.reduce(logits, axis=1)).mean()
    assert abs(got["loss"] - nll) < 2e-6  # measured 6.0e-7 (float32 engine vs float64 reference)
    assert got["bits_per_byte"] == pytest.approx(
        got["loss"] / math.log(2) / (sum(len(t.encode()) for t in texts) / len(stream))
    )


def test_multiple_choice_picks_what_the_model_predicts(trained, tmp_path: Path) -> None:
    cfg, data, run, backend = trained
    tok = data.tokenizer
    rows = []
    for i, question in enumerate(["import", "class Reader", "def main"]):
        ids = generate(backend, tok.encode(question).ids, max_seq_len=cfg.model.max_seq_len, max_new_tokens=6,
                       temperature=0, top_k=0, eos_id=0, seed=0)
        # the longest start of the greedy path whose text tokenizes back to it (a repeated token, say, may not:
        # BPE merges the repeats), so that scoring the choice text scores the greedy tokens
        n = max(k for k in range(1, len(ids) + 1) if tok.encode(tok.decode(ids[:k])).ids == ids[:k])
        greedy = tok.decode(ids[:n])
        others = [tok.decode(np.random.default_rng(j).integers(300, 500, 6).tolist()) for j in range(3)]
        choices = others[:i] + [greedy] + others[i:]
        rows.append({"question": question, "choices": choices, "answer": i, "subject": "code" if i else "imports"})
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert main(["eval", str(run), "--tasks", str(tmp_path / "t.jsonl"), "--json", str(tmp_path / "r.json")]) == 0
    scores = json.loads((tmp_path / "r.json").read_text())["tasks"]["t.jsonl"]
    assert scores["overall"] == {"questions": 3, "acc": 1.0, "acc_norm": scores["overall"]["acc_norm"], "random": 0.25}
    assert sorted(scores["subjects"]) == ["code", "imports"] and scores["subjects"]["code"]["questions"] == 2


@pytest.mark.parametrize("line, message", [
    ('{"question": "q", "choices": ["a", "b"], "answer": 2}', r"t.jsonl:2: \"answer\"=2 is not the index \(0..1\)"),
    ('{"question": "q", "choices": ["a"], "answer": 0}', r"t.jsonl:2: \"choices\" must hold at least two"),
    ('not json', r"t.jsonl:2: not a JSON object"),
    ('{"choices": ["a", "b"], "answer": 0}', r"t.jsonl:2: needs \"question\""),
])
def test_a_malformed_task_row_is_named_by_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"question": "q", "choices": ["a", "b"], "answer": "B"}\n' + line + "\n")
    with pytest.raises(TaskError, match=message):
        read_tasks(path)
    path.write_text('{"question": "q", "choices": ["a", "b"], "answer": "B"}\n')
    assert read_tasks(path)[0].answer == 1  # a letter is a choice index
