"""Document-level quality filters: length, script mix and Gopher quality (Gopher repetition: :mod:`.repetition`).

The Gopher rules (Rae et al. 2021, as implemented in datatrove) were tuned on English web pages
measured in space-separated words; applied as they are, they remove most Chinese (one "word"
per sentence) and most code. Here they are measured in *units* (a CJK character, or a run of
other letters/digits, see :mod:`~mindfoundry.data.clean.text`), n-grams are character n-grams
for Chinese-dominant documents (CJK characters at least as many as words) and word n-grams
otherwise, only the prose lines are judged (code, markup and table lines repeat by syntax), and
the defaults were checked on real text (People's Daily, product reviews, Shakespeare, man pages,
the Python reference manual) so that they remove spam, not prose.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache
from typing import Any

from mindfoundry.config.clean import LengthConfig, QualityConfig, ScriptConfig
from mindfoundry.data.clean.block import Drop, Filter, Transform, Verdict
from mindfoundry.data.clean.garbled import is_table_rule
from mindfoundry.data.clean.text import LATIN_RANGES, WORD, count, is_cjk_text, non_space_chars, script_counts, units
from mindfoundry.data.document import Document

_ELLIPSIS = re.compile(r"\.{3,}|…+")
_BULLET = ("•", "●", "○", "◦", "▪", "▫", "■", "□", "◆", "◇", "-", "*", "–", "·")
# Lines whose repetition is syntax, not spam: interpreter and shell prompts, and lines dense in symbols
# (code, markup, tables). Repetition rules measure the other lines.
_PROMPT = re.compile(r"^\s*(?:>>>|\.\.\.|\$|#|//|/\*|--)(?:\s|$)")
_CODE_SYMBOL = re.compile(r"[{}()\[\]<>=;|\\/*&^%$@~_`+\u2500-\u257f]")
_PROMPT_LINE = re.compile(_PROMPT.pattern, re.MULTILINE)
CODE_SYMBOL_SHARE = 0.08
#: The mean word length judges texts of this many words or more: "I am what I am." is a sentence, not noise.
WORD_LENGTH_MIN_WORDS = 20
#: A line ending in an ellipsis counts as a truncated snippet from this many units on: a menu item or heading
#: ("Create Template…", "要访问此命令...") ends in one by design.
TRUNCATED_MIN_UNITS = 8


class LengthFilter(Filter):
    """Keep documents whose stripped length in characters is within bounds.

    Reasons: ``too_short``, ``too_long``.
    """

    name = "length"
    section = LengthConfig

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self.min_chars, self.max_chars = self.settings.min_chars, self.settings.max_chars

    def filter(self, doc: Document) -> Verdict:
        size = len(doc.text.strip())
        if self.min_chars is not None and size < self.min_chars:
            return Drop("too_short", size, self.min_chars)
        if self.max_chars is not None and size > self.max_chars:
            return Drop("too_long", size, self.max_chars)
        return True


class ScriptFilter(Filter):
    """Keep documents whose share of CJK / Latin letters (among all letters) is within bounds.

    Use it per source to keep a Chinese source Chinese (``min_cjk_ratio``) or an English one
    English (``max_cjk_ratio``). Reasons: ``no_letters`` (a bound is set but the document has
    no letter), ``cjk_ratio_below_min``, ``cjk_ratio_above_max``, ``latin_ratio_below_min``,
    ``latin_ratio_above_max``.
    """

    name = "script"
    section = ScriptConfig

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        s = self.settings
        self.bounds = (("cjk", s.min_cjk_ratio, s.max_cjk_ratio), ("latin", s.min_latin_ratio, s.max_latin_ratio))
        self.active = any(v is not None for _, low, high in self.bounds for v in (low, high))

    def filter(self, doc: Document) -> Verdict:
        if not self.active:
            return True
        counts = script_counts(doc.text)
        if counts.letters == 0:
            return Drop("no_letters")
        ratios = {"cjk": counts.cjk_ratio, "latin": counts.latin_ratio}
        for script, low, high in self.bounds:
            if low is not None and ratios[script] < low:
                return Drop(f"{script}_ratio_below_min", ratios[script], low)
            if high is not None and ratios[script] > high:
                return Drop(f"{script}_ratio_above_max", ratios[script], high)
        return True


def is_syntax_line(line: str) -> bool:
    """Whether a line is code, markup or a table rule rather than prose: a prompt or comment leader
    (``>>>``, ``$``, ``#``, ``//``...), a table rule (``+-----+``) or at least :data:`CODE_SYMBOL_SHARE` of its
    characters in code symbols (brackets, ``=``, ``;``, ``_``, ``|``, box drawing...). Full-width Chinese
    punctuation is not a code symbol."""
    stripped = line.strip()
    if not stripped:
        return False
    if _PROMPT.match(stripped) or is_table_rule(stripped):
        return True
    return count(_CODE_SYMBOL, stripped) >= CODE_SYMBOL_SHARE * non_space_chars(stripped)


@lru_cache(maxsize=8)
def prose_part(text: str) -> str:
    """``text`` without its syntax lines (what repetition and quality are measured on); remembered for the
    next block, which asks about the same document."""
    if _CODE_SYMBOL.search(text) is None and _PROMPT_LINE.search(text) is None:
        return text  # the common case: no line can be a syntax line (table rules hold '+', '|' or box drawing)
    lines = text.split("\n")
    kept = [line for line in lines if not is_syntax_line(line)]
    return text if len(kept) == len(lines) else "\n".join(kept)


_LATIN_WORD = re.compile(f"[0-9{LATIN_RANGES}]+")


def _alpha_units(text: str) -> int:
    """Units that hold a letter: words and CJK characters (not numbers)."""
    return len(WORD.findall(text)) + script_counts(text).cjk


def _is_bullet(line: str) -> bool:
    """A line that starts with a bullet (after its indent)."""
    return line.strip().startswith(_BULLET)


def _is_truncated(line: str) -> bool:
    """A line cut off with an ellipsis (long enough that the ellipsis is not a short line's style)."""
    stripped = line.strip()
    return stripped.endswith(("...", "…")) and len(units(stripped)) >= TRUNCATED_MIN_UNITS


class QualityFilter(Transform):
    """Gopher quality rules, measured in units so they apply to Chinese too, on the prose lines
    (:func:`prose_part`; a document that is all code or tables passes).

    Ratio rules need evidence. The symbol ratio needs ``symbol_ratio_min_units`` units and the
    line-share rules (bullets, trailing ellipses) ``line_ratio_min_lines`` lines: they target
    link lists and truncated snippets, not a one-line review that ends in "……". Mean word length
    applies to Latin-script documents only, over their words (a CJK unit is one character by
    construction, and would make a mixed "早上Check out" look like gibberish).

    The part, not the document: a document that breaks a rule measured over its lines (too few alphabetic units,
    bullets, ellipses) loses the lines that break it (a table of figures, a truncated line, a list); when the rest
    passes every rule and holds at least ``min_rest_share`` of the characters it is kept so (edit ``quality_line``),
    else it is dropped for the rule it broke. Reasons: ``no_words``, ``too_few_alpha_units``, ``symbol_ratio``,
    ``mean_word_length_too_short``, ``mean_word_length_too_long``, ``bullet_lines``, ``ellipsis_lines``.
    """

    name = "quality"
    section = QualityConfig

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        s = self.settings
        self.min_alpha_unit_ratio = s.min_alpha_unit_ratio
        self.word_length = (s.min_mean_word_length, s.max_mean_word_length)
        self.max_symbol_ratio = s.max_symbol_ratio
        self.symbol_ratio_min_units = s.symbol_ratio_min_units
        self.line_limits = (s.max_bullet_line_ratio, s.max_ellipsis_line_ratio)
        self.line_ratio_min_lines = s.line_ratio_min_lines
        self.min_rest_share = s.min_rest_share
        self.offending: dict[str, Callable[[str], bool]] = {
            "too_few_alpha_units": self._few_alpha_units,
            "bullet_lines": _is_bullet,
            "ellipsis_lines": _is_truncated,
        }

    def transform(self, doc: Document) -> Document | Drop:
        verdict = self.judge(doc.text)
        if verdict is True or verdict.reason not in self.offending:
            return verdict if verdict is not True else doc
        breaks = self.offending[verdict.reason]
        lines = doc.text.split("\n")
        kept = [line for line in lines if is_syntax_line(line) or not breaks(line)]
        rest = "\n".join(kept)
        if len(kept) == len(lines) or len(rest) < self.min_rest_share * len(doc.text) or self.judge(rest) is not True:
            return verdict
        self.count("quality_line", len(lines) - len(kept))
        return replace(doc, text=rest)

    def _few_alpha_units(self, line: str) -> bool:
        """Whether a line's units are fewer alphabetic than the rule asks (a row of figures, a list of numbers)."""
        tokens = units(line)
        return bool(tokens) and _alpha_units(line) / len(tokens) < (self.min_alpha_unit_ratio or 0.0)

    def judge(self, text: str) -> Verdict:
        """The first rule ``text`` breaks, or True."""
        if not units(text):
            return Drop("no_words")
        text = prose_part(text)  # a code block's identifiers and '#' comments say nothing about the prose
        tokens = units(text)
        if not tokens:
            return True  # all code, markup or tables: nothing here for prose rules to judge
        if (self.min_alpha_unit_ratio is not None
                and (ratio := _alpha_units(text) / len(tokens)) < self.min_alpha_unit_ratio):
            return Drop("too_few_alpha_units", ratio, self.min_alpha_unit_ratio)
        verdict = self._word_length_verdict(text, WORD.findall(text))
        if verdict is not True:
            return verdict
        if self.max_symbol_ratio is not None and len(tokens) >= self.symbol_ratio_min_units:
            symbols = text.count("#") + len(_ELLIPSIS.findall(text))
            if (ratio := symbols / len(tokens)) > self.max_symbol_ratio:
                return Drop("symbol_ratio", ratio, self.max_symbol_ratio)
        return self._line_verdict(text)

    def _word_length_verdict(self, text: str, words: list[str]) -> Verdict:
        low, high = self.word_length
        counts = script_counts(text)
        if (low is None and high is None) or is_cjk_text(text) or 2 * counts.latin_words < counts.reader_units:
            return True  # Chinese, or another script's words
        words = [word for word in words if _LATIN_WORD.fullmatch(word)]  # a Tamil line's words split at vowel signs
        if len(words) < WORD_LENGTH_MIN_WORDS:
            return True
        mean = sum(len(w) for w in words) / len(words)
        if low is not None and mean < low:
            return Drop("mean_word_length_too_short", mean, low)
        if high is not None and mean > high:
            return Drop("mean_word_length_too_long", mean, high)
        return True

    def _line_verdict(self, text: str) -> Verdict:
        lines = [line.strip() for line in text.split("\n") if line.strip()]
        if len(lines) < self.line_ratio_min_lines:
            return True
        max_bullets, max_ellipses = self.line_limits
        if (
            max_bullets is not None
            and (share := sum(map(_is_bullet, lines)) / len(lines)) > max_bullets
        ):
            return Drop("bullet_lines", share, max_bullets)
        truncated = sum(map(_is_truncated, lines))
        if max_ellipses is not None and (share := truncated / len(lines)) > max_ellipses:
            return Drop("ellipsis_lines", share, max_ellipses)
        return True
