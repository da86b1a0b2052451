"""`prepare` end to end on real text: split disjointness, manifest provenance, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from mf_testing import tiny_run_tree
from mindfoundry.cli.main import main
from mindfoundry.config.load import load_config, validate
from mindfoundry.data.dataset.indexed import IndexedDataset
from mindfoundry.data.dataset.prepared import DataError, load_prepared
from mindfoundry.data.prepare.pipeline import prepare_data
from mindfoundry.data.prepare.split import content_hash
from mindfoundry.data.tokenizer import eos_id


def decoded_hashes(data, split: str) -> list[str]:
    """Content hashes of the documents in a split, decoded back from the token shards."""
    out = []
    eos = eos_id(data.tokenizer)
    for shard in data.shards[split]:
        for i in range(len(shard)):
            ids = shard[i].tolist()
            assert ids[-1] == eos  # every document ends with EOS
            out.append(content_hash(data.tokenizer.decode(ids[:-1], skip_special_tokens=False)))
    return out


def test_split_is_disjoint_by_document_and_duplicates_stay_together(corpus_dir: Path, tmp_path: Path) -> None:
    docs = [json.loads(line)["text"] for line in (corpus_dir / "code.jsonl").read_text().splitlines()]
    dup = tmp_path / "dups.jsonl"
    dup.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs[:20] * 2))  # every document twice
    tree = tiny_run_tree(corpus_dir, tmp_path / "run")
    tree["data"] = {
        "sources": [{"name": "dups", "paths": [str(dup)]}, {"name": "code", "paths": [str(corpus_dir / "code.jsonl")]}],
        "validation_fraction": 0.25,
        "clean": {"enabled": False},
        "dedup": {"enabled": False},
    }  # the split alone (dedup would drop the copies)
    data = prepare_data(validate(tree), log=lambda _: None)
    train, val = decoded_hashes(data, "train"), decoded_hashes(data, "validation")
    assert val and train
    assert not set(train) & set(val)
    expected = {content_hash(t) for t in docs}
    assert set(train) | set(val) == expected  # lossless: decoded shards reproduce every document
    m = data.manifest
    assert m["splits"]["train"]["documents"] + m["splits"]["validation"]["documents"] == 20 * 2 + len(docs)
    assert m["splits"]["train"]["tokens"] == sum(s.num_tokens for s in data.shards["train"])


def test_manifest_records_provenance(tiny_run) -> None:
    cfg = load_config(tiny_run("prov"))
    data = prepare_data(cfg, log=lambda _: None)
    m = data.manifest
    src = m["sources"][0]
    assert src["files"][0]["path"].endswith("code.jsonl") and len(src["files"][0]["sha256"]) == 64
    assert m["tokenizer"]["sha256"] and m["seed"] == 7 and m["dtype"] == "uint16"
    idx = Path(cfg.data.output_dir) / "train" / "code.idx"
    assert idx.read_bytes()[:9] == b"MMIDIDX\x00\x00"
    again = prepare_data(cfg, log=lambda _: None)  # same config: reused, not rebuilt
    assert again.manifest_sha256 == data.manifest_sha256


def test_tokenizer_is_deterministic_across_prepares(tiny_run, tmp_path: Path) -> None:
    hashes = []
    for name in ("a", "b"):
        cfg = load_config(tiny_run(name))
        hashes.append(prepare_data(cfg, log=lambda _: None).manifest["tokenizer"]["sha256"])
        assert (Path(cfg.data.output_dir) / "tokenizer.json").is_file()
    assert hashes[0] == hashes[1]
    a, b = (tmp_path / n / "data" / "tokenizer.json" for n in ("a", "b"))
    assert a.read_bytes() == b.read_bytes()


def test_non_utf8_records_are_skipped_and_counted(corpus_dir: Path, tmp_path: Path) -> None:
    good = [json.dumps({"text": f"document number {i} " * 20}).encode() for i in range(40)]
    raw = b"\n".join(good[:20] + [b'{"text": "caf\xe9 latin-1 bytes"}'] + good[20:]) + b"\n"
    (tmp_path / "mixed.jsonl").write_bytes(raw)
    tree = tiny_run_tree(corpus_dir, tmp_path / "run")
    # profile none and no dedup: the repetitive synthetic text would (rightly) fail the repetition filter and be near
    # duplicates of each other
    tree["data"]["sources"] = [
        {"name": "mixed", "paths": [str(tmp_path / "mixed.jsonl")], "clean": {"profile": "none"}}
    ]
    tree["data"]["validation_fraction"] = 0.1
    tree["data"]["dedup"] = {"enabled": False}
    data = prepare_data(validate(tree), log=lambda _: None)
    stats = data.manifest["sources"][0]["stats"]
    assert stats["skipped_non_utf8"] == 1 and stats["documents"] == 40


def write_config(tmp_path: Path, tree: dict) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(tree))
    return str(path)


def test_missing_corpus_path(corpus_dir: Path, tmp_path: Path, capsys) -> None:
    tree = tiny_run_tree(corpus_dir, tmp_path / "run")
    tree["data"]["sources"][0]["paths"] = [str(tmp_path / "nope" / "*.jsonl")]
    assert main(["prepare", write_config(tmp_path, tree)]) == 2
    err = capsys.readouterr().err
    assert "nope" in err and "Traceback" not in err


def test_empty_corpus(corpus_dir: Path, tmp_path: Path, capsys) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "blank.txt").write_text("   \n\n")
    tree = tiny_run_tree(corpus_dir, tmp_path / "run")
    tree["data"]["sources"] = [{"name": "blank", "paths": [str(tmp_path / "empty")]}]
    assert main(["prepare", write_config(tmp_path, tree)]) == 2
    assert "source 'blank' produced no documents" in capsys.readouterr().err
    assert not (tmp_path / "run" / "data").exists()  # nothing half-written left behind


def test_truncated_shard_is_reported(tiny_run) -> None:
    cfg = load_config(tiny_run("trunc"))
    prepare_data(cfg, log=lambda _: None)
    shard = Path(cfg.data.output_dir) / "train" / "code.bin"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(DataError, match="code.bin"):
        load_prepared(cfg.data.output_dir, cfg.model.vocab_size)


def test_tokens_beyond_model_vocab_are_reported(tiny_run) -> None:
    cfg = load_config(tiny_run("vocab"))
    prepare_data(cfg, log=lambda _: None)
    with pytest.raises(DataError, match="model.vocab_size=300"):
        load_prepared(cfg.data.output_dir, 300)


def test_changed_data_config_is_not_silently_reused(tiny_run, capsys) -> None:
    path = tiny_run("changed")
    assert main(["prepare", str(path)]) == 0
    assert main(["prepare", str(path), "--set", "data.validation_fraction=0.2"]) == 2
    assert "holds data prepared from a different data config" in capsys.readouterr().err


def test_packed_samples_come_from_the_shards(tiny_run) -> None:
    cfg = load_config(tiny_run("packed"))
    data = prepare_data(cfg, log=lambda _: None)
    samples = data.packed("train", 32)
    stream = np.concatenate([np.asarray(IndexedDataset(s.path_prefix).tokens()) for s in data.shards["train"]])
    ids, labels = samples[3]
    assert np.array_equal(ids, stream[96:128]) and np.array_equal(labels, stream[97:129])
