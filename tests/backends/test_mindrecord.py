"""MindRecord export: MindDataset reads back exactly the documents of the .bin/.idx shards."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

import mindspore.dataset as ds  # noqa: E402

from mindfoundry.backends.mindspore.mindrecord import export_mindrecord, mindrecord_files  # noqa: E402
from mindfoundry.cli.main import main  # noqa: E402


def read_rows(files: list[Path], num_shards: int) -> list[dict]:
    """Every row of the files, read as `num_shards` data-parallel readers would, one after the other."""
    rows = []
    for shard_id in range(num_shards):
        reader = ds.MindDataset([str(f) for f in files], num_shards=num_shards, shard_id=shard_id, shuffle=False)
        rows += list(reader.create_dict_iterator(output_numpy=True, num_epochs=1))
    return rows


def test_minddataset_reads_back_the_shards_exactly(tiny_prepared, tmp_path: Path) -> None:
    _, data = tiny_prepared
    out = export_mindrecord(data.root, tmp_path / "mr", shards=3)
    for split in ("train", "validation"):
        files = mindrecord_files(out, split)
        assert [f.name for f in files] == [f"{split}.mindrecord{i}" for i in range(3)]
        rows = read_rows(files, num_shards=2)
        got = {(str(r["source"]), int(r["doc_index"])): r for r in rows}
        expected = {(Path(s.path_prefix).name, i): s[i] for s in data.shards[split] for i in range(len(s))}
        assert got.keys() == expected.keys()
        # Each reader gets ceil(N / num_shards) rows: MindDataset repeats a row to even out an odd count.
        assert len(rows) == 2 * -(-len(expected) // 2)
        for key, tokens in expected.items():
            assert got[key]["tokens"].dtype == np.int32
            np.testing.assert_array_equal(got[key]["tokens"], tokens)
            assert str(got[key]["category"]) == key[0] and str(got[key]["split"]) == split


def test_export_refuses_an_existing_folder_and_leaves_no_temporary(tiny_prepared, tmp_path: Path) -> None:
    _, data = tiny_prepared
    out = tmp_path / "mr"
    export_mindrecord(data.root, out)
    assert [f.name for f in mindrecord_files(out, "train")] == ["train.mindrecord"]
    with pytest.raises(FileExistsError, match="already exists: choose another output folder"):
        export_mindrecord(data.root, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mr", "run", "run.yaml"]


def test_mindrecord_command(tiny_prepared, tmp_path: Path, capsys) -> None:
    out = tmp_path / "cli-mr"
    config = str(tmp_path / "run.yaml")
    assert main(["data", "mindrecord", config, "--out", str(out), "--shards", "2"]) == 0
    assert len(mindrecord_files(out, "train")) == 2
    assert main(["data", "mindrecord", config, "--out", str(out)]) == 2
    assert f"error: '{out}' already exists" in capsys.readouterr().err
