"""Garbled text: mojibake and decorative symbol runs.

Mojibake is text decoded with the wrong codec. Its signatures are specific enough to count:

- U+FFFD, what a decoder puts where bytes were invalid;
- UTF-8 read as Latin-1/cp1252: a lead byte shown as ``Ã``/``â``/``ä``... followed by
  continuation bytes shown as ``©``/``€``/``™``... (``café`` -> ``cafÃ©``, ``’`` -> ``â€™``,
  ``中文`` -> ``ä¸­æ–‡``);
- Chinese mojibake: ``锟斤拷`` (two U+FFFD encoded in UTF-8, read as GBK) and runs of ``烫``/``屯``
  (uninitialized stack/heap memory 0xCC/0xCD printed as GBK);
- private-use characters (font-specific glyphs from PDF extraction);
- UTF-8 read as GBK: runs of CJK characters whose GBK bytes are valid UTF-8 (``中文`` -> ``涓枃``, Russian
  ``привет`` -> common hanzi), recognised by reading them back;
- a high share of characters no text is written with (control bytes, unassigned code points).

Letters of every script are text: Cyrillic, Greek, Arabic, Hebrew, Devanagari, Thai, Hangul are never counted as
garble.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from mindfoundry.config.clean import MojibakeConfig, SymbolRunsConfig
from mindfoundry.data.clean.block import Drop, Filter, Transform, Verdict
from mindfoundry.data.clean.text import LETTER, count, non_space_chars, remove_matches
from mindfoundry.data.document import Document

_REPLACEMENT = re.compile("\ufffd")
# cp1252's renderings of the bytes 0x80-0x9F, plus Latin-1's 0xA0-0xBF: UTF-8 continuation bytes.
_CONTINUATION = (
    "\u0080-\u00bf\u0152\u0153\u0160\u0161\u0178\u017d\u017e\u0192\u02c6\u02dc\u2013\u2014"
    "\u2018-\u201a\u201c-\u201e\u2020-\u2022\u2026\u2030\u2039\u203a\u20ac\u2122"
)
_LATIN1_MOJIBAKE = re.compile(f"[\u00c2-\u00f4][{_CONTINUATION}]+")
_CJK_MOJIBAKE = re.compile("(?:锟斤拷)+|烫{3,}|屯{3,}")
_PRIVATE_USE = re.compile("[\ue000-\uf8ff\U000f0000-\U0010ffff]")


@functools.lru_cache(maxsize=1)
def _misread_runs() -> re.Pattern[str]:
    """Runs of three or more of the GBK characters whose two bytes are a UTF-8 lead byte of a two-byte script
    (0xC2-0xDF: Latin-1 letters, Greek, Cyrillic, Hebrew, Arabic) and a continuation byte (0x80-0xBF), between ASCII
    characters: what a misread of such UTF-8 text as GBK is made of, word by word (a set of 1,900 characters,
    matched in one pass)."""
    chars = []
    for lead in range(0xC2, 0xE0):
        for trail in range(0x80, 0xC0):
            try:
                chars.append(bytes((lead, trail)).decode("gbk"))
            except UnicodeDecodeError:
                continue
    # a whole run between ASCII characters (a misread word); inside a longer run of CJK it is real Chinese
    return re.compile("(?<![^\\x00-\\x7f])[" + "".join(chars) + "]{3,}(?![^\\x00-\\x7f])")
#: What no text is written with: control bytes other than whitespace (C0, and C1 as Latin-1 shows UTF-8's
#: continuation bytes), surrogates, private use, non-characters and the unassigned planes 4-13. Letters, marks, digits,
#: punctuation and symbols of every script are usual (Cyrillic, Arabic, Devanagari... are text, not garble).
_UNUSUAL = re.compile(
    "[\x00-\x08\x0e-\x1f\x7f-\x9f\ud800-\uf8ff\ufdd0-\ufdef\ufffe\uffff\U00040000-\U000dffff"
    "\U000f0000-\U0010ffff]"
)
#: What UTF-8 read as GBK reads back to: a word of one two-byte script (Cyrillic, modern Greek, Arabic with its
#: marks, Hebrew with its points). Real Chinese whose GBK bytes happen to be valid UTF-8 reads back to a mix of rare
#: letters and symbols (为什么 -> Ϊʲô, 系统 -> ϵͳ, 目前没 -> Ŀǰû); the scripts of three-byte UTF-8 (CJK, Indic)
#: misread as GBK leave rare hanzi and U+FFFD, which the other checks count.
_ONE_SCRIPT = re.compile("[\u0401-\u045f]+|[\u0386-\u03ce]+|[\u0620-\u065f\u066e-\u06d3]+|[\u05b0-\u05ea]+")
# Every other mojibake signature involves one of these; most documents contain none.
_SUSPECTS = (_REPLACEMENT, _UNUSUAL, _LATIN1_MOJIBAKE, _CJK_MOJIBAKE)


#: Letters (a CJK character is one) that the text outside symbol runs needs for its document to be kept.
MIN_TEXT_LETTERS = 10


class MojibakeFilter(Filter):
    """Drop documents whose share of mojibake characters exceeds a limit (``None`` disables a check).

    Each ratio is over non-whitespace characters. Reasons: ``replacement_chars``, ``cjk_mojibake``,
    ``latin1_as_utf8``, ``private_use``, ``unusual_chars`` (checked in that order).
    """

    name = "mojibake"
    section = MojibakeConfig

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        s = self.settings
        self.checks = (
            ("replacement_chars", s.max_replacement_ratio, lambda t: count(_REPLACEMENT, t)),
            ("cjk_mojibake", s.max_cjk_mojibake_ratio, lambda t: _matched_chars(_CJK_MOJIBAKE, t)),
            ("latin1_as_utf8", s.max_latin1_mojibake_ratio, lambda t: _matched_chars(_LATIN1_MOJIBAKE, t)),
            ("utf8_as_gbk", s.max_gbk_mojibake_ratio, _read_back_as_utf8),
            ("private_use", s.max_private_use_ratio, lambda t: count(_PRIVATE_USE, t)),
            ("unusual_chars", s.max_unusual_ratio, _unusual_chars),
        )

    def filter(self, doc: Document) -> Verdict:
        if not any(pattern.search(doc.text) for pattern in _SUSPECTS) and _misread_runs().search(doc.text) is None:
            return True  # the common case: nothing to measure
        total = max(non_space_chars(doc.text), 1)
        for reason, limit, measure in self.checks:
            if limit is not None and (ratio := measure(doc.text) / total) > limit:
                return Drop(reason, ratio, limit)
        return True


def _matched_chars(pattern: re.Pattern[str], text: str) -> int:
    return sum(len(m) for m in pattern.findall(text))


def _unusual_chars(text: str) -> int:
    return count(_UNUSUAL, text)


def _read_back_as_utf8(text: str) -> int:
    """Characters in runs (:func:`_misread_runs`) whose GBK bytes are UTF-8 for a word of one script
    (:data:`_ONE_SCRIPT`): what a misread of UTF-8 as GBK shows. Real Chinese almost never reads back (a GBK lead byte
    of 0xB0-0xBF or 0xF8 and up cannot start UTF-8, a run must be valid as a whole, and what it gives is a mix)."""
    found = 0
    for run in _misread_runs().findall(text):
        try:
            back = run.encode("gbk").decode("utf-8")
        except UnicodeError:
            continue
        found += len(run) * (_ONE_SCRIPT.fullmatch(back) is not None)
    return found


# Not a letter, digit or space; "_" counts (fill-in "______" lines); box-drawing characters do not (tables).
_SYMBOL = r"(?:[^\w\s\u2500-\u257f]|_)"
# A rule line of an ASCII table ("+------+------+", "|=====|") or of a box-drawn one: kept whole.
_TABLE_RULE = re.compile(r"^[ \t]*[+|\u2500-\u257f][-=+|:. \t\u2500-\u257f]*[+|\u2500-\u257f][ \t]*$")


_HEADING = re.compile(r"^[ \t]*\S.{0,98}(?<![.。!！?？,，;；:：])[ \t]*$")  # short, not ending a sentence or clause
_UNDERLINE = re.compile(r"^[ \t]*([=\-~^*#+_`'\".:])\1{2,}[ \t]*$")


def _kept_whole(text: str) -> Callable[[str], bool]:
    """Which lines of ``text`` symbol-run removal leaves whole: table rules, and heading underlines (reST, Markdown
    setext: a run of one symbol as long as the short line above it, give or take two, that line not ending a
    sentence), which are structure."""
    lines = text.split("\n")
    underlines = {line for above, line in zip(lines, lines[1:]) if _UNDERLINE.match(line) and _HEADING.match(above)
                  and abs(len(line.strip()) - len(above.strip())) <= 2}
    return lambda line: is_table_rule(line) or line in underlines


def is_table_rule(line: str) -> bool:
    """Whether a line is a table border or separator (its dashes are structure, not decoration)."""
    return _TABLE_RULE.match(line) is not None


def symbol_run_pattern(min_run: int) -> re.Pattern[str]:
    """Runs of one symbol (``=====``, ``!!!!!!!``, ``★★★★★``) or of a repeated symbol pair
    (``-=-=-=``, ``!?!?!?``), at least ``min_run`` characters long.

    Only repetition counts, so dense punctuation such as ``"]});`` or ``……`` is not a run.
    """
    if min_run < 2:
        raise ValueError(f"min_run must be at least 2, got {min_run}")
    pairs = (min_run + 1) // 2
    return re.compile(rf"({_SYMBOL})\1{{{min_run - 1},}}|({_SYMBOL}{_SYMBOL})\2{{{pairs - 1},}}")


class SymbolRunFilter(Filter):
    """Drop documents in which symbol runs cover more than ``max_fraction`` of the non-space characters.

    Box-drawing characters are never symbols here, and table rule lines (``+----+----+``) are skipped:
    a table's borders are its structure.

    A document is dropped only when what the runs leave is not text (fewer than :data:`MIN_TEXT_LETTERS` letters): a
    short poem or quote with a banner of stars above it is a document with a banner, which the remover deletes.

    Reason: ``symbol_runs``. Runs in the documents kept are deleted by :class:`SymbolRunRemover`.
    """

    name = "symbol_run_filter"
    section = SymbolRunsConfig

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self.runs = symbol_run_pattern(self.settings.min_run)
        self.max_fraction = self.settings.max_fraction

    def filter(self, doc: Document) -> Verdict:
        if self.max_fraction is None:
            return True
        lines = [line for line in doc.text.split("\n") if not is_table_rule(line)]
        in_runs = sum(len(match.group()) for line in lines for match in self.runs.finditer(line))
        fraction = in_runs / max(non_space_chars(doc.text), 1)
        if fraction <= self.max_fraction:
            return True
        rest = "".join(self.runs.sub("", line) for line in lines)
        if count(LETTER, rest) >= MIN_TEXT_LETTERS:
            return True  # a poem under a line of stars: the runs go (SymbolRunRemover), the text stays
        return Drop("symbol_runs", fraction, self.max_fraction)


class SymbolRunRemover(Transform):
    """Delete symbol runs (a line left blank goes too), except in table rule lines. Edit: ``symbol_run`` (runs deleted).
    """

    name = "symbol_runs"
    section = SymbolRunsConfig

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self.runs = symbol_run_pattern(self.settings.min_run)

    def transform(self, doc: Document) -> Document:
        text, hits = remove_matches(self.runs, doc.text, keep_line=_kept_whole(doc.text))
        self.count("symbol_run", hits)
        return replace(doc, text=text) if hits else doc
