"""Document-level quality filters: length, script mix, Gopher repetition and Gopher quality.

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
from dataclasses import replace
from functools import lru_cache
from typing import Any

import numpy as np

from mindfoundry.config.clean import LengthConfig, QualityConfig, RepetitionConfig, ScriptConfig
from mindfoundry.data.clean.block import Drop, Filter, Transform, Verdict
from mindfoundry.data.clean.formulaic import spread_repetition
from mindfoundry.data.clean.garbled import is_table_rule
from mindfoundry.data.clean.text import WORD, count, is_cjk_text, non_space_chars, script_counts, units
from mindfoundry.data.document import Document

_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
_PARAGRAPH_SPLIT = re.compile(r"(\n[ \t]*\n)")  # keeps the breaks, so joining the parts gives the text back
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
#: In a text shorter than ``ngram_min_units`` a duplicate n-gram rule drops it only when more than this share of its
#: characters repeats: a quote or a stanza repeats a phrase by design ("That, that is, is."), spam repeats itself.
SHORT_TEXT_REPEAT_SHARE = 0.5


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


def without_repeats(text: str) -> tuple[str, int, int]:
    """``text`` without the second and later copies of its paragraphs and of its prose lines (compared stripped;
    code, markup and table lines repeat by syntax and stay), with how many lines and paragraphs went."""
    seen_paragraphs: set[str] = set()
    kept_paragraphs: list[str] = []
    paragraphs = 0
    parts = _PARAGRAPH_SPLIT.split(text)  # paragraph, break, paragraph, ...
    for i in range(0, len(parts), 2):
        key = parts[i].strip()
        if key and key in seen_paragraphs:
            paragraphs += 1
            continue  # with the break before it, which the next paragraph's own break replaces
        seen_paragraphs.add(key)
        kept_paragraphs += ([parts[i - 1]] if kept_paragraphs else []) + [parts[i]]
    seen_lines: set[str] = set()
    kept_lines, lines = [], 0
    for line in "".join(kept_paragraphs).split("\n"):
        key = line.strip()
        if key and key in seen_lines and not is_syntax_line(key):
            lines += 1
            continue
        seen_lines.add(key)
        kept_lines.append(line)
    return "\n".join(kept_lines), lines, paragraphs


def _windowed_fractions(parts: list[str], window: int | None) -> tuple[float, float]:
    """:func:`_duplicate_fractions` over consecutive windows of about ``window`` characters of ``parts`` (None: all
    at once), averaged by the windows' characters (a short last window joins the one before)."""
    if window is None or sum(map(len, parts)) <= window:
        return _duplicate_fractions(parts)
    groups: list[list[str]] = [[]]
    size = 0
    for part in parts:
        if size >= window:
            groups.append([])
            size = 0
        groups[-1].append(part)
        size += len(part)
    if len(groups) > 1 and size < window // 2:
        last = groups.pop()
        groups[-1] += last
    weights = [sum(map(len, group)) for group in groups]
    fractions = [_duplicate_fractions(group) for group in groups]
    total = sum(weights) or 1
    return (sum(w * f for w, (f, _) in zip(weights, fractions, strict=True)) / total,
            sum(w * c for w, (_, c) in zip(weights, fractions, strict=True)) / total)


def _duplicate_fractions(parts: list[str]) -> tuple[float, float]:
    """Share of parts that repeat an earlier part, and share of characters in those repeats."""
    seen: set[str] = set()
    repeats = repeated_chars = 0
    for part in parts:
        if part in seen:
            repeats += 1
            repeated_chars += len(part)
        seen.add(part)
    total_chars = sum(len(p) for p in parts)
    return repeats / max(len(parts), 1), repeated_chars / max(total_chars, 1)


class _UnitSequence:
    """A document's units as integer ids and character lengths, for vectorized n-gram statistics.

    The n-gram keys are 64-bit polynomial hashes (collisions are negligible at document scale),
    extended one unit at a time (``key[n+1] = key[n] * B + id``), so checking n = 2..10 costs
    one vector operation per n rather than one per n-gram.
    """

    _BASE = np.uint64(1_000_003)

    def __init__(self, tokens: tuple[str, ...]) -> None:
        vocab: dict[str, int] = {}
        self.ids = np.array([vocab.setdefault(t, len(vocab) + 1) for t in tokens], dtype=np.uint64)
        self.lengths = np.array([len(t) for t in tokens], dtype=np.int64)
        self.chars = int(self.lengths.sum())
        self._n, self._keys = 1, self.ids

    def keys(self, n: int) -> np.ndarray:
        """The key of every n-gram window, in order (call with non-decreasing n)."""
        if n < self._n:
            raise ValueError(f"n-gram sizes must be requested in increasing order ({n} after {self._n})")
        while self._n < n:
            self._keys = self._keys[:-1] * self._BASE + self.ids[self._n:]
            self._n += 1
        return self._keys

    def top_coverage(self, n: int) -> float:
        """Characters of the most frequent n-gram times its count, over all characters.

        Only an n-gram that occurs at least twice counts: in a short document every n-gram
        occurs once and would otherwise "cover" a large share.
        """
        if len(self.ids) < n:
            return 0.0
        _, first, counts = np.unique(self.keys(n), return_index=True, return_counts=True)
        best = int(np.argmax(counts))
        if counts[best] < 2:
            return 0.0
        start = int(first[best])
        return int(self.lengths[start:start + n].sum()) * int(counts[best]) / self.chars

    def duplicate_coverage(self, n: int) -> float:
        """Share of characters inside repeated occurrences of n-grams (each character once)."""
        if len(self.ids) < n:
            return 0.0
        keys = self.keys(n)
        repeat = np.ones(len(keys), dtype=bool)
        repeat[np.unique(keys, return_index=True)[1]] = False
        starts = np.flatnonzero(repeat)
        if starts.size == 0:
            return 0.0
        size = len(self.ids) + 1
        depth = np.bincount(starts, minlength=size) - np.bincount(starts + n, minlength=size)
        covered = np.cumsum(depth[:-1]) > 0
        return int(self.lengths[covered].sum()) / self.chars


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


class RepetitionFilter(Transform):
    """Gopher repetition rules over lines, paragraphs and n-grams of units, measured on the prose lines; a document
    that fails them loses its repeats, and only a document that is repetition through and through is dropped.

    Code, markup and table lines (:func:`is_syntax_line`) are left out: there the repetition is the
    syntax (``self.assertEqual(``, ``+------+``). N-gram limits map a size in words to the largest
    share of characters allowed; ``None`` or ``{}`` disables them. For a Chinese-dominant document
    every size is multiplied by ``cjk_chars_per_word`` and measured in characters: Chinese news and
    law repeat long names ("县级以上地方各级人民政府" is one), which word-sized character n-grams
    would flag. N-gram shares are measured in windows of ``window_units`` units (times the same
    factor) and averaged by characters: Gopher's limits were set on web pages of about that length,
    and over a whole book any phrase repeats, so without windows a long clean chapter or API page
    fails. The top n-gram rule needs ``top_ngram_min_units`` units (times the same factor for
    Chinese): in a short text one phrase said twice already covers a large share; below
    ``ngram_min_units`` (a quote, a stanza: rhetoric repeats) the duplicate n-gram rules drop a document only
    when more than :data:`SHORT_TEXT_REPEAT_SHARE` of it repeats.

    A document that breaks a rule loses the second and later copies of its repeated prose lines and
    paragraphs (a page whose header was extracted three times, a chapter pasted twice); when what is left passes
    every rule and keeps at least ``min_rest_share`` of the characters, it is kept so (edits ``repeated_line``,
    ``repeated_paragraph``). When what still fails is an n-gram rule, the repeated n-grams are located
    (:mod:`.formulaic`): repetition spread over varied lines holding ``min_rest_share`` of the units (a law code, a
    liturgy, a genealogy) is text, kept without the lines that repeat within themselves (edit ``repetitive_line``:
    spam pasted into it); otherwise the document is dropped for the first rule it broke. Reasons:
    ``duplicate_lines``, ``duplicate_line_chars``, ``duplicate_paragraphs``,
    ``duplicate_paragraph_chars``, ``top_{n}gram_{words|chars}``, ``duplicate_{n}gram_{words|chars}``.
    """

    name = "repetition"
    section = RepetitionConfig

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        s = self.settings
        self.line_limits = (s.max_duplicate_line_fraction, s.max_duplicate_line_char_fraction)
        self.paragraph_limits = (s.max_duplicate_paragraph_fraction, s.max_duplicate_paragraph_char_fraction)
        self.top_ngrams, self.duplicate_ngrams = dict(s.top_ngrams or {}), dict(s.duplicate_ngrams or {})
        self.top_ngram_min_units = s.top_ngram_min_units
        self.ngram_min_units = s.ngram_min_units
        self.cjk_chars_per_word = s.cjk_chars_per_word
        self.window_units = s.window_units
        self.min_rest_share = s.min_rest_share

    def transform(self, doc: Document) -> Document | Drop:
        verdict = self.judge(doc.text)
        if verdict is True:
            return doc
        rest, lines, paragraphs = without_repeats(doc.text)
        if len(rest) < self.min_rest_share * len(doc.text):
            return verdict
        rest_verdict = self.judge(rest) if lines or paragraphs else verdict
        spam = 0
        if rest_verdict is not True:
            if not rest_verdict.reason.endswith(("gram_words", "gram_chars")):
                return verdict
            spread = self._without_spam(rest)
            if spread is None:
                return verdict
            rest, spam = spread
        self.count("repeated_line", lines)
        self.count("repeated_paragraph", paragraphs)
        self.count("repetitive_line", spam)
        return doc if rest == doc.text else replace(doc, text=rest)

    def _without_spam(self, text: str) -> tuple[str, int] | None:
        """``text`` without its spam lines and how many went, when its n-gram repetition is spread over varied
        lines (:func:`~mindfoundry.data.clean.formulaic.spread_repetition`); ``None`` when it is not text."""
        all_lines = text.split("\n")
        prose = [i for i, line in enumerate(all_lines) if line.strip() and not is_syntax_line(line)]
        n = min(self.duplicate_ngrams or self.top_ngrams) * (  # an n-gram rule broke: one of them is set
            self.cjk_chars_per_word if is_cjk_text(text) else 1)
        spam = spread_repetition([all_lines[i] for i in prose], n, self.min_rest_share)
        if spam is None:
            return None
        gone = {prose[i] for i in spam}
        return "\n".join(line for i, line in enumerate(all_lines) if i not in gone), len(gone)

    def judge(self, text: str) -> Verdict:
        """The first rule ``text`` breaks, or True."""
        text = prose_part(text)
        lines = [line.strip() for line in text.split("\n") if line.strip()]
        paragraphs = [p.strip() for p in _PARAGRAPH_BREAK.split(text) if p.strip()]
        window = self._window_chars(text)
        for kind, parts, limits in (
            ("line", lines, self.line_limits),
            ("paragraph", paragraphs, self.paragraph_limits),
        ):
            fraction, char_fraction = _windowed_fractions(parts, window)
            if limits[0] is not None and fraction > limits[0]:
                return Drop(f"duplicate_{kind}s", fraction, limits[0])
            if limits[1] is not None and char_fraction > limits[1]:
                return Drop(f"duplicate_{kind}_chars", char_fraction, limits[1])
        return self._ngram_verdict(text)

    def _window_chars(self, text: str) -> int | None:
        """The line and paragraph rules' window in characters: ``window_units`` units of this script (a CJK unit is a
        character, times ``cjk_chars_per_word``; a word with its space about 6), so a 2k- and a 200k-character page
        of one kind are judged alike (a repeated sentence weighs the same in each)."""
        if not self.window_units:
            return None
        return self.window_units * (self.cjk_chars_per_word if is_cjk_text(text) else 6)

    def _windows(self, tokens: tuple[str, ...], scale: int) -> list[_UnitSequence]:
        """The units cut into windows of ``window_units * scale`` (a short last window joins the one before)."""
        size = self.window_units * scale if self.window_units else len(tokens)
        starts = list(range(0, len(tokens), max(size, 1)))
        if len(starts) > 1 and len(tokens) - starts[-1] < size // 2:
            starts.pop()
        ends = starts[1:] + [len(tokens)]
        return [_UnitSequence(tokens[a:b]) for a, b in zip(starts, ends, strict=True)]

    def _ngram_verdict(self, text: str) -> Verdict:
        tokens = units(text)
        cjk = is_cjk_text(text)
        scale, kind = (self.cjk_chars_per_word, "chars") if cjk else (1, "words")
        short = len(tokens) < self.ngram_min_units * scale
        checks = [(n * scale, max(limit, SHORT_TEXT_REPEAT_SHARE) if short else limit, "duplicate")
                  for n, limit in self.duplicate_ngrams.items()]
        if len(tokens) >= self.top_ngram_min_units * scale:
            checks += [(n * scale, limit, "top") for n, limit in self.top_ngrams.items()]
        if not checks or not tokens:
            return True
        windows = self._windows(tokens, scale)
        chars = sum(w.chars for w in windows)
        for n, limit, rule in sorted(checks):
            share = (
                sum((w.top_coverage(n) if rule == "top" else w.duplicate_coverage(n)) * w.chars for w in windows)
                / chars
            )
            if share > limit:
                return Drop(f"{rule}_{n}gram_{kind}", share, limit)
            if share == 0.0:
                return True  # no n-gram repeats, so no longer one does: the remaining checks would pass
        return True


class QualityFilter(Filter):
    """Gopher quality rules, measured in units so they apply to Chinese too, on the prose lines
    (:func:`prose_part`; a document that is all code or tables passes).

    Ratio rules need evidence. The symbol ratio needs ``symbol_ratio_min_units`` units and the
    line-share rules (bullets, trailing ellipses) ``line_ratio_min_lines`` lines: they target
    link lists and truncated snippets, not a one-line review that ends in "……". Mean word length
    applies to Latin-script documents only, over their words (a CJK unit is one character by
    construction, and would make a mixed "早上Check out" look like gibberish).
    Reasons: ``no_words``, ``too_few_alpha_units``, ``mean_word_length_too_short``,
    ``mean_word_length_too_long``, ``symbol_ratio``, ``bullet_lines``, ``ellipsis_lines``.
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

    def filter(self, doc: Document) -> Verdict:
        if not units(doc.text):
            return Drop("no_words")
        text = prose_part(doc.text)  # a code block's identifiers and '#' comments say nothing about the prose
        tokens = units(text)
        if not tokens:
            return True  # all code, markup or tables: nothing here for prose rules to judge
        words = WORD.findall(text)
        alpha_units = len(words) + script_counts(text).cjk
        if self.min_alpha_unit_ratio is not None and (ratio := alpha_units / len(tokens)) < self.min_alpha_unit_ratio:
            return Drop("too_few_alpha_units", ratio, self.min_alpha_unit_ratio)
        verdict = self._word_length_verdict(text, words)
        if verdict is not True:
            return verdict
        if self.max_symbol_ratio is not None and len(tokens) >= self.symbol_ratio_min_units:
            symbols = text.count("#") + len(_ELLIPSIS.findall(text))
            if (ratio := symbols / len(tokens)) > self.max_symbol_ratio:
                return Drop("symbol_ratio", ratio, self.max_symbol_ratio)
        return self._line_verdict(text)

    def _word_length_verdict(self, text: str, words: list[str]) -> Verdict:
        low, high = self.word_length
        if (low is None and high is None) or len(words) < WORD_LENGTH_MIN_WORDS or is_cjk_text(text):
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
            and (share := sum(line.startswith(_BULLET) for line in lines) / len(lines)) > max_bullets
        ):
            return Drop("bullet_lines", share, max_bullets)
        truncated = sum(line.endswith(("...", "…")) and len(units(line)) >= TRUNCATED_MIN_UNITS for line in lines)
        if max_ellipses is not None and (share := truncated / len(lines)) > max_ellipses:
            return Drop("ellipsis_lines", share, max_ellipses)
        return True
