"""Inputs that change under `prepare`, and prepared folders damaged after it: errors naming the file, nothing kept."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from mf_testing import tiny_run_tree
from mindfoundry.cli.main import main
from mindfoundry.config.load import load_config
from mindfoundry.data.dataset.prepared import MANIFEST, DataError, load_prepared
from mindfoundry.data.ingest.listing import DataSourceError, FileLedger


@pytest.mark.parametrize("change,expect", [
    ("rewrite", "changed since prepare listed it .*no output was written"),
    ("truncate", "changed since prepare listed it"),
    ("append", "changed since prepare listed it"),
    ("delete", r"\(No such file or directory\): fix it or remove it"),
])
def test_a_source_file_changed_after_it_was_listed_fails_prepare_and_writes_nothing(corpus_dir, tmp_path, monkeypatch,
                                                                                    change, expect) -> None:
    import mindfoundry.data.prepare.pipeline as pipeline

    corpus = tmp_path / "corpus"
    shutil.copytree(corpus_dir, corpus)
    victim = corpus / "code.jsonl"
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(tiny_run_tree(corpus, tmp_path / "run")))
    cfg = load_config(cfg_path)
    real_plan = pipeline.plan_inputs

    def plan_then_change(*args, **kwargs):  # the real listing; then someone writes the file before it is read
        plan = real_plan(*args, **kwargs)
        text = victim.read_text()
        if change == "rewrite":  # same size, other content
            victim.write_text(text.replace("import", "IMPORT", 1))
        elif change == "truncate":
            victim.write_text("")
        elif change == "delete":
            victim.unlink()
        else:
            victim.write_text(text + json.dumps({"text": "one more document " * 20}) + "\n")
        return plan

    monkeypatch.setattr(pipeline, "plan_inputs", plan_then_change)
    with pytest.raises(DataSourceError, match=rf"'{victim}' {expect}"):
        pipeline.prepare_data(cfg, log=lambda _: None)
    data = Path(cfg.data.output_dir)
    assert not data.exists() and not list(data.parent.glob(f".{data.name}.tmp-*"))  # no half-written dataset


def test_one_enormous_line_is_skipped_at_read_time(corpus_dir, tmp_path) -> None:
    """A 20 MB file without a line break used to cost minutes of cleaning and gigabytes before its error."""
    import time

    from mindfoundry.data.prepare.pipeline import prepare_data

    (tmp_path / "huge.txt").write_text("word " * 4_000_000)  # 20,000,000 characters, one line
    tree = tiny_run_tree(corpus_dir, tmp_path / "run")
    tree["data"]["sources"].append({"name": "huge", "paths": [str(tmp_path / "huge.txt")]})
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(tree))
    t0 = time.perf_counter()
    with pytest.raises(
        DataError,
        match=r"source 'huge' produced no documents \(read 1 files, skipped 0 empty, 1 too long.*"
        r"huge.txt: a 20,000,000-character document skipped \(more than 16,000,000; use txt_mode: line",
    ):
        prepare_data(load_config(cfg_path), log=lambda _: None)
    assert time.perf_counter() - t0 < 60  # measured 2.8 s, the tiny corpus's passes included


def test_an_unreadable_source_file_is_named(tmp_path) -> None:
    from mindfoundry.data.ingest.files import SourceStats

    with pytest.raises(
        DataSourceError, match=rf"cannot read source file '{tmp_path}' \(Is a directory\): fix it or remove it"
    ):
        SourceStats().record_file(tmp_path)  # as unreadable as a file without read permission (which root can read)


def test_a_file_written_while_it_is_read_is_caught(tmp_path) -> None:
    path = tmp_path / "a.txt"
    path.write_text("first version\n")
    ledger = FileLedger()
    st = path.stat()
    ledger.check(path, st.st_size, st.st_mtime_ns, "h")
    path.write_text("first version, and more written during the read\n")
    with pytest.raises(DataSourceError, match=r"changed while prepare was reading it \(14 -> 48 bytes\)"):
        ledger.check_unchanged(path)


def test_damaged_prepared_data_is_refused_at_train_start(tiny_prepared, tmp_path, capsys) -> None:
    cfg, data = tiny_prepared
    root = tmp_path / "prepared"  # outside the (unclaimed) run dir, so that `train` gets as far as the data
    shutil.move(cfg.data.output_dir, root)
    config = [str(tmp_path / "run.yaml"), "--set", f"data.output_dir={root}"]
    manifest = (root / MANIFEST).read_text()

    shard = next((root / "train").glob("*.bin"))
    raw = bytearray(shard.read_bytes())
    raw[10] ^= 0x01  # one flipped bit in a token id: still in range, counts unchanged
    shard.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=rf"{shard.name} changed since it was prepared \(sha256 differs"):
        load_prepared(root, cfg.model.vocab_size)
    assert main(["train", *config]) == 2  # what `data validate` rejects, train refuses
    err = capsys.readouterr().err
    assert "changed since it was prepared" in err and "Traceback" not in err
    assert main(["data", "validate", *config]) == 2
    raw[10] ^= 0x01
    eos = bytes(raw[-2:])
    raw[-2:] = b"\x05\x00"  # the last document's EOS (uint16 ids for this vocabulary) replaced by a word
    shard.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=rf"{shard.name} changed since it was prepared"):
        load_prepared(root, cfg.model.vocab_size)
    raw[-2:] = eos
    shard.write_bytes(bytes(raw))
    load_prepared(root, cfg.model.vocab_size)  # restored: accepted again

    tree = json.loads(manifest)
    bad_path = json.loads(manifest)
    bad_path["splits"]["train"]["shards"][0]["path"] = "../../../../etc/passwd"
    for content, expect in [
        (manifest[: len(manifest) // 2], "is not valid JSON"),
        ("[]", "has no 'splits'"),
        (json.dumps({k: v for k, v in tree.items() if k != "splits"}), "has no 'splits'"),
        (json.dumps(bad_path), "lists a train shard at '../../../../etc/passwd': shards live inside the data folder"),
    ]:
        (root / MANIFEST).write_text(content)
        with pytest.raises(DataError, match=expect):
            load_prepared(root, cfg.model.vocab_size)
        assert main(["train", *config]) == 2
        err = capsys.readouterr().err
        assert expect.split(":")[0] in err and "Traceback" not in err, err
    (root / MANIFEST).write_text(manifest)
    assert len(load_prepared(root, cfg.model.vocab_size).shards["train"]) == len(data.shards["train"])
