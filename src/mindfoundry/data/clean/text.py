"""Script measurement and text units shared by the cleaning blocks and dedup.

Chinese has no spaces between words, so "words" split on whitespace make every Chinese sentence
one giant word and English-tuned heuristics (word counts, word n-grams, mean word length) stop
meaning anything. Here a *unit* is one CJK character or one run of other letters and digits
(``"GDP增长7.8%"`` -> ``GDP``, ``增``, ``长``, ``7``, ``8``); repetition statistics are computed over
units, and n-gram sizes are picked per document by its dominant script (see :func:`is_cjk_text`).
Scripts are weighed in the units a reader counts, a CJK character against a *word*: counting
Latin letters instead makes "使用 useradd 命令" look mostly English.

Counting is done with compiled regular expressions (``len(text) - len(pattern.sub("", text))``),
which runs in C and is several times faster than a Python loop over characters. Consecutive
blocks (and dedup) ask the same questions about the same document, so :func:`script_counts` and
:func:`units` remember their last few answers.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

# Han ideographs (with extension A, compatibility ideographs and the supplementary planes),
# kana, bopomofo and Hangul syllables: the letters of Chinese, Japanese and Korean text.
CJK_RANGES = (
    "\u2e80-\u2fdf\u3040-\u30ff\u3100-\u312f\u31a0-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
    "\uac00-\ud7af\uf900-\ufaff\U00020000-\U0003134f"
)
_CJK = re.compile(f"[{CJK_RANGES}]")
#: A letter of any script (a CJK character is one; digits and underscores are not).
LETTER = re.compile(r"[^\W\d_]")
_UNIT = re.compile(f"[{CJK_RANGES}]|[^\\W_{CJK_RANGES}]+")
#: A non-CJK unit that holds at least one letter: a word ("GDP", "x86"; not "1998").
WORD = re.compile(f"[^\\W_{CJK_RANGES}]*[^\\W\\d_{CJK_RANGES}][^\\W_{CJK_RANGES}]*")
#: Latin letters, ASCII through Latin Extended-B without the signs × and ÷ (a character class's body): one home for
#: what "Latin script" means to the language rule, the comparison groups and the word counts.
LATIN_RANGES = "A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f"
LATIN_LETTER = re.compile(f"[{LATIN_RANGES}]")
_LATIN_WORD = re.compile(f"[{LATIN_RANGES}]+")
_SPACE_RUN = re.compile(r"\s+")


def count(pattern: re.Pattern[str], text: str) -> int:
    """How many characters of ``text`` match a one-character ``pattern``."""
    return len(text) - len(pattern.sub("", text))


def non_space_chars(text: str) -> int:
    """Characters that are not whitespace (the denominator of every character ratio)."""
    return len("".join(text.split()))


@dataclass(frozen=True)
class ScriptCounts:
    """A text's letters and reader units by script. Ratios are shares of the reader units (a CJK character
    or a word of any other script; 0.0 when there are none)."""

    letters: int
    cjk: int
    words: int
    latin_words: int

    @property
    def reader_units(self) -> int:
        return self.cjk + self.words

    @property
    def cjk_ratio(self) -> float:
        return self.cjk / self.reader_units if self.reader_units else 0.0

    @property
    def latin_ratio(self) -> float:
        return self.latin_words / self.reader_units if self.reader_units else 0.0


@lru_cache(maxsize=8)
def script_counts(text: str) -> ScriptCounts:
    """Count letters, CJK characters, words and Latin-script words (digits and punctuation are not letters)."""
    return ScriptCounts(letters=count(LETTER, text), cjk=count(_CJK, text), words=len(WORD.findall(text)),
                        latin_words=len(_LATIN_WORD.findall(text)))


def other_script_units(text: str) -> int:
    """Reader units not written in Latin letters (CJK characters, words of Cyrillic, Greek, Arabic...); text in
    ASCII has none, told without counting (most documents of most corpora: code, English)."""
    if text.isascii():
        return 0
    counts = script_counts(text)
    return counts.reader_units - counts.latin_words


def is_cjk_text(text: str) -> bool:
    """Whether CJK characters make at least half of the reader units (so Chinese with English terms is Chinese).

    Decides per document whether repetition n-grams are made of characters (Chinese) or of words
    (English, code), and whether the English word-length rule applies.
    """
    counts = script_counts(text)
    return counts.cjk > 0 and counts.cjk >= counts.words


@lru_cache(maxsize=8)
def units(text: str) -> tuple[str, ...]:
    """CJK characters and runs of other letters/digits, lower-cased, in order."""
    return tuple(_UNIT.findall(text.lower()))


def canonical(text: str) -> str:
    """Identity of a line or document for "same text" checks: whitespace runs collapsed to one
    space, trimmed, case-folded (so re-indented or re-cased copies still count as the same)."""
    return _SPACE_RUN.sub(" ", text).strip().casefold()


def remove_matches(pattern: re.Pattern[str], text: str,
                   keep_line: Callable[[str], bool] | None = None) -> tuple[str, int]:
    """Delete every match of ``pattern`` line by line; return the new text and the match count.

    A line that had content and holds only whitespace after the deletion is removed as a whole,
    so deleting a ``=====`` rule or a date line leaves no blank gap behind. Lines for which
    ``keep_line`` is true are left as they are. Patterns must not span lines (use ``[ \\t]``
    rather than ``\\s``).
    """
    if pattern.search(text) is None:
        return text, 0
    kept, total = [], 0
    for line in text.split("\n"):
        if keep_line is not None and keep_line(line):
            kept.append(line)
            continue
        new, hits = pattern.subn("", line)
        total += hits
        if not hits:
            kept.append(line)
        elif new.strip():
            kept.append(new.rstrip())
    return "\n".join(kept), total
