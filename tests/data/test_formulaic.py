"""The part, not the document: long formulaic prose that breaks Gopher's n-gram limits stays whole, spam pasted into
it goes line by line, paragraphs said again with a word changed go, repetition through and through is still dropped;
a short text under a banner of symbols stays (tests/fixtures/formulaic: chapters of the King James Bible and a GNOME
help page; bench/curation_quality.py measures the same on 600k characters of the Bible, docs/benchmarks.md)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from mindfoundry.data.clean.formulaic import spread_repetition
from mindfoundry.data.clean.garbled import SymbolRunFilter, SymbolRunRemover
from mindfoundry.data.clean.repetition import RepetitionFilter, without_repeats
from mindfoundry.data.document import Document

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "formulaic" / "kjv.jsonl"
CHAPTERS = {row["name"]: row["text"] for row in map(json.loads, FIXTURE.read_text("utf-8").splitlines())}
PHRASES = ["cheap watches", "buy watches online", "best watches price", "top watches deals"]
#: Search spam as bench/curation_quality.py makes it: a few phrases in every line, no two lines the same.
STATUS_ICONS = (FIXTURE.parent / "gnome-status-icons.txt").read_text("utf-8")
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


def test_a_help_page_of_parallel_sections_stays_whole() -> None:
    """Sections for wireless, cellular, wired... networking repeat "Connected to a ... network" and "Learn more
    about ...": a topic's word is in a few of the page's 60 lines, not in one. With own words counted only when in
    one line, 0.47 of its units were in varied lines and the page was dropped; now 0.67."""
    block = RepetitionFilter()
    assert block.judge(STATUS_ICONS).reason == "duplicate_5gram_words"
    assert block.transform(doc(STATUS_ICONS)).text == without_repeats(STATUS_ICONS)[0]
    assert block.stats.edits == {"repeated_line": 2}  # the second copies of "Learn more about airplane mode."


def test_a_catalogue_listing_one_message_many_times_keeps_its_other_lines() -> None:
    """The rest is 0.44 of the characters, under ``min_rest_share``, but 0.90 of it is lines said once: its other
    lines stand. Lines said over and over leave nothing said once, and go."""
    messages = ["Select the colors of the user interface elements.", "Opens a dialog to edit the preferences.",
                "Type the name of the proxy server for FTP.", "Deletes the color scheme shown in the scheme box.",
                "Specifies the languages used to check the spelling of complex text layouts.",
                "Could not insert the object from the file.", "Specifies that no compression takes place.",
                "Opens the expert configuration dialog for advanced settings.", "Type the port of the proxy server.",
                "Choose the attribute to use when exporting character highlighting to Microsoft Office formats.",
                "Defines the language whose first and last characters you want to set.", "Graphics metafile format"]
    repeated = "Selects the options that are treated as equal in a search."
    text = "\n".join(messages[:6] + [repeated] * 16 + messages[6:])
    block = RepetitionFilter()
    assert block.judge(text).reason == "duplicate_lines"
    assert block.transform(doc(text)).text == "\n".join(messages[:6] + [repeated] + messages[6:])
    assert block.stats.edits == {"repeated_line": 15}
    assert RepetitionFilter().transform(doc("\n".join(messages[:3] * 10))).reason == "duplicate_lines"


#: A help page that describes three commands in one sentence each, a word changed (after GIMP's "Buffer" submenu).
BUFFERS = [
    "Named buffers",
    "The commands of this submenu keep pieces of an image in buffers that you name, beside the global clipboard.",
    "You reach the submenu from the menu bar of the image window, under Edit, or from the context menu of a layer.",
    "Cut Named",
    "The Cut Named command cuts the content of the selection from the active layer in the usual way, but instead of "
    "storing it in the global clipboard, it stores it in a special buffer that you name in a pop-up dialog.",
    "Copy Named",
    "The Copy Named command copies the content of the selection from the active layer in the usual way, but instead "
    "of storing it in the global clipboard, it stores it in a special buffer that you name in a pop-up dialog.",
    "Copy Visible Named",
    "The Copy Visible Named command copies the content of the selection from all visible layers in the usual way, but "
    "instead of storing it in the global clipboard, it stores it in a special buffer that you name in a pop-up dialog.",
    "Paste Named",
    "Paste Named opens the Buffers dialog. Choose one of the listed buffers and press a button at the bottom to paste "
    "it into the current image, into a new layer or as a new image of its own.",
    "Buffers you no longer need can be deleted from the same dialog; they are not kept when the program quits.",
]


def test_paragraphs_said_again_with_a_word_changed_go_and_the_page_stays() -> None:
    """Its near-identical paragraphs are more than half the page (duplicate 5-grams 0.31): the second and third echo
    the first and go; the rest (0.64 of the characters) passes."""
    text = "\n".join(BUFFERS)
    block = RepetitionFilter()
    assert block.judge(text).reason == "duplicate_5gram_words"
    assert block.transform(doc(text)).text == "\n".join(BUFFERS[:6] + BUFFERS[7:8] + BUFFERS[9:])
    assert block.stats.edits == {"echoed_line": 2}


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
