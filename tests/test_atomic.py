"""One way to publish a file or a folder (mindfoundry.atomic): whole or not at all, durable, and no writer that
renames into place by hand (issue #35, item 2)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mindfoundry import atomic

SRC = Path(__file__).resolve().parents[1] / "src" / "mindfoundry"
#: Renames that move something aside rather than publish what was written (run --overwrite, a prepared folder
#: replaced, a checkpoint step replaced or deleted), and a shard's two files renamed in order.
MOVES_ASIDE = {
    ("train/rundir.py", "run_dir.rename(aside)"),
    ("storage/local_path.py", "os.replace(self.path, target)"),  # a committed folder moved aside, or renamed
}


def test_a_file_is_replaced_whole_and_nothing_is_left_aside(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("old")
    atomic.write_text(path, "新的内容\n")
    assert path.read_bytes() == "新的内容\n".encode() and sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_a_failed_write_keeps_what_the_file_held(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("old")
    (tmp_path / ("state.json" + atomic.PARTIAL)).mkdir()  # the aside name is taken: the write fails before the rename
    with pytest.raises(OSError):
        atomic.write_text(path, "new")
    assert path.read_text() == "old"


def test_a_folder_is_published_by_one_rename_and_never_over_a_folder_with_entries(tmp_path: Path) -> None:
    tmp, final = tmp_path / ".out.tmp", tmp_path / "out"
    (tmp / "sub").mkdir(parents=True)
    (tmp / "sub" / "a.bin").write_bytes(b"\x00\x01")
    atomic.publish_folder(tmp, final)
    assert (final / "sub" / "a.bin").read_bytes() == b"\x00\x01" and not tmp.exists()
    (tmp / "x").mkdir(parents=True)
    with pytest.raises(OSError):
        atomic.publish_folder(tmp, final)
    assert (final / "sub" / "a.bin").is_file()


def test_no_writer_renames_into_place_by_hand() -> None:
    found = set()
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        if rel == "atomic.py":
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            if re.search(r"os\.replace\(|os\.rename\(|\.rename\(", line):
                found.add((rel, next((call for r, call in MOVES_ASIDE if r == rel and call in line), line.strip())))
    assert found == MOVES_ASIDE, found - MOVES_ASIDE
