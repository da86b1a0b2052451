"""Messages say what a path is (issue #36, item 6): a FIFO given as a source, a shard replaced by a folder, and an
unknown key of a megabyte are named in one readable line."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from mindfoundry.config.load import ConfigError, validate
from mindfoundry.data.dataset.indexed import IndexedDataset, ShardError
from mindfoundry.data.ingest.listing import DataSourceError, resolve_files


def test_a_fifo_given_as_a_source_is_named_as_one(tmp_path: Path) -> None:
    fifo = tmp_path / "stream.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(
        DataSourceError, match=r"input path '.*stream\.jsonl' is a named pipe \(FIFO\), not a file or folder"
    ):
        resolve_files([str(fifo)])


def test_a_shard_replaced_by_a_folder_is_named_as_a_folder(tiny_prepared) -> None:
    cfg, _ = tiny_prepared
    data_dir = Path(cfg.data.output_dir)
    prefix = sorted((data_dir / "train").glob("*.bin"))[0].with_suffix("")
    prefix.with_suffix(".bin").unlink()
    prefix.with_suffix(".bin").mkdir()
    with pytest.raises(ShardError, match=r"\.bin.*is a folder, not a file"):
        IndexedDataset(prefix)
    shutil.rmtree(prefix.with_suffix(".bin"))
    with pytest.raises(ShardError, match=r"file is missing"):
        IndexedDataset(prefix)


def test_an_unknown_key_of_a_megabyte_is_quoted_short() -> None:
    key = "k" * 1_000_000
    with pytest.raises(ConfigError) as info:
        validate({"data": {"sources": [{"name": "c", "paths": ["x"]}]}, "train": {key: 1}})
    message = str(info.value)
    assert len(message) < 1000 and "(1,000,006 characters)" in message  # 'train.' + the key


def test_data_validate_names_a_shard_that_is_a_folder(tiny_prepared, capsys) -> None:
    from mindfoundry.cli.main import main

    cfg, _ = tiny_prepared
    shard = sorted((Path(cfg.data.output_dir) / "train").glob("*.bin"))[0]
    shard.unlink()
    shard.mkdir()
    config = Path(cfg.data.output_dir).parents[1] / "run.yaml"
    assert main(["data", "validate", str(config)]) == 2
    err = capsys.readouterr().err
    assert "is a folder, not a file" in err and "missing" not in err and "Traceback" not in err, err
