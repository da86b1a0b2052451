"""The part, not the document: long formulaic prose that breaks Gopher's n-gram limits stays whole, spam pasted into
it goes line by line, repetition through and through is still dropped; a short text under a banner of symbols stays
(tests/fixtures/formulaic: chapters of the King James Bible; bench/curation_quality.py measures the same on 600k
characters of it, docs/benchmarks.md)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from mindfoundry.data.clean.formulaic import spread_repetition
from mindfoundry.data.clean.garbled import SymbolRunFilter, SymbolRunRemover
from mindfoundry.data.clean.quality import RepetitionFilter
from mindfoundry.data.document import Document

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "formulaic" / "kjv.jsonl"
CHAPTERS = {row["name"]: row["text"] for row in map(json.loads, FIXTURE.read_text("utf-8").splitlines())}
PHRASES = ["cheap watches", "buy watches online", "best watches price", "top watches deals"]
#: Search spam as bench/curation_quality.py makes it: a few phrases in every line, no two lines the same.
STUFFING = "\n".join(" ".join(random.Random(i).choices(PHRASES, k=10)) for i in range(8))


def doc(text: str) -> Document:
    return Document(text=text, id="0", source="s", category="s")


@pytest.mark.parametrize("name, rule", [("Genesis 1", "duplicate_5gram_words"),
                                        ("Genesis 5", "duplicate_5gram_words"),
                                        ("Psalms 136", "top_3gram_words"), ("Luke 3", "top_4gram_words"),
                                        ("Numbers 1", "duplicate_5gram_words")])
def test_formulaic_chapters_break_an_ngram_rule_and_stay_whole(name: str, rule: str) -> None:
    block = RepetitionFilter()
    assert block.judge(CHAPTERS[name]).reason == rule  # Gopher's limits alone would drop the chapter
    assert block.transform(doc(CHAPTERS[name])).text == CHAPTERS[name]
    assert block.stats.edits == {}


def test_twelve_copies_of_one_list_are_still_dropped() -> None:
    """Numbers 7: only 36% of its units sit in lines with words of their own (measured 0.364)."""
    verdict = RepetitionFilter().transform(doc(CHAPTERS["Numbers 7"]))
    assert verdict.reason == "duplicate_5gram_words" and verdict.value > 0.5


def test_spam_pasted_into_formulaic_prose_goes_line_by_line() -> None:
    lines = CHAPTERS["Genesis 1"].split("\n")
    spammed = lines[:5] + ["好评" * 20] + lines[5:9] + ["cheap shoes buy now " * 4] + lines[9:]
    block = RepetitionFilter()
    assert block.transform(doc("\n".join(spammed))).text == CHAPTERS["Genesis 1"]
    assert block.stats.edits == {"repetitive_line": 2}


def test_keyword_stuffing_is_dropped_whole() -> None:
    assert spread_repetition(STUFFING.split("\n"), 5, 0.5) is None  # no line has a word of its own
    assert RepetitionFilter().transform(doc(STUFFING)).reason.endswith("gram_words")


def test_a_short_text_under_a_banner_of_symbols_stays_and_loses_the_banner() -> None:
    poem = "床前明月光，疑是地上霜。\n举头望明月，低头思故乡。"
    bannered = f"{'★' * 30}\n{poem}\n{'★' * 30}"
    assert SymbolRunFilter().filter(doc(bannered)) is True  # runs are 60 of 84 characters, the rest is a poem
    assert SymbolRunRemover().transform(doc(bannered)).text.strip() == poem
    only_runs = "★★★★★★ $$$$$$$ !!!!!!!!\n====== 好 ######"
    assert SymbolRunFilter().filter(doc(only_runs)).reason == "symbol_runs"  # one letter left: not text
